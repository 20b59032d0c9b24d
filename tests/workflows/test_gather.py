"""Fan-out and fan-in inside a workflow (wf.gather / wf.map), on every journal engine:
each branch journaled, only unfinished branches run after a crash, the first failure
stops the others and the completed ones are compensated in reverse order."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from foundry.backends.journal.base import WorkflowStatus
from foundry.deliver.workflow import AsyncWorkflowContext, WorkflowContext
from foundry.errors import CancelledError, NonDeterminismError, SubmitError
from tests.workflows.conftest import Crash, Env

MakeEnv = Callable[..., Env]


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_a_gather_returns_the_results_in_order_and_journals_each_branch(make_env: MakeEnv) -> None:
    env = make_env()
    running = Counter[str]()
    peak = [0]
    lock = threading.Lock()
    both = threading.Barrier(2, timeout=10)

    def fetch(what: str) -> str:
        with lock:
            running["now"] += 1
            peak[0] = max(peak[0], running["now"])
        both.wait()  # the two branches are in flight at the same time
        with lock:
            running["now"] -= 1
        return what.upper()

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> list[Any]:
        first = wf.step(lambda: "x", name="before")
        pair = wf.gather(wf.branch(fetch, "a"), wf.branch(fetch, "b", name="fetch-b"))
        after = wf.step(lambda: "y", name="after")
        return [first, *pair, after]

    assert flow.run(id="fan") == ["x", "A", "B", "y"]
    assert peak[0] == 2
    _, entries = env.journal.load("fan")
    assert [(e.position, e.kind, e.name.rsplit(".", 1)[-1], e.status, e.ref, e.detail) for e in entries] == [
        (0, "step", "before", "ok", None, None),
        (1, "gather", "gather", "ok", None, "2"),
        (2, "step", "fetch", "ok", 1, None),
        (3, "step", "fetch-b", "ok", 1, None),
        (4, "step", "after", "ok", None, None),
    ]


def test_map_runs_at_most_concurrency_branches_at_once(make_env: MakeEnv) -> None:
    env = make_env()
    lock = threading.Lock()
    state = {"now": 0, "peak": 0}

    def square(n: int) -> int:
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        threading.Event().wait(0.01)
        with lock:
            state["now"] -= 1
        return n * n

    @env.app.workflow()
    def flow(wf: WorkflowContext, n: int) -> list[int]:
        return list(wf.map(square, range(n), concurrency=3))

    assert flow.run(12, id="m") == [i * i for i in range(12)]
    assert state["peak"] <= 3
    _, entries = env.journal.load("m")
    assert entries[0].kind == "gather"
    assert entries[0].name == "map test_map_runs_at_most_concurrency_branches_at_once.<locals>.square"


def test_after_a_crash_only_the_unfinished_branches_run(make_env: MakeEnv) -> None:
    env = make_env()
    calls: Counter[int] = Counter()

    def work(n: int) -> int:
        calls[n] += 1
        if n == 3 and calls[n] == 1:
            raise Crash("the worker died while branch 3 ran")
        return n * 10

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> list[int]:
        return list(wf.map(work, [1, 2, 3, 4], concurrency=1))

    # Given a run that dies inside the third branch
    with pytest.raises(Crash):
        flow.run(id="crash")
    assert calls == {1: 1, 2: 1, 3: 1}
    # When another worker resumes it
    env.expire_leases()
    env.worker().drain()
    # Then branches 1 and 2 were replayed, not run again; 3 ran again, 4 ran once
    assert flow.handle("crash").result(5) == [10, 20, 30, 40]
    assert calls == {1: 1, 2: 1, 3: 2, 4: 1}


def test_a_failing_branch_stops_the_others_and_the_completed_ones_are_undone_in_reverse(
    make_env: MakeEnv,
) -> None:
    env = make_env()
    events: list[str] = []
    lock = threading.Lock()
    finished = {"a": threading.Event(), "b": threading.Event()}
    cancelled = threading.Event()

    def note(text: str) -> None:
        with lock:
            events.append(text)

    def recorded(result: str) -> bool:
        return any(e.result == f'"{result}"'.encode() for e in env.journal.load("saga")[1])

    def quick(name: str) -> str:
        note(f"did {name}")
        if name == "a":  # a completes after b's completion is recorded
            assert finished["b"].wait(10)
            wait_until(lambda: recorded("b"))
            env.clock.advance(1)
        if name in finished:
            finished[name].set()
        return name

    def undo(result: str) -> None:
        note(f"undo {result}")

    def broken(name: str) -> str:
        assert finished["a"].wait(10)  # after a and b completed
        raise RuntimeError("card declined")

    async def waits_forever(name: str) -> str:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return name

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> list[Any]:
        wf.step(quick, "setup", undo=undo)
        return wf.gather(
            wf.branch(quick, "a", undo=undo),
            wf.branch(quick, "b", undo=undo),
            wf.branch(broken, "c"),
            wf.branch(waits_forever, "d", undo=undo),
        )

    with pytest.raises(RuntimeError, match="card declined"):
        flow.run(id="saga")
    assert cancelled.is_set()  # the async branch was cancelled
    # Compensation: the gather's completed branches in reverse order of completion (b, then
    # a), then the step before it
    assert events[-3:] == ["undo a", "undo b", "undo setup"]
    state, entries = env.journal.load("saga")
    assert state.status == WorkflowStatus.FAILED
    assert state.compensation == "done"
    header = entries[1]
    assert (header.kind, header.status, header.ref) == ("gather", "error", 4)  # branch c failed
    assert {e.position for e in entries if e.ref == 1} == {2, 3, 4}  # d left no record


def test_a_branch_not_started_when_another_failed_never_runs(make_env: MakeEnv) -> None:
    env = make_env()
    ran: list[str] = []
    cancelled = threading.Event()

    def fails(name: str) -> None:
        raise RuntimeError(f"{name} failed")

    async def waits(name: str) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> None:
        wf.gather(
            wf.branch(waits, "a"), wf.branch(fails, "b"), wf.branch(ran.append, "c", name="c"), concurrency=2
        )

    with pytest.raises(RuntimeError, match="b failed"):
        flow.run(id="never")
    assert cancelled.is_set()
    assert ran == []  # its turn came after the failure: it never started
    _, entries = env.journal.load("never")
    assert [(e.position, e.kind, e.status) for e in entries] == [(0, "gather", "error"), (2, "step", "error")]


def test_a_resumed_gather_that_had_failed_runs_nothing_new(make_env: MakeEnv) -> None:
    env = make_env()
    calls: Counter[str] = Counter()
    undone: list[str] = []

    def ok(name: str) -> str:
        calls[name] += 1
        return name

    def bad(name: str) -> str:
        calls[name] += 1
        raise ValueError("no")

    def undo(result: str) -> None:
        undone.append(result)
        if len(undone) == 1:
            raise Crash("died while compensating")

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> list[Any]:
        return wf.gather(
            wf.branch(ok, "a", undo=undo), wf.branch(bad, "b"), wf.branch(ok, "c"), concurrency=1
        )

    with pytest.raises(Crash):
        flow.run(id="resume")
    env.expire_leases()
    env.worker().drain()
    with pytest.raises(ValueError, match="no"):
        flow.handle("resume").result(5)
    assert calls == {"a": 1, "b": 1}  # c never ran, before or after the crash
    assert undone == ["a", "a"]  # the interrupted undo ran again (at-least-once)


def test_cancelling_the_workflow_stops_the_fan_out(make_env: MakeEnv) -> None:
    env = make_env()
    entered = threading.Event()

    async def slow(name: str) -> str:
        entered.set()
        await asyncio.sleep(60)
        return name

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> list[Any]:
        return wf.gather(wf.branch(slow, "a"), wf.branch(slow, "b"))

    handle = flow.start(id="cx")
    assert entered.wait(10)
    assert handle.cancel()
    with pytest.raises(CancelledError):
        handle.result(10)
    assert env.journal.get("cx").status == WorkflowStatus.CANCELLED  # type: ignore[union-attr]


def test_a_gather_whose_branches_changed_is_non_deterministic(make_env: MakeEnv) -> None:
    env = make_env(inline_wait=0.0)
    version = {"branches": 2}

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> None:
        wf.gather(*(wf.branch(lambda: 1, name=f"b{i}") for i in range(version["branches"])))
        wf.sleep("1h")

    handle = flow.enqueue(id="nd")
    env.worker().drain()
    version["branches"] = 3
    env.clock.advance(3600)
    env.worker().drain()
    with pytest.raises(NonDeterminismError, match="now has 3 branches"):
        handle.result(5)


def test_a_branch_with_a_long_back_off_parks_the_workflow(make_env: MakeEnv) -> None:
    env = make_env(inline_wait=0.0)
    calls: Counter[str] = Counter()

    def flaky(name: str) -> str:
        calls[name] += 1
        if name == "b" and calls[name] == 1:
            raise ConnectionError("503")
        return name

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> list[Any]:
        return wf.map(flaky, ["a", "b"], retries=1, backoff="10m")

    handle = flow.enqueue(id="park")
    worker = env.worker()
    worker.drain()
    state = env.journal.get("park")
    assert state is not None
    assert state.status == WorkflowStatus.WAITING
    assert (
        state.current_step
        == "gather map test_a_branch_with_a_long_back_off_parks_the_workflow.<locals>.flaky"
    )
    env.clock.advance(600)
    worker.drain()
    assert handle.result(5) == ["a", "b"]
    assert calls == {"a": 1, "b": 2}


def test_bad_gathers_are_refused(make_env: MakeEnv) -> None:
    env = make_env()

    @env.app.workflow()
    def empty(wf: WorkflowContext) -> None:
        wf.gather()

    @env.app.workflow()
    def not_a_branch(wf: WorkflowContext) -> None:
        wf.gather(lambda: 1)  # type: ignore[arg-type]

    @env.app.workflow()
    def zero(wf: WorkflowContext) -> None:
        wf.gather(wf.branch(lambda: 1, name="x"), concurrency=0)

    with pytest.raises(SubmitError, match="no branches"):
        empty.run()
    with pytest.raises(SubmitError, match="not a branch"):
        not_a_branch.run()
    with pytest.raises(SubmitError, match="concurrency=0"):
        zero.run()


def test_an_async_workflow_gathers_async_and_sync_steps_on_its_loop(make_env: MakeEnv) -> None:
    env = make_env()

    async def fetch(n: int) -> int:
        await asyncio.sleep(0)
        return n + 1

    def compute(n: int) -> int:
        return n * 2

    @env.app.workflow()
    async def flow(wf: AsyncWorkflowContext, n: int) -> list[Any]:
        first = await wf.step(fetch, n)
        pair = await wf.gather(wf.branch(fetch, first), wf.branch(compute, first))
        many = await wf.map(fetch, range(3))
        return [first, pair, many]

    assert flow.run(1, id="async-fan") == [2, [3, 4], [1, 2, 3]]
