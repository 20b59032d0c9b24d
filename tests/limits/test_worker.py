"""How one worker waits on a limit (``foundry.deliver.limits``): a job over its limit is
parked, not failed; it spends no attempt, shows in the metrics, does not hold up other
units (they do not count against ``prefetch``), can be cancelled while it waits, and a graceful stop gives
it back without making it a suspect."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from foundry import Foundry
from foundry.backends.queue import JobStatus
from foundry.deliver.worker import JobEvent, Worker
from foundry.observe import names

GATE = threading.Event()


def held(i: int) -> int:
    """Runs until the test opens the gate (at most 20 s)."""
    GATE.wait(20)
    return i


def quick(i: int) -> int:
    return i


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Foundry]:
    GATE.clear()
    made = Foundry(f"lim-{uuid.uuid4().hex[:6]}", queue=f"sqlite:///{tmp_path / 'q.db'}")
    made.work(durable=True, max_concurrency=1, name="held")(held)
    made.work(durable=True, name="quick")(quick)
    try:
        yield made
    finally:
        GATE.set()
        made.close()


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def metric(app: Foundry, name: str, **labels: str) -> float:
    return app.context().metrics.value(name, **labels)


def test_a_job_over_its_limit_waits_spends_no_attempt_and_shows_in_metrics(app: Foundry) -> None:
    events: list[JobEvent] = []
    with Worker(app, concurrency=4, lease=5.0, poll=0.2, on_event=events.append):
        handles = [app.units["held"].submit(i) for i in range(3)]
        # one runs (the only slot), two wait for it
        wait_until(lambda: metric(app, names.LIMIT_WAITING, unit="held") == 2, "two waiting jobs")
        # the second was refused; the third waits behind it without asking (or was refused too)
        assert metric(app, names.LIMIT_REFUSED, unit="held", limit="max_concurrency") >= 1
        assert [e.kind for e in events].count("started") == 1
        GATE.set()
        assert [h.result(timeout=20) for h in handles] == [0, 1, 2]
    kinds = {e.kind for e in events}
    assert "retry" not in kinds
    assert "failed" not in kinds
    store = app.units["held"].runner.backend  # type: ignore[attr-defined]
    for h in handles:
        state = store.get(h.id)
        assert state.status is JobStatus.SUCCEEDED
        assert state.attempts == 0
        assert state.deliveries == 1
    assert metric(app, names.LIMIT_WAITING, unit="held") == 0
    assert metric(app, names.LIMIT_WAIT_SECONDS, unit="held") > 0


def test_parked_jobs_do_not_count_against_prefetch_nor_hold_up_another_unit(app: Foundry) -> None:
    with Worker(app, concurrency=2, prefetch=2, lease=5.0, poll=0.2):
        limited = [app.units["held"].submit(i) for i in range(3)]
        wait_until(lambda: metric(app, names.LIMIT_WAITING, unit="held") == 2, "two waiting jobs")
        # one runs, two are parked (prefetch=2 would be full if they counted): the other unit runs
        assert [app.units["quick"].submit(i).result(timeout=10) for i in range(3)] == [0, 1, 2]
        GATE.set()
        assert [h.result(timeout=20) for h in limited] == [0, 1, 2]


def test_a_parked_job_is_cancelled_at_once(app: Foundry) -> None:
    with Worker(app, concurrency=4, lease=5.0, poll=0.2):
        first = app.units["held"].submit(0)
        waiting = app.units["held"].submit(1)
        wait_until(lambda: metric(app, names.LIMIT_WAITING, unit="held") == 1, "a waiting job")
        waiting.cancel()
        wait_until(lambda: waiting.status == "cancelled", "the cancel")
        assert metric(app, names.LIMIT_WAITING, unit="held") == 0
        GATE.set()
        assert first.result(timeout=10) == 0


def test_a_graceful_stop_gives_parked_jobs_back_unharmed(app: Foundry) -> None:
    worker = Worker(app, concurrency=4, lease=5.0, poll=0.2, grace=5.0).start()
    first = app.units["held"].submit(0)
    parked = [app.units["held"].submit(i) for i in (1, 2)]
    wait_until(lambda: metric(app, names.LIMIT_WAITING, unit="held") == 2, "two waiting jobs")
    stopper = threading.Thread(target=worker.stop)
    stopper.start()
    time.sleep(0.2)
    GATE.set()  # the running one finishes within the grace
    stopper.join(20)
    assert first.result(timeout=5) == 0
    store = app.units["held"].runner.backend  # type: ignore[attr-defined]
    for h in parked:
        state = store.get(h.id)
        assert state.status is JobStatus.QUEUED
        assert (state.deliveries, state.attempts) == (0, 0)  # given back: not a suspect
    with Worker(app, concurrency=4, lease=5.0, poll=0.2):  # and the next worker runs them
        assert [h.result(timeout=20) for h in parked] == [1, 2]


@pytest.mark.alone  # a tight lease: a starved heartbeat would lose it beside other tests
def test_a_running_job_keeps_its_slot_past_the_lease_while_its_worker_lives(app: Foundry) -> None:
    events: list[JobEvent] = []
    with Worker(app, concurrency=4, lease=0.75, poll=0.2, on_event=events.append):
        first = app.units["held"].submit(0)
        second = app.units["held"].submit(1)
        wait_until(lambda: metric(app, names.LIMIT_WAITING, unit="held") == 1, "a waiting job")
        time.sleep(1.8)  # 2.4 leases: the heartbeat renews the job's lease and its slot with it
        assert [e.job_id for e in events if e.kind == "started"] == [first.id]
        GATE.set()
        assert [first.result(timeout=10), second.result(timeout=10)] == [0, 1]
