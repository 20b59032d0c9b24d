"""``threads`` / ``bounded_pool``: bounded intake and overflow policies, exact pool-deadlock
detection (and its non-deadlocking cousins), timeouts, cooperative stops, draining."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from foundry import Foundry
from foundry.errors import (
    CancelledError,
    OverloadError,
    PoolDeadlockError,
    PoolDeadlockTimeoutError,
    ResultTimeoutError,
    SubmitError,
    WorkTimeoutError,
)
from foundry.execute import checkpoint
from foundry.handle import Status
from foundry.observe import names
from foundry.units import WorkUnit
from tests.execute import workloads


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """Blocks pooled work until the test opens it (always opened at the end)."""
    event = threading.Event()
    try:
        yield event
    finally:
        event.set()


def blocker(app: Foundry, name: str, **traits: Any) -> WorkUnit:
    return app.work(model="bounded_pool", name=name, **traits)(workloads.wait_for)


def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.002)


# -- the intake and its overflow policies -----------------------------------------------------


def test_reject_when_the_intake_is_full(app: Foundry, gate: threading.Event) -> None:
    unit = blocker(app, "reject", workers=1, max_pending=1, overflow="reject")
    running = unit.submit(gate, "a")
    wait_until(lambda: running.status is Status.RUNNING)
    queued = unit.submit(gate, "b")
    with pytest.raises(OverloadError, match="overflow='reject'"):
        unit.submit(gate, "c")
    assert app.metrics.value(names.POOL_REJECTED, unit="reject") == 1
    assert app.metrics.value(names.QUEUE_DEPTH, unit="reject") == 1
    gate.set()
    assert [running.result(10), queued.result(10)] == ["a", "b"]  # accepted work is never lost


def test_block_waits_for_room_then_gives_up_with_overload(app: Foundry, gate: threading.Event) -> None:
    unit = blocker(app, "block", workers=1, max_pending=1, overflow="block", latency="150ms")
    unit.submit(gate, "a")
    unit.submit(gate, "b")
    with pytest.raises(OverloadError, match="stayed full"):
        unit.submit(gate, "c")  # the latency budget is how long a producer may block
    opener = threading.Timer(0.05, gate.set)
    opener.start()
    assert unit.submit(gate, "d").result(10) == "d"  # room appeared while it waited
    opener.join()


def test_caller_runs_makes_the_producer_do_the_work(app: Foundry, gate: threading.Event) -> None:
    where: list[str] = []

    def record(tag: str, wait: bool) -> str:
        if wait:
            gate.wait(10)
        where.append(threading.current_thread().name)
        return tag

    unit = app.work(model="bounded_pool", workers=1, max_pending=1, overflow="caller_runs", name="cr")(record)
    first = unit.submit("a", True)
    wait_until(lambda: first.status is Status.RUNNING)
    unit.submit("b", True)
    handle = unit.submit("c", False)  # full: runs here, now
    assert handle.done()
    assert handle.result(0) == "c"
    assert where == [threading.current_thread().name]
    gate.set()


def test_intake_gauges_show_depth_age_and_busy_workers(app: Foundry, gate: threading.Event) -> None:
    unit = blocker(app, "gauges", workers=2, max_pending=8)
    handles = [unit.submit(gate, i) for i in range(5)]
    wait_until(lambda: app.metrics.value(names.POOL_BUSY, unit="gauges") == 2)
    time.sleep(0.02)
    assert app.metrics.value(names.QUEUE_DEPTH, unit="gauges") == 3
    assert app.metrics.value(names.QUEUE_OLDEST_AGE, unit="gauges") > 0
    assert app.metrics.value(names.UNIT_IN_FLIGHT, unit="gauges") == 2
    gate.set()
    assert [h.result(10) for h in handles] == list(range(5))
    assert app.metrics.value(names.QUEUE_DEPTH, unit="gauges") == 0
    assert app.metrics.value(names.QUEUE_OLDEST_AGE, unit="gauges") == 0


# -- pool deadlock ------------------------------------------------------------------------


def _nested(app: Foundry, workers: int, inner_timeout: float | None = None, together: int = 1) -> WorkUnit:
    """A unit that submits ``depth - 1`` to its own pool and waits; the first ``together``
    outer calls meet before submitting, so they all hold a worker at the same time."""
    units: dict[str, WorkUnit] = {}
    meet = threading.Barrier(together)

    def outer(depth: int) -> int:
        if depth == 0:
            return 0
        if together > 1 and not meet.broken:
            try:
                meet.wait(10)
            except threading.BrokenBarrierError:
                pass
        return 1 + int(units["u"].submit(depth - 1).result(inner_timeout))

    units["u"] = app.work(model="bounded_pool", workers=workers, name=f"nested{workers}")(outer)
    return units["u"]


def test_pool_deadlock_raises_at_once_instead_of_hanging(app: Foundry) -> None:
    nested = _nested(app, workers=2, together=2)
    gate = threading.Barrier(2)

    def both_start(depth: int) -> int:
        gate.wait(10)  # both workers are taken by waiters before either inner task can run
        return int(nested.submit(depth - 1).result())

    waiter = app.work(model="bounded_pool", workers=2, name="waiters")(both_start)
    nested_outer = [waiter.submit(1), waiter.submit(1)]
    outcomes = []
    for handle in nested_outer:
        try:
            outcomes.append(handle.result(timeout=1.0))  # "within a second", not a hang
        except PoolDeadlockError as exc:
            outcomes.append(type(exc).__name__)
    assert outcomes == [0, 0]  # waiting on *another* pool never deadlocks
    same = [nested.submit(1) for _ in range(2)]
    results: list[object] = []
    messages: list[str] = []
    for handle in same:
        try:
            results.append(handle.result(timeout=1.0))
        except PoolDeadlockError as exc:
            messages.append(str(exc))
            results.append("deadlock")
    assert all("pool deadlock" in m and "Fix:" in m for m in messages)
    # exactly one waiter can never be satisfied; once it fails, the other one completes
    assert sorted(map(str, results)) == ["1", "deadlock"]


def test_every_worker_waiting_on_its_own_pool_is_detected(app: Foundry) -> None:
    nested = _nested(app, workers=1)
    with pytest.raises(PoolDeadlockError):
        nested.submit(1).result(timeout=1.0)


def test_a_timed_wait_that_could_never_succeed_times_out_at_once(app: Foundry) -> None:
    nested = _nested(app, workers=1, inner_timeout=30.0)
    with pytest.raises(PoolDeadlockTimeoutError) as info:
        nested.submit(1).result(timeout=1.0)  # not a 30 s hang followed by a timeout
    assert isinstance(info.value, ResultTimeoutError)  # code that handles timeouts keeps working


def test_legitimate_nested_waits_complete(app: Foundry) -> None:
    nested = _nested(app, workers=3)
    assert nested.submit(2).result(timeout=10) == 2  # outer and middle wait, the leaf runs
    assert [h.result(10) for h in [nested.submit(1), nested.submit(1)]] == [1, 1]


def test_timeout_handlers_see_a_doomed_timed_wait_as_a_timeout(app: Foundry) -> None:
    units: dict[str, WorkUnit] = {}
    both = threading.Barrier(2)

    def poll_then_give_up(depth: int) -> str:
        if depth == 0:
            return "leaf"
        both.wait(10)  # both workers are outer tasks before either submits its leaf
        try:
            return str(units["u"].submit(0).result(timeout=0.05))
        except ResultTimeoutError:
            return "timed out"

    units["u"] = app.work(model="bounded_pool", workers=2, name="polling")(poll_then_give_up)
    first, second = units["u"].submit(1), units["u"].submit(1)
    # one wait could only time out (both workers wait): it does so at once, its task returns,
    # and the freed worker runs the other's leaf
    assert sorted([first.result(10), second.result(10)]) == ["leaf", "timed out"]


def test_waiting_on_your_own_handle_is_a_deadlock(app: Foundry) -> None:
    mine: list[Any] = []
    ready = threading.Event()

    def self_wait() -> None:
        ready.wait(10)
        mine[0].result()

    unit = app.work(model="bounded_pool", workers=2, name="selfish")(self_wait)
    mine.append(unit.submit())
    ready.set()
    with pytest.raises(PoolDeadlockError, match="its own handle"):
        mine[0].result(timeout=5)


# -- timeouts, cooperative stops, closing -------------------------------------------------


def test_timeout_fails_the_handle_and_checkpoint_stops_the_thread(app: Foundry) -> None:
    steps: list[int] = []
    stopped = threading.Event()

    def long_loop() -> None:
        try:
            for step in range(1000):
                steps.append(step)
                time.sleep(0.005)
                checkpoint()
        except WorkTimeoutError:
            stopped.set()
            raise

    unit = app.work(model="threads", workers=1, timeout="50ms", name="loop")(long_loop)
    with pytest.raises(WorkTimeoutError, match="past its timeout"):
        unit.submit().result(timeout=10)
    assert stopped.wait(10)
    assert len(steps) < 1000
    assert app.metrics.value(names.UNIT_FAILED, unit="loop") == 1


def test_cancel_running_then_checkpoint_raises_cancelled(app: Foundry) -> None:
    stopped = threading.Event()
    started = threading.Event()

    def cooperative() -> None:
        started.set()
        try:
            for _ in range(2000):
                time.sleep(0.005)
                checkpoint()
        except CancelledError:
            stopped.set()
            raise

    unit = app.work(model="threads", workers=1, name="coop")(cooperative)
    handle = unit.submit()
    assert started.wait(10)
    assert handle.cancel()
    assert stopped.wait(10)
    assert handle.status is Status.CANCELLED


def test_close_drains_accepted_work_then_refuses(app: Foundry) -> None:
    unit = app.work(model="bounded_pool", workers=2, max_pending=64, name="drain")(workloads.sleep_then)
    handles = [unit.submit(0.005, i) for i in range(40)]
    runner = unit.runner
    runner.close(timeout=10)
    assert [h.result(0) for h in handles] == list(range(40))
    with pytest.raises(SubmitError, match="closed"):
        runner.submit((0, 0), {}, _options())


def test_close_with_no_time_left_cancels_what_did_not_start(app: Foundry, gate: threading.Event) -> None:
    unit = blocker(app, "abandon", workers=1, max_pending=8)
    handles = [unit.submit(gate, i) for i in range(4)]
    wait_until(lambda: handles[0].status is Status.RUNNING)
    threading.Timer(0.2, gate.set).start()
    unit.runner.close(timeout=0.05)
    assert [h.status for h in handles[1:]] == [Status.CANCELLED] * 3
    assert handles[0].result(10) == 0


def _options() -> Any:
    from foundry.runtime import SubmitOptions

    return SubmitOptions()
