"""A stream handler runs in the trace its event was published in, on the embedded log
and on Redis; and the switch: off never imports OpenTelemetry, auto traces once a
global ``TracerProvider`` is set, on without the API is an error naming the fix."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from foundry import Foundry
from foundry.backends.stream import open_stream_backend
from foundry.deliver.stream import StreamEvent
from foundry.errors import ConfigError
from tests.services import require
from tests.streams.conftest import unique
from tests.tracing.conftest import Spans, parent_of

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("awaited", [False, True], ids=["publish_many", "apublish_many"])
@pytest.mark.parametrize("engine", ["sqlite", "redis", "nats"])
def test_a_stream_handler_runs_in_the_trace_of_the_publish(
    spans: Spans, tmp_path: Path, engine: str, awaited: bool
) -> None:
    # Given a traced app with a stream and one consumer group
    url = f"sqlite:///{tmp_path / 'stream.db'}" if engine == "sqlite" else require(engine)
    app = Foundry(unique("app"), home=tmp_path, stream=url, tracing=spans.provider)
    s = app.stream(unique("orders"), key="order")
    seen: dict[str, int] = {}

    @s.consumer(group="billing")
    def bill(event: StreamEvent) -> None:
        seen[event["order"]] = trace.get_current_span().get_span_context().span_id

    try:
        # When two events are published in one call inside a span, and the group drains them
        s.runtime.ensure_group("billing")
        with spans.provider.get_tracer("test").start_as_current_span("caller"):
            if awaited:  # on the caller's loop (NATS: through that loop's own connection)
                asyncio.run(s.apublish_many([{"order": "a"}, {"order": "b"}]))
            else:
                s.publish_many([{"order": "a"}, {"order": "b"}])
        s.drain(timeout=30)
        spans.wait_for("caller", f"send {s.name}")
        processed = [x for x in spans.all() if x.name == f"process {s.name}"]
    finally:
        app.close()
        if engine != "sqlite":
            backend = open_stream_backend(url)
            try:
                backend.delete_stream(s.name)
            finally:
                backend.close()
    # Then one send span carried both, and each handler ran in its own child of it
    send = next(x for x in spans.all() if x.name == f"send {s.name}")
    assert send.kind is SpanKind.PRODUCER
    assert dict(send.attributes or {})["messaging.batch.message_count"] == 2
    assert len(processed) == 2
    for span in processed:
        assert parent_of(span) == send.context.span_id
        assert span.context.trace_id == send.context.trace_id
        attributes = dict(span.attributes or {})
        assert attributes["messaging.consumer.group.name"] == "billing"
        assert attributes["messaging.system"] == engine
        assert attributes["messaging.destination.name"] == s.name
    assert sorted(seen.values()) == sorted(span.context.span_id for span in processed)


def _python(code: str, **env: str) -> str:
    import os

    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env={**{k: v for k, v in os.environ.items() if k != "FOUNDRY_TRACING"}, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


# A durable job submitted and run by a worker in a fresh process; prints whether
# OpenTelemetry was imported, and the app's tracing switch.
_RUN_A_JOB = """
    import sys, tempfile
    from foundry import Foundry
    from foundry.deliver.worker import Worker
    home = tempfile.mkdtemp()
    {setup}
    app = Foundry("switch", home=home, queue=f"sqlite:///{{home}}/q.db"{tracing})
    def double(x):
        return 2 * x
    unit = app.work(durable=True)(double)
    {span}
    h = unit.submit(21)
    w = Worker(app, concurrency=1, lease=5.0, poll=0.05).start()
    assert h.result(timeout=30) == 42
    w.stop(5.0)
    app.close()
    print("opentelemetry" in sys.modules, repr(app.tracing))
"""


def test_off_and_auto_without_a_provider_never_import_opentelemetry() -> None:
    for tracing in (", tracing=False", ""):
        out = _python(_RUN_A_JOB.format(setup="", tracing=tracing, span=""))
        assert out.startswith("False "), f"tracing{tracing or ' auto'}: {out}"
    assert _python(_RUN_A_JOB.format(setup="", tracing="", span=""), FOUNDRY_TRACING="off").startswith(
        "False "
    )


def test_auto_traces_once_the_application_sets_a_global_provider() -> None:
    setup = """
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    exporter = InMemorySpanExporter()
    """
    span = """
    provider = TracerProvider()  # set after Foundry(): seen at the next submit
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    """
    code = (
        _RUN_A_JOB.format(setup=setup, tracing="", span=span)
        + """
    import time
    deadline = time.monotonic() + 10
    while len(exporter.get_finished_spans()) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    print(sorted(s.name for s in exporter.get_finished_spans()))
    """
    )
    out = _python(code)
    assert out.splitlines()[-1] == str(sorted(["send double", "wait double", "process double"]))
    assert "Tracing(auto, tracing)" in out


def test_on_without_the_api_is_an_error_naming_the_fix() -> None:
    code = """
    import sys
    sys.modules["opentelemetry"] = None  # as if opentelemetry-api were not installed
    from foundry import Foundry
    from foundry.errors import ConfigError
    try:
        Foundry(tracing=True)
    except ConfigError as exc:
        print(exc)
    """
    out = _python(code)
    assert "pip install 'foundry-exec[otel]'" in out
    assert "tracing=False" in out


@pytest.mark.parametrize("value", ["sometimes", "2"])
def test_a_bad_setting_is_an_error_naming_it(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=rf"Foundry\(tracing=\.\.\.\): '{value}' is not a tracing setting"):
        Foundry(tracing=value)
    monkeypatch.setenv("FOUNDRY_TRACING", value)
    with pytest.raises(
        ConfigError, match=rf"FOUNDRY_TRACING: '{value}' is not a tracing setting.*on\|off\|auto"
    ):
        Foundry()
