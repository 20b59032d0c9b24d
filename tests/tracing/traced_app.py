"""The app of the tracing tests: a durable job that starts a three-step workflow, a plain
durable job, and what each saw as its current span (to prove the context is *current*
inside user code, not only stored).

Imported by a worker in another process, it exports that process's finished spans as
JSON lines to ``$FOUNDRY_TEST_SPANS`` (a global ``TracerProvider``: auto mode finds it).
"""

from __future__ import annotations

import os
from typing import Any

from opentelemetry import trace

from foundry import Foundry

SEEN: dict[str, int] = {}  # what the work saw as its current span: name -> span id


def _current(name: str) -> int:
    span_id = trace.get_current_span().get_span_context().span_id
    SEEN[name] = span_id
    return span_id


def reserve(order_id: str) -> str:
    _current("reserve")
    return f"reserved {order_id}"


def charge(order_id: str) -> str:
    _current("charge")
    return f"charged {order_id}"


def ship(order_id: str) -> str:
    _current("ship")
    return f"shipped {order_id}"


def make_app(tracing: Any = None, **urls: Any) -> Foundry:
    app = Foundry("traced", tracing=tracing, **urls)

    @app.workflow()
    def fulfil(wf: Any, order_id: str) -> list[str]:
        return [wf.step(reserve, order_id), wf.step(charge, order_id), wf.step(ship, order_id)]

    @app.work(durable=True)
    def place_order(order_id: str) -> str:
        _current("place_order")
        return str(fulfil.start(order_id).id)  # the workflow starts inside the job's span

    @app.work(durable=True)
    def echo(text: str) -> str:
        return f"{text} {_current('echo'):016x}"

    return app


def _export_to_file(path: str) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the life of the worker process
    provider = TracerProvider()
    exporter = ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


if os.environ.get("FOUNDRY_TEST_SPANS"):
    _export_to_file(os.environ["FOUNDRY_TEST_SPANS"])
app = make_app()
