"""One trace from an HTTP request through a durable queue job and the three-step workflow
the job starts (issue 16): the request's server span, the job's send, its wait in the
queue and its run, the workflow's start and run, and each step — every span in one
trace, each the child of the one before it, the unit's decision on them as attributes,
and each current inside the user code it covers. Then the same hop across Redis with
the worker in another process, and the context a job carries when the store's copy of
it is junk (a new trace, the job unharmed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from opentelemetry.trace import SpanKind
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from foundry.deliver.worker import Worker
from tests.adversarial._hostile import rewrite_job
from tests.backends.queue.engines import drop_schema, engine_url
from tests.tracing import traced_app
from tests.tracing.conftest import Spans, parent_of

ROOT = Path(__file__).resolve().parents[2]


def _http_app(app: Any, spans: Spans) -> Starlette:
    """A Starlette service whose POST /orders submits the job inside a server span, as
    OpenTelemetry's ASGI middleware would make it."""
    tracer = spans.provider.get_tracer("http")

    async def orders(request: Request) -> JSONResponse:
        body = await request.json()
        with tracer.start_as_current_span(
            "POST /orders", kind=SpanKind.SERVER, attributes={"http.request.method": "POST"}
        ):
            handle = await app.units["place_order"].asubmit(body["order"])
        return JSONResponse({"job": handle.id}, status_code=202)

    return Starlette(routes=[Route("/orders", orders, methods=["POST"])])


def test_one_trace_from_an_http_submit_through_a_job_and_a_three_step_workflow(
    spans: Spans, tmp_path: Path
) -> None:
    # Given an app on SQLite that traces on the test's provider, with a queue worker
    app = traced_app.make_app(
        spans.provider,
        home=tmp_path,
        queue=f"sqlite:///{tmp_path / 'queue.db'}",
        journal=f"sqlite:///{tmp_path / 'journal.db'}",
    )
    worker = Worker(app, concurrency=2, lease=10.0, poll=0.1).start()
    try:
        # When a request submits the job, and the job starts the workflow
        with TestClient(_http_app(app, spans)) as client:
            reply = client.post("/orders", json={"order": "o-1"})
        assert reply.status_code == 202
        workflow_id = app.job(reply.json()["job"]).result(timeout=30)
        assert app.workflow_handle(workflow_id).result(timeout=30) == [
            "reserved o-1",
            "charged o-1",
            "shipped o-1",
        ]
        names = ["POST /orders", "send place_order", "wait place_order", "process place_order"]
        names += ["start fulfil", "run fulfil", "step reserve", "step charge", "step ship"]
        got = spans.wait_for(*names)
    finally:
        worker.stop(5.0)
        app.close()
    # Then every span is in the request's trace ...
    server = got["POST /orders"]
    assert {s.context.trace_id for s in got.values()} == {server.context.trace_id}
    assert server.parent is None
    # ... each the child of the span that handed the work on
    chain = {
        "send place_order": "POST /orders",
        "wait place_order": "send place_order",
        "process place_order": "send place_order",
        "start fulfil": "process place_order",
        "run fulfil": "start fulfil",
        "step reserve": "run fulfil",
        "step charge": "run fulfil",
        "step ship": "run fulfil",
    }
    for child, parent in chain.items():
        assert parent_of(got[child]) == got[parent].context.span_id, f"{child} is not a child of {parent}"
    # ... current inside the code it covers
    assert traced_app.SEEN["place_order"] == got["process place_order"].context.span_id
    for step in ("reserve", "charge", "ship"):
        assert traced_app.SEEN[step] == got[f"step {step}"].context.span_id
    # ... of the messaging kinds, in order: the wait ends before the run starts
    assert got["send place_order"].kind is SpanKind.PRODUCER
    assert got["process place_order"].kind is SpanKind.CONSUMER
    wait, run = got["wait place_order"], got["process place_order"]
    times = [got["send place_order"].start_time, wait.start_time, wait.end_time, run.start_time]
    assert times == sorted(t or 0 for t in times)
    assert [s.name for s in got.values() if s.status.is_ok is False] == []
    # ... with the unit's decision and the messaging conventions as attributes
    decision = app.units["place_order"].decision
    process = dict(run.attributes or {})
    assert process["foundry.unit"] == "place_order"
    assert (process["foundry.delivery"], process["foundry.execution"]) == (
        decision.delivery,
        decision.execution,
    )
    assert process["foundry.decided_by"] == decision.decided_by
    assert process["messaging.system"] == "sqlite"
    assert process["messaging.destination.name"] == "default"
    assert process["messaging.operation"] == "process"
    assert process["messaging.message.id"] == reply.json()["job"]
    assert dict(got["send place_order"].attributes or {})["messaging.operation.type"] == "send"
    step = dict(got["step charge"].attributes or {})
    assert (
        step["foundry.workflow.id"],
        step["foundry.workflow.step"],
        step["foundry.workflow.position"],
    ) == (
        workflow_id,
        "charge",
        1,
    )
    assert dict(got["run fulfil"].attributes or {})["foundry.delivery"] == "workflow"


