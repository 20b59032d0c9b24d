"""The workflow runtime on every journal engine: replay, non-determinism, retries,
timeouts, compensation, durable sleep, signals, queries, children, cancellation,
idempotent start, transactional steps and fencing. Time is a manual clock."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from foundry.backends.journal.base import WorkflowStatus
from foundry.deliver.workflow import WorkflowContext
from foundry.errors import (
    CancelledError,
    NonDeterminismError,
    ResultTimeoutError,
    SubmitError,
    WorkTimeoutError,
)
from foundry.handle import Status
from foundry.retry import Backoff
from tests.workflows.conftest import Crash, Env

MakeEnv = Callable[..., Env]


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_a_resumed_run_replays_completed_steps_without_running_them(make_env: MakeEnv) -> None:
    env = make_env()
    calls: Counter[str] = Counter()

    def fetch(n: int) -> tuple[int, int]:
        calls["fetch"] += 1
        return (n, n + 1)

    def store(pair: list[int]) -> int:
        calls["store"] += 1
        if calls["store"] == 1:
            raise Crash("the process died here")
        return sum(pair)

    @env.app.workflow()
    def flow(wf: WorkflowContext, n: int) -> dict[str, Any]:
        pair = wf.step(fetch, n)
        return {"pair": pair, "total": wf.step(store, pair)}

    # Given a run that dies inside its second step
    with pytest.raises(Crash):
        flow.run(1, id="job-1")
    state = env.journal.get("job-1")
    assert state is not None
    assert state.status == WorkflowStatus.RUNNING
    # When its lease lapses and a worker picks it up
    env.expire_leases()
    assert env.worker().drain() == 1
    # Then the first step was replayed from the journal, not run again
    assert calls == {"fetch": 1, "store": 2}
    # and the workflow saw the journaled value (JSON: the tuple is a list) both times
    assert flow.handle("job-1").result(5) == {"pair": [1, 2], "total": 3}
    _, entries = env.journal.load("job-1")
    assert [(e.name, e.status, e.attempts) for e in entries] == [
        ("test_a_resumed_run_replays_completed_steps_without_running_them.<locals>.fetch", "ok", 1),
        ("test_a_resumed_run_replays_completed_steps_without_running_them.<locals>.store", "ok", 1),
    ]


def test_changed_code_raises_non_determinism_naming_step_and_position(make_env: MakeEnv) -> None:
    env = make_env(inline_wait=0.0)
    version = {"v": 1}

    def a() -> int:
        return 1

    def b() -> int:
        return 2

    def c() -> int:
        return 3

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> int:
        wf.step(a)
        wf.step(b if version["v"] == 1 else c, name="b" if version["v"] == 1 else "c")
        wf.sleep("1h")
        return 0

    handle = flow.enqueue(id="nd")
    env.worker().drain()
    before = env.journal.load("nd")[1]
    # When new code that calls c() where b() was recorded resumes it
    version["v"] = 2
    env.clock.advance(3600)
    env.worker().drain()
    with pytest.raises(NonDeterminismError) as info:
        handle.result(5)
    message = str(info.value)
    assert "position 1" in message
    assert "'c'" in message
    assert "'b'" in message
    assert "Fix:" in message
    # The journal is intact: nothing was compensated or rewritten
    state, after = env.journal.load("nd")
    assert state.status == WorkflowStatus.FAILED
    assert state.compensation == ""
    assert [e.name for e in after] == [e.name for e in before]


def test_retries_back_off_in_the_journal_clock(make_env: MakeEnv) -> None:
    env = make_env()
    attempts: list[float] = []

    def flaky() -> str:
        attempts.append(env.clock.time())
        if len(attempts) < 3:
            raise ConnectionError("upstream 503")
        return "ok"

    @env.app.workflow()
    def flow(wf: WorkflowContext, jitter: bool) -> str:
        policy = 0.25 if jitter else Backoff(0.25, jitter="none")
        return str(wf.step(flaky, retries=3, backoff=policy))

    # The shared policy (foundry.retry): 0.25 s doubling, each delay jittered in its upper half
    assert flow.run(True, id="r") == "ok"
    first, second = (b - a for a, b in itertools.pairwise(attempts))
    assert 0.125 <= first <= 0.25
    assert 0.25 <= second <= 0.5
    [entry] = env.journal.load("r")[1]
    assert entry.attempts == 3
    # and without jitter, exactly the nominal delays
    attempts.clear()
    assert flow.run(False, id="exact") == "ok"
    assert [round(b - a, 3) for a, b in itertools.pairwise(attempts)] == [0.25, 0.5]


def test_retries_exhausted_fail_the_step_with_its_own_error(make_env: MakeEnv) -> None:
    env = make_env()

    def broken() -> None:
        raise KeyError("missing")

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> None:
        wf.step(broken, retries=2, backoff=0.01, retry_on=(KeyError,))

    with pytest.raises(KeyError):
        flow.run(id="x")
    [entry] = env.journal.load("x")[1]
    assert entry.status == "error"
    assert entry.attempts == 3


def test_a_long_back_off_parks_the_workflow_instead_of_a_worker(make_env: MakeEnv) -> None:
    env = make_env(inline_wait=0.0)
    calls: list[int] = []

    def flaky() -> int:
        calls.append(1)
        if len(calls) == 1:
            raise TimeoutError("slow upstream")
        return len(calls)

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> int:
        return int(wf.step(flaky, retries=1, backoff="10m"))

    handle = flow.enqueue(id="park")
    worker = env.worker()
    worker.drain()
    state = env.journal.get("park")
    assert state is not None
    assert state.status == WorkflowStatus.WAITING
    assert state.wake_at == pytest.approx(env.clock.time() + 600)
    assert worker.drain() == 0  # not due yet
    env.clock.advance(600)
    worker.drain()
    assert handle.result(5) == 2
    [entry] = env.journal.load("park")[1]
    assert entry.attempts == 2


def test_step_timeouts_count_as_failed_attempts(make_env: MakeEnv) -> None:
    env = make_env()
    release = threading.Event()

    def hangs() -> None:
        release.wait(10)

    async def hangs_async() -> None:
        await asyncio.sleep(10)

    @env.app.workflow()
    def flow(wf: WorkflowContext, which: str) -> None:
        wf.step(hangs if which == "sync" else hangs_async, timeout=0.05, retries=1, backoff=0)

    try:
        for which in ("sync", "async"):
            with pytest.raises(WorkTimeoutError, match=r"timeout=0\.05s"):
                flow.run(which)
    finally:
        release.set()


def test_compensation_undoes_completed_steps_in_reverse_order(make_env: MakeEnv) -> None:
    env = make_env()
    done: list[str] = []

    def act(name: str) -> str:
        done.append(name)
        return f"{name}-id"

    def undo(result: str) -> None:
        done.append(f"undo {result}")

    def fail(name: str) -> None:
        raise RuntimeError(f"{name} failed")

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> None:
        wf.step(act, "compute", undo=undo)
        wf.step(act, "network", undo=undo)
        wf.step(act, "notify")  # nothing to undo
        wf.step(fail, "deploy")

    with pytest.raises(RuntimeError, match="deploy failed") as info:
        flow.run(id="saga")
    assert done == ["compute", "network", "notify", "undo network-id", "undo compute-id"]
    assert any("compensation: done" in n for n in getattr(info.value, "__notes__", [])) is False
    state, entries = env.journal.load("saga")
    assert state.status == WorkflowStatus.FAILED
    assert state.compensation == "done"
    assert [(e.position, e.kind, e.status, e.ref) for e in entries] == [
        (0, "step", "ok", None),
        (1, "step", "ok", None),
        (2, "step", "ok", None),
        (3, "step", "error", None),
        (4, "undo", "ok", 1),
        (5, "undo", "ok", 0),
    ]
    # A handle from the journal (another process) sees the error and the compensation
    with pytest.raises(RuntimeError) as remote:
        env.rt.handle("saga").result(1)
    assert any("compensation: done" in n for n in remote.value.__notes__)


def test_a_crash_during_compensation_resumes_it(make_env: MakeEnv) -> None:
    env = make_env()
    undone: Counter[str] = Counter()

    def act(name: str) -> str:
        return name

    def undo(result: str) -> None:
        undone[result] += 1
        if result == "network" and undone[result] == 1:
            raise Crash("died while undoing")

    def fail() -> None:
        raise RuntimeError("deploy failed")

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> None:
        wf.step(act, "compute", undo=undo)
        wf.step(act, "network", undo=undo)
        wf.step(fail)

    with pytest.raises(Crash):
        flow.run(id="c")
    state = env.journal.get("c")
    assert state is not None
    assert state.status == WorkflowStatus.COMPENSATING
    env.expire_leases()
    env.worker().drain()
    state, entries = env.journal.load("c")
    assert state.status == WorkflowStatus.FAILED
    assert state.compensation == "done"
    # The interrupted undo ran again (at-least-once), the other exactly once, in order
    assert undone == {"network": 2, "compute": 1}
    assert [(e.kind, e.ref) for e in entries if e.kind == "undo"] == [("undo", 1), ("undo", 0)]


def test_an_undo_that_fails_for_good_leaves_partial_compensation(make_env: MakeEnv) -> None:
    env = make_env()
    undone: list[str] = []

    def act(name: str) -> str:
        return name

    def undo(result: str) -> None:
        if result == "network":
            raise OSError("API down")
        undone.append(result)

    def fail() -> None:
        raise RuntimeError("deploy failed")

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> None:
        wf.step(act, "compute", undo=undo)
        wf.step(act, "network", undo=undo, undo_retries=1, backoff=0)
        wf.step(fail)

    with pytest.raises(RuntimeError):
        flow.run(id="p")
    state, entries = env.journal.load("p")
    assert state.compensation == "partial"
    assert undone == ["compute"]
    assert [(e.ref, e.status, e.attempts) for e in entries if e.kind == "undo"] == [
        (1, "error", 2),
        (0, "ok", 1),
    ]


def test_durable_sleep_parks_and_wakes_at_its_time(make_env: MakeEnv) -> None:
    env = make_env(inline_wait=1.0)
    marks: list[float] = []

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> str:
        wf.sleep(0.5)  # short: waited inline
        marks.append(env.clock.time())
        wf.sleep("2h")  # long: parked in the journal
        return "woke"

    start = env.clock.time()
    handle = flow.enqueue(id="s")
    worker = env.worker()
    worker.drain()
    state = env.journal.get("s")
    assert state is not None
    assert state.status == WorkflowStatus.WAITING
    assert state.wake_at == pytest.approx(start + 0.5 + 7200)
    assert state.current_step == "sleep sleep"
    env.clock.advance(7199)
    assert worker.drain() == 0
    env.clock.advance(1)
    worker.drain()
    assert handle.result(5) == "woke"
    assert marks[0] == pytest.approx(start + 0.5)
    kinds = [(e.kind, e.status, e.detail) for e in env.journal.load("s")[1]]
    assert kinds == [("sleep", "ok", "0.5s"), ("sleep", "ok", "7200s")]


def test_the_local_runtime_resumes_what_it_parked(make_env: MakeEnv) -> None:
    env = make_env(inline_wait=0.0)

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> str:
        wf.sleep(30)
        return str(wf.wait_for("go"))

    handle = flow.start(id="local")
    wait_until(lambda: handle.status == Status.RUNNING and env.journal.get("local").status == "waiting")  # type: ignore[union-attr]
    env.clock.advance(30)
    wait_until(lambda: (s := env.journal.get("local")) is not None and s.current_step == "signal go")
    env.app.signal("local", "go", "now")
    assert handle.result(10) == "now"


def test_signals_are_buffered_delivered_once_and_time_out(make_env: MakeEnv) -> None:
    env = make_env(inline_wait=0.0)

    @env.app.workflow()
    def approval(wf: WorkflowContext) -> list[Any]:
        first = wf.wait_for("approve")
        second = wf.wait_for("approve", timeout="1d", default="no answer")
        return [first, second]

    handle = approval.enqueue(id="a")
    env.app.signal("a", "approve", {"by": "ann"})  # before the workflow ever ran: buffered
    worker = env.worker()
    worker.drain()
    state = env.journal.get("a")
    assert state is not None
    assert state.status == WorkflowStatus.WAITING
    assert state.current_step == "signal approve"
    env.clock.advance(86400)
    worker.drain()
    assert handle.result(5) == [{"by": "ann"}, "no answer"]
    [first, second] = env.journal.load("a")[1]
    assert first.detail is not None
    assert first.detail.startswith("signal #")
    assert second.detail == "timeout"


def test_a_signal_wakes_a_parked_workflow(make_env: MakeEnv) -> None:
    env = make_env(inline_wait=0.0)

    @env.app.workflow()
    def approval(wf: WorkflowContext) -> Any:
        return wf.wait_for("approve", timeout=60)

    handle = approval.enqueue(id="w")
    worker = env.worker()
    worker.drain()
    assert worker.drain() == 0
    env.app.signal("w", "approve", True)
    assert worker.drain() == 1
    assert handle.result(5) is True


def test_a_signal_timeout_without_default_raises(make_env: MakeEnv) -> None:
    env = make_env()

    @env.app.workflow()
    def approval(wf: WorkflowContext) -> Any:
        return wf.wait_for("approve", timeout=0.2)

    with pytest.raises(ResultTimeoutError, match="no signal 'approve'"):
        approval.run(id="t")


def test_queries_show_status_current_step_and_history_with_timings(make_env: MakeEnv) -> None:
    env = make_env(lease=0.3)  # heartbeats every 0.1 s of real time
    gate = threading.Event()

    def quick() -> int:
        env.clock.advance(2)
        return 1

    def slow() -> int:
        gate.wait(10)
        return 2

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> int:
        return int(wf.step(quick)) + int(wf.step(slow, name="slow"))

    handle = flow.start(id="q")
    wait_until(lambda: (s := env.journal.get("q")) is not None and s.current_step == "slow")
    assert handle.status == Status.RUNNING
    state = env.journal.get("q")
    assert state is not None
    assert state.position == 1
    gate.set()
    assert handle.result(10) == 3
    [first, second] = env.journal.load("q")[1]
    assert first.finished_at is not None
    assert first.finished_at - first.started_at == pytest.approx(2)
    assert second.name == "slow"


def test_child_workflows_run_with_their_own_journal(make_env: MakeEnv) -> None:
    env = make_env()
    done: list[str] = []

    def act(name: str) -> str:
        done.append(name)
        return name

    def undo(result: str) -> None:
        done.append(f"undo {result}")

    def fail() -> None:
        raise RuntimeError("child failed")

    @env.app.workflow()
    def child(wf: WorkflowContext, name: str, broken: bool) -> str:
        wf.step(act, f"{name}-a", undo=undo)
        if broken:
            wf.step(fail)
        return f"{name}-done"

    @env.app.workflow()
    def parent(wf: WorkflowContext, broken: bool) -> list[str]:
        wf.step(act, "p", undo=undo)
        first = wf.child(child, "c1", False)
        second = wf.child("child", "c2", broken)
        return [first, second]

    assert parent.run(False, id="ok") == ["c1-done", "c2-done"]
    children = env.journal.workflows(parent_id="ok")
    assert sorted(c.id for c in children) == ["ok/1", "ok/2"]
    done.clear()
    with pytest.raises(RuntimeError, match="child failed"):
        parent.run(True, id="bad")
    # The child undid its own step; the parent undid the completed child's? No: children
    # compensate themselves; the parent undoes its own steps only, in reverse order.
    assert done == ["p", "c1-a", "c2-a", "undo c2-a", "undo p"]
    assert [e.kind for e in env.journal.load("bad")[1]] == ["step", "child", "child", "undo"]


def test_cancellation_compensates_a_waiting_workflow(make_env: MakeEnv) -> None:
    env = make_env(inline_wait=0.0)
    done: list[str] = []

    def act(name: str) -> str:
        done.append(name)
        return name

    def undo(result: str) -> None:
        done.append(f"undo {result}")

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> None:
        wf.step(act, "compute", undo=undo)
        wf.wait_for("approve")
        wf.step(act, "deploy")

    handle = flow.enqueue(id="cx")
    worker = env.worker()
    worker.drain()
    assert handle.cancel() is True
    worker.drain()
    assert handle.status == Status.CANCELLED
    with pytest.raises(CancelledError):
        handle.result(1)
    assert done == ["compute", "undo compute"]
    state, entries = env.journal.load("cx")
    assert state.compensation == "done"
    assert [e.kind for e in entries] == ["step", "cancel", "undo"]
    assert handle.cancel() is False  # finished: nothing to cancel


def test_cancelling_a_workflow_before_it_runs(make_env: MakeEnv) -> None:
    env = make_env()
    ran: list[int] = []

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> None:
        wf.step(ran.append, 1)

    handle = flow.enqueue(id="early")
    assert handle.cancel()
    env.worker().drain()
    assert handle.status == Status.CANCELLED
    assert ran == []


def test_the_workflow_id_is_the_idempotency_key(make_env: MakeEnv) -> None:
    env = make_env()
    calls: list[int] = []

    @env.app.workflow()
    def flow(wf: WorkflowContext, n: int) -> int:
        return int(wf.step(lambda: calls.append(n) or n, name="once"))

    first = flow.start(1, id="order-42")
    second = flow.start(2, id="order-42")
    assert first.id == second.id == "order-42"
    assert first.result(5) == second.result(5) == 1
    assert flow.run(3, id="order-42") == 1
    assert calls == [1]

    @env.app.workflow()
    def other(wf: WorkflowContext) -> None:
        return None

    with pytest.raises(SubmitError, match="already names a"):
        other.start(id="order-42")


def test_a_transactional_step_takes_effect_exactly_once(make_env: MakeEnv) -> None:
    env = make_env()
    table = f"ledger_{time.time_ns()}"
    crashes = {"inside": True, "after": True}

    def setup(tx: Any) -> None:
        tx.execute(f"CREATE TABLE IF NOT EXISTS {table} (wf TEXT, amount INTEGER)")

    def charge(tx: Any, wf_id: str, amount: int) -> int:
        tx.execute(f"INSERT INTO {table} (wf, amount) VALUES (?, ?)", (wf_id, amount))
        if crashes["inside"]:
            crashes["inside"] = False
            raise Crash("died before the commit")
        return amount

    def notify() -> None:
        if crashes["after"]:
            crashes["after"] = False
            raise Crash("died after the commit")

    @env.app.workflow()
    def pay(wf: WorkflowContext, amount: int) -> int:
        wf.step(setup, transactional=True)
        charged = int(wf.step(charge, wf.id, amount, transactional=True))
        wf.step(notify)
        return charged

    for _ in range(2):
        with pytest.raises(Crash):
            pay.run(7, id="pay-1")
        env.expire_leases()
    env.worker().drain()
    assert pay.handle("pay-1").result(5) == 7
    rows = env.journal.record_transactional  # the journal's own database holds the ledger
    assert rows is not None
    with env.journal._auto() as c:  # type: ignore[attr-defined]
        assert c.all(f"SELECT wf, amount FROM {table}") == [("pay-1", 7)]


def test_a_stalled_run_is_fenced_off_by_its_successor(make_env: MakeEnv) -> None:
    env = make_env(lease=3600.0)  # no heartbeat happens during the test (every 20 min)
    gate = threading.Event()
    runs: list[str] = []

    def slow(who: str) -> str:
        runs.append(threading.current_thread().name)
        if len(runs) == 1:
            gate.wait(10)  # the first run stalls here (a long GC pause, a frozen VM)
        return "done"

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> str:
        return str(wf.step(slow, "x"))

    handle = flow.start(id="f")
    wait_until(lambda: len(runs) == 1)
    # Its lease lapses (no heartbeat in 30 s of journal time): another worker takes over
    env.expire_leases()
    assert env.worker().drain() == 1
    assert handle.result(5) == "done"
    gate.set()
    # The stalled run wakes, tries to record, is fenced, and stops without writing.
    wait_until(lambda: env.rt.active() == 0)
    state, entries = env.journal.load("f")
    assert state.status == WorkflowStatus.SUCCEEDED
    assert state.claims == 2
    assert len(entries) == 1


def test_a_stopping_worker_hands_its_workflows_back_at_the_next_step(make_env: MakeEnv) -> None:
    env = make_env()
    gate = threading.Event()
    calls: Counter[str] = Counter()

    def first() -> int:
        calls["first"] += 1
        gate.wait(10)
        return 1

    def second() -> int:
        calls["second"] += 1
        return 2

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> int:
        return int(wf.step(first)) + int(wf.step(second))

    handle = flow.enqueue(id="g")
    worker = env.worker().start()
    wait_until(lambda: calls["first"] == 1)
    stopper = threading.Thread(target=worker.stop, args=(10,))
    stopper.start()
    wait_until(lambda: worker.runtime.stopping)
    gate.set()
    stopper.join(10)
    # The first step was recorded, then the workflow was handed back (no lease to wait out)
    state = env.journal.get("g")
    assert state is not None
    assert state.owner is None
    assert state.status == WorkflowStatus.RUNNING
    assert env.worker().drain() == 1
    assert handle.result(5) == 3
    assert calls == {"first": 1, "second": 1}


def test_the_runner_route_metrics_and_await(make_env: MakeEnv) -> None:
    from foundry.observe import names
    from foundry.runtime import SubmitOptions

    env = make_env()

    def undo(result: int) -> None:
        return None

    @env.app.workflow()
    def flow(wf: WorkflowContext, n: int) -> int:
        value = int(wf.step(lambda: n, name="n", undo=undo))
        if n < 0:
            raise ValueError("negative")
        return value

    runner = env.app.runner_for(flow.spec)
    handle = runner.submit((4,), {}, SubmitOptions(key="via-runner"))
    assert handle.id == "via-runner"
    assert asyncio.run(_await(handle)) == 4
    assert runner.call((5,), {}) == 5
    with pytest.raises(ValueError):
        flow.run(-1)
    assert env.app.workflow_handle("via-runner").result(1) == 4
    metrics = env.app.metrics
    assert metrics.value(names.WORKFLOW_STEPS, workflow="flow", state="completed") == 3
    assert metrics.value(names.WORKFLOW_COMPENSATIONS, workflow="flow") == 1
    assert metrics.value(names.UNIT_COMPLETED, unit="flow", model="workflow") == 2
    assert metrics.value(names.UNIT_FAILED, unit="flow", model="workflow") == 1
    with pytest.raises(SubmitError, match="delay"):
        runner.submit((1,), {}, SubmitOptions(delay=5))


async def _await(handle: Any) -> Any:
    return await handle


def test_a_cancel_that_beats_the_result_compensates_even_after_a_crash(make_env: MakeEnv) -> None:
    env = make_env()
    undone: Counter[str] = Counter()

    def last_step() -> str:
        env.journal.request_cancel("late")  # arrives while the last step runs
        return "vm-1"

    def undo(result: str) -> None:
        undone[result] += 1
        if undone[result] == 1:
            raise Crash("died while undoing")

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> str:
        return str(wf.step(last_step, undo=undo))

    with pytest.raises(Crash):
        flow.run(id="late")
    env.expire_leases()
    env.worker().drain()
    state, entries = env.journal.load("late")
    assert state.status == WorkflowStatus.CANCELLED
    assert state.compensation == "done"
    assert [e.kind for e in entries] == ["step", "cancel", "undo"]
    assert undone == {"vm-1": 2}
