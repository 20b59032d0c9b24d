"""Workflow-level and per-step timeouts, enforced from the journal: the deadline and a
timed step's timer are rows in the store, so a run that dies does not take them along.
Time is the manual clock; a run's death is a BaseException escaping the step."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import pytest

from foundry.backends.journal.base import WorkflowStatus
from foundry.deliver.workflow import WorkflowContext
from foundry.errors import WorkflowTimeoutError, WorkTimeoutError
from foundry.handle import Status
from tests.workflows.conftest import Crash, Env

MakeEnv = Callable[..., Env]


def test_a_workflow_parked_past_its_deadline_times_out_and_compensates(make_env: MakeEnv) -> None:
    env = make_env(inline_wait=0.0)
    done: list[str] = []

    def act(name: str) -> str:
        done.append(name)
        return name

    def undo(result: str) -> None:
        done.append(f"undo {result}")

    @env.app.workflow(timeout="1h")
    def flow(wf: WorkflowContext) -> str:
        wf.step(act, "compute", undo=undo)
        wf.sleep("1d")  # would sleep past the deadline
        wf.step(act, "never")
        return "done"

    start = env.clock.time()
    handle = flow.enqueue(id="slow")
    worker = env.worker()
    worker.drain()
    # The run parked itself until its deadline, not until the end of its sleep
    state = env.journal.get("slow")
    assert state is not None
    assert state.status == WorkflowStatus.WAITING
    assert state.deadline == pytest.approx(start + 3600)
    assert state.wake_at == pytest.approx(start + 3600)
    env.clock.advance(3600)
    assert worker.drain() == 1
    with pytest.raises(WorkflowTimeoutError, match=r"timeout=3600s") as info:
        handle.result(5)
    assert isinstance(info.value, TimeoutError)
    assert handle.status == Status.FAILED
    state, entries = env.journal.load("slow")
    assert state.status == WorkflowStatus.TIMED_OUT
    assert state.compensation == "done"
    assert done == ["compute", "undo compute"]
    assert [(e.kind, e.status) for e in entries] == [
        ("step", "ok"),
        ("timeout", "ok"),  # found at the sleep's position, recorded so a replay stops there too
        ("undo", "ok"),
    ]


def test_a_run_stuck_in_a_step_leaves_it_at_the_deadline(make_env: MakeEnv) -> None:
    env = make_env(lease=3600.0)
    gate = threading.Event()
    entered = threading.Event()
    done: list[str] = []

    def act(name: str) -> str:
        done.append(name)
        return name

    def hangs() -> None:
        entered.set()
        gate.wait(30)  # a synchronous step that never comes back in time

    @env.app.workflow(timeout="10m")
    def flow(wf: WorkflowContext) -> None:
        wf.step(act, "a", undo=lambda r: done.append(f"undo {r}"))
        wf.step(hangs)

    try:
        handle = flow.start(id="stuck")
        assert entered.wait(10)
        env.clock.advance(601)  # journal time passes the deadline while the step hangs
        with pytest.raises(WorkflowTimeoutError):
            handle.result(10)
        assert done == ["a", "undo a"]
        assert env.journal.get("stuck").status == WorkflowStatus.TIMED_OUT  # type: ignore[union-attr]
    finally:
        gate.set()


def test_a_workflow_that_returns_after_its_deadline_times_out(make_env: MakeEnv) -> None:
    env = make_env()

    @env.app.workflow(timeout="1m")
    def flow(wf: WorkflowContext) -> int:
        value = int(wf.step(lambda: 1, name="quick"))
        env.clock.advance(120)  # the code after its last step took past the deadline
        return value

    with pytest.raises(WorkflowTimeoutError):
        flow.run(id="late")
    _, entries = env.journal.load("late")
    assert [e.kind for e in entries] == ["step", "timeout"]


def test_a_step_timer_survives_the_run_that_started_it(make_env: MakeEnv) -> None:
    env = make_env()
    calls: Counter[str] = Counter()

    def slow() -> str:
        calls["slow"] += 1
        if calls["slow"] == 1:
            raise Crash("the worker died inside the step")
        return "fast enough"

    @env.app.workflow()
    def flow(wf: WorkflowContext, retries: int) -> str:
        return str(wf.step(slow, timeout="30s", retries=retries, backoff=0))

    # Given a run that dies 5 s into a step whose timeout is 30 s
    with pytest.raises(Crash):
        flow.run(0, id="died")
    [entry] = env.journal.load("died")[1]
    assert (entry.status, entry.detail, entry.wake_at) == ("waiting", "running", env.clock.time() + 30)
    # When the next run resumes after the timer ran out (its lease lapsed later)
    env.clock.advance(31)
    env.worker().drain()
    # Then the attempt counts as timed out — not started again on a fresh 30 s
    with pytest.raises(WorkTimeoutError, match="still running at its timeout"):
        flow.handle("died").result(5)
    assert calls["slow"] == 1
    # With a retry left, the next attempt runs
    calls.clear()
    with pytest.raises(Crash):
        flow.run(1, id="retried")
    env.clock.advance(31)
    env.worker().drain()
    assert flow.handle("retried").result(5) == "fast enough"
    [entry] = env.journal.load("retried")[1]
    assert entry.attempts == 2


def test_a_step_resumed_before_its_timer_ran_out_gets_only_what_was_left(make_env: MakeEnv) -> None:
    env = make_env(lease=10.0)
    runs: list[float] = []

    def step() -> str:
        runs.append(env.clock.time())
        if len(runs) == 1:
            raise Crash("died")
        return "ok"

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> str:
        return str(wf.step(step, timeout="30s"))

    with pytest.raises(Crash):
        flow.run(id="again")
    started = runs[0]
    env.expire_leases()  # 11 s later another worker takes it over, the timer still running
    env.worker().drain()
    assert flow.handle("again").result(5) == "ok"
    [entry] = env.journal.load("again")[1]
    assert entry.attempts == 1  # the same attempt, run again against the same timer
    assert runs[1] - started < 30