def test_a_job_whose_stored_context_is_junk_runs_in_a_new_trace(spans: Spans, tmp_path: Path) -> None:
    # Given a job submitted in a trace, whose stored context was then overwritten
    app = traced_app.make_app(spans.provider, home=tmp_path, queue=f"sqlite:///{tmp_path / 'queue.db'}")
    tracer = spans.provider.get_tracer("test")
    try:
        with tracer.start_as_current_span("caller"):
            handle = app.units["echo"].submit("hi")
        backend = app.runner_for(app.units["echo"].spec).backend  # type: ignore[attr-defined]
        rewrite_job(backend, handle.id, trace="00-" + "a" * 32 + "-" + "0" * 16 + "-01")
        # When a worker runs it
        worker = Worker(app, concurrency=1, lease=10.0, poll=0.1).start()
        try:
            assert handle.result(timeout=30).startswith("hi ")
            got = spans.wait_for("caller", "send echo", "process echo")
        finally:
            worker.stop(5.0)
    finally:
        app.close()
    # Then it ran, untraced by the junk: its run is the root of a trace of its own
    assert got["process echo"].parent is None
    assert got["process echo"].context.trace_id != got["caller"].context.trace_id
    assert "wait echo" in [s.name for s in spans.all()]


def _spans_in(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_context_crosses_redis_to_a_worker_in_another_process(spans: Spans, tmp_path: Path) -> None:
    # Given a job submitted on Redis inside a span of this process
    url = engine_url("redis", tmp_path)
    app = traced_app.make_app(spans.provider, home=tmp_path, queue=url)
    tracer = spans.provider.get_tracer("test")
    try:
        with tracer.start_as_current_span("caller"):
            handle = app.units["echo"].submit("over redis")
        got = spans.wait_for("caller", "send echo")
        # When a `foundry worker` in another process runs it (auto mode: its app sets no
        # tracing=; the module sets a global TracerProvider that writes spans to a file)
        exported = tmp_path / f"spans-{uuid.uuid4().hex[:6]}.jsonl"
        env = {
            **os.environ,
            "FOUNDRY_QUEUE": url,
            "FOUNDRY_HOME": str(tmp_path),
            "FOUNDRY_TEST_SPANS": str(exported),
        }
        env.pop("FOUNDRY_TRACING", None)
        done = subprocess.run(
            [sys.executable, "-m", "foundry.cli", "worker", "tests.tracing.traced_app:app", "--burst", "-q"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        value = handle.result(timeout=30)
    finally:
        app.close()
        drop_schema(url)
    # Then the worker's run is the child of this process's send span, in the same trace
    theirs = {s["name"]: s for s in _spans_in(exported)}
    send = got["send echo"]
    process = theirs["process echo"]
    assert process["context"]["trace_id"] == f"0x{send.context.trace_id:032x}"
    assert process["parent_id"] == f"0x{send.context.span_id:016x}"
    assert process["kind"] == "SpanKind.CONSUMER"
    assert process["attributes"]["messaging.system"] == "redis"
    assert theirs["wait echo"]["parent_id"] == f"0x{send.context.span_id:016x}"
    # ... and the job saw it as its current span
    assert value == f"over redis {int(process['context']['span_id'], 16):016x}"
