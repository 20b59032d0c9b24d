"""Every step attempt of a traced workflow is a child of the run's span and is current
where the step's code runs — however it runs: in the run's thread, on a timeout's daemon
thread, in each branch of a fan-out, in an ``async def`` workflow on the executor or on
its loop — and a step that fails and is retried is one span per attempt."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from opentelemetry import trace

from foundry import Foundry
from tests.tracing.conftest import Spans, parent_of

SEEN: dict[str, int] = {}
_TRIES: dict[str, int] = {}
_LOCK = threading.Lock()


def seen(name: str) -> str:
    with _LOCK:
        SEEN[name] = trace.get_current_span().get_span_context().span_id
    return name


def flaky(name: str) -> str:
    with _LOCK:
        _TRIES[name] = _TRIES.get(name, 0) + 1
        if _TRIES[name] == 1:
            raise ConnectionError("the first attempt fails")
    return seen(name)


async def aseen(name: str) -> str:
    return seen(name)


def _steps(spans: Spans, run: str) -> tuple[Any, dict[str, Any]]:
    runs = [s for s in spans.all() if s.name == run]
    assert len(runs) == 1, [s.name for s in spans.all()]
    steps = {
        dict(s.attributes or {})["foundry.workflow.position"]: s
        for s in spans.all()
        if s.name.startswith("step ")
    }
    return runs[0], steps


def test_each_step_attempt_is_a_child_of_the_run_and_current_in_its_code(
    spans: Spans, tmp_path: Path
) -> None:
    app = Foundry("steps", home=tmp_path, journal=f"sqlite:///{tmp_path / 'j.db'}", tracing=spans.provider)

    @app.workflow()
    def fanout(wf: Any) -> list[str]:
        first = wf.step(seen, "inline")
        timed = wf.step(seen, "timed", timeout="30s")  # on a daemon thread
        branches = wf.map(seen, ["b1", "b2", "b3"], concurrency=3)  # branches as tasks of their own
        retried = wf.step(flaky, "retried", retries=1, backoff=0.01)
        return [first, timed, *branches, retried]

    try:
        assert fanout.start().result(timeout=30) == ["inline", "timed", "b1", "b2", "b3", "retried"]
        spans.wait_for("run fanout")
    finally:
        app.close()
    run, steps = _steps(spans, "run fanout")
    attempts = [s for s in spans.all() if s.name == "step flaky"]
    assert len(attempts) == 2  # one span per attempt: the failed one, then the retry
    assert [dict(s.attributes or {})["foundry.workflow.attempt"] for s in attempts] == [1, 2]
    assert attempts[0].status.is_ok is False
    assert attempts[1].status.is_ok
    for span in [*steps.values(), *attempts]:
        assert parent_of(span) == run.context.span_id, span.name
        assert span.context.trace_id == run.context.trace_id
    by_name = {n: [s.context.span_id for s in spans.all() if s.name.startswith("step ")] for n in SEEN}
    for name, span_id in SEEN.items():
        assert span_id in by_name[name], f"{name} ran outside its step's span"
    assert len({SEEN[n] for n in ("inline", "timed", "b1", "b2", "b3", "retried")}) == 6


def test_an_async_workflows_steps_are_children_of_its_run(spans: Spans, tmp_path: Path) -> None:
    app = Foundry("asteps", home=tmp_path, journal=f"sqlite:///{tmp_path / 'j.db'}", tracing=spans.provider)

    @app.workflow()
    async def flow(wf: Any) -> list[str]:
        on_loop = await wf.step(aseen, "on-loop")
        on_executor = await wf.step(seen, "on-executor")  # a def step of an async workflow: a thread
        return [on_loop, on_executor]

    try:
        assert flow.start().result(timeout=30) == ["on-loop", "on-executor"]
        spans.wait_for("run flow")
    finally:
        app.close()
    run, steps = _steps(spans, "run flow")
    assert sorted(steps) == [0, 1]
    assert all(parent_of(s) == run.context.span_id for s in steps.values())
    assert SEEN["on-loop"] == steps[0].context.span_id
    assert SEEN["on-executor"] == steps[1].context.span_id
