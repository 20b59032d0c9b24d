"""The scheduler's looks, driven by a manual clock on a real SQLite queue: racing
schedulers make one job per tick; a crash between the job and the record doubles
nothing; a schedule seen for the first time has missed nothing; after downtime the
policy decides; a full queue or an unreachable store loses no tick it should not."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from foundry import Foundry
from foundry.backends.queue import JobStatus
from foundry.deliver.scheduler import Scheduled, Scheduler
from foundry.deliver.worker import Worker
from foundry.errors import BackendUnavailableError, WorkerFailedError
from foundry.observe import names
from foundry.schedules.schedule import takes_tick

T0 = 1_700_000_000.0  # a tick of "every 1s"


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def declare(app: Foundry) -> None:
    @app.work(schedule="every 1s", bound="io")
    def beat() -> str:
        return "beat"

    @app.work(schedule="every 1s", bound="io", missed="catch_up", catch_up=3)
    def ledger(scheduled_at: str = "") -> str:
        return scheduled_at

    @app.work(schedule="every 1s", bound="io")
    def typed_ledger(scheduled_at: dt.datetime | None = None) -> dt.datetime | None:
        return scheduled_at


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., tuple[Foundry, Scheduler]]]:
    """Another "process": an app on the test's queue file and a scheduler on ``clock``."""
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    made: list[tuple[Foundry, Scheduler]] = []

    def build(clock: Clock, units: tuple[str, ...] = ("beat",)) -> tuple[Foundry, Scheduler]:
        app = Foundry(f"sched-{len(made)}", queue=url, home=tmp_path)
        declare(app)
        chosen = [
            Scheduled(u.spec, u.schedule, takes_tick(n, u.fn, u.schedule.expression))
            for n, u in app.units.items()
            if n in units and u.schedule is not None
        ]
        scheduler = Scheduler(chosen, app.context(), clock=clock)
        made.append((app, scheduler))
        return app, scheduler

    try:
        yield build
    finally:
        for app, scheduler in made:
            scheduler.stop(5.0)
            app.close()


def jobs(scheduler: Scheduler, unit: str = "beat") -> list[Any]:
    backend: Any = scheduler.runtime.backend
    return [j for j in backend.jobs(limit=10_000) if j.unit == unit]


def ticks_of(found: list[Any]) -> list[str]:
    return sorted(j.key.split(":schedule:")[1] for j in found)


def stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def test_racing_schedulers_make_one_job_per_tick(make: Callable[..., tuple[Foundry, Scheduler]]) -> None:
    clock = Clock(T0 + 0.5)
    (a_app, a), (b_app, b) = make(clock), make(clock)
    for s in (a, b):
        s.look()  # first sight: nothing missed, nothing enqueued
    real = b.store.records
    # When both look at every tick for 20 s: for the first 10 one after the other, for the
    # last 10 racing (b read the records before a enqueued, so b enqueues the tick too)
    for second in range(1, 21):
        clock.now = T0 + second + 0.01
        if second <= 10:
            first, then = (a, b) if second % 2 else (b, a)
            first.look()
            then.look()
        else:
            seen = real()
            a.look()
            b.store.records = lambda seen=seen: seen  # type: ignore[method-assign, misc]
            b.look()
            b.store.records = real  # type: ignore[method-assign]
    # Then each tick has exactly one job: the record stopped the late looker, the tick's key
    # stopped the racing one
    assert ticks_of(jobs(a)) == [stamp(T0 + s) for s in range(1, 21)]

    def count(app: Foundry, outcome: str) -> float:
        return app.metrics.value(names.SCHEDULE_TICKS, unit="beat", outcome=outcome)

    assert [count(a_app, "enqueued"), count(b_app, "enqueued")] == [15, 5]
    assert [count(a_app, "duplicate"), count(b_app, "duplicate")] == [0, 10]
    record = a.store.get("beat")
    assert record is not None
    assert record.last_tick == T0 + 20


def test_a_crash_between_the_job_and_the_record_doubles_nothing(
    make: Callable[..., tuple[Foundry, Scheduler]],
) -> None:
    clock = Clock(T0 + 0.5)
    _, a = make(clock)
    a.look()
    clock.now = T0 + 1.2

    def crash(record: Any) -> bool:
        raise BackendUnavailableError("the process died here (simulated)")

    real_advance, a.store.advance = a.store.advance, crash  # type: ignore[method-assign]
    with pytest.raises(BackendUnavailableError):
        a.look()  # the job of T0+1 is enqueued, its record is not
    a.store.advance = real_advance  # type: ignore[method-assign]
    assert ticks_of(jobs(a)) == [stamp(T0 + 1)]
    # A scheduler started after the "crash" finds the tick unsettled and enqueues it again:
    _, b = make(clock)
    b.look()
    assert ticks_of(jobs(b)) == [stamp(T0 + 1)]  # the same key: still one job
    record = b.store.get("beat")
    assert record is not None
    assert record.last_tick == T0 + 1


def test_a_new_schedule_has_missed_nothing(make: Callable[..., tuple[Foundry, Scheduler]]) -> None:
    clock = Clock(T0 + 100.5)
    _, a = make(clock)
    assert a.look() == T0 + 101  # the next tick to look at
    assert jobs(a) == []
    record = a.store.get("beat")
    assert record is not None
    assert (record.last_tick, record.last_job) == (T0 + 100.5, "")
    assert a.status()[0]["last"] is None  # first sight is no run


def test_after_downtime_skip_runs_the_latest_and_catch_up_the_last_n(
    make: Callable[..., tuple[Foundry, Scheduler]],
) -> None:
    clock = Clock(T0 + 0.5)
    _, before = make(clock, ("beat", "ledger"))
    clock.now = T0 + 2.1
    before.look()  # first sight: the watermark is T0+2.1, nothing to run
    before.stop()
    # Given every scheduler down for ten minutes
    clock.now = T0 + 602.5
    after_app, after = make(clock, ("beat", "ledger"))
    after.look()
    # Then the skip unit runs once (the latest missed tick), the catch-up unit its last 3
    beat = [t for t in ticks_of(jobs(after, "beat")) if t > stamp(T0 + 2)]
    ledger = [t for t in ticks_of(jobs(after, "ledger")) if t > stamp(T0 + 2)]
    assert beat == [stamp(T0 + 602)]
    assert ledger == [stamp(T0 + 600), stamp(T0 + 601), stamp(T0 + 602)]
    assert after_app.metrics.value(names.SCHEDULE_TICKS, unit="beat", outcome="skipped") == 599
    assert after_app.metrics.value(names.SCHEDULE_TICKS, unit="ledger", outcome="skipped") == 597


def test_a_stalled_scheduler_runs_every_tick_it_was_late_for(
    make: Callable[..., tuple[Foundry, Scheduler]],
) -> None:
    clock = Clock(T0 + 0.5)
    _, a = make(clock)
    a.look()
    clock.now = T0 + 7.9  # its thread was starved for 7 s: late, not missed
    a.look()
    assert ticks_of(jobs(a)) == [stamp(T0 + s) for s in range(1, 8)]


def test_an_unreachable_store_fails_the_look_and_loses_no_late_tick(
    make: Callable[..., tuple[Foundry, Scheduler]],
) -> None:
    clock = Clock(T0 + 0.5)
    _, a = make(clock)
    a.look()
    real = a.store.records

    def down() -> list[Any]:
        raise BackendUnavailableError("queue sqlite:///…: unreachable (simulated)")

    a.store.records = down  # type: ignore[method-assign]
    for second in (1, 2, 3):
        clock.now = T0 + second + 0.1
        with pytest.raises(BackendUnavailableError):
            a.look()
    a.store.records = real  # type: ignore[method-assign]
    clock.now = T0 + 4.1
    a.look()
    assert ticks_of(jobs(a)) == [stamp(T0 + s) for s in range(1, 5)]


def test_a_full_queue_skips_the_tick_and_says_so(tmp_path: Path) -> None:
    app = Foundry("sched-full", queue=f"sqlite:///{tmp_path / 'q.db'}", home=tmp_path)

    @app.work(schedule="every 1s", max_pending=1)
    def bounded() -> None: ...

    clock = Clock(T0 + 0.5)
    scheduler = Scheduler([Scheduled(bounded.spec, bounded.schedule)], app.context(), clock=clock)  # type: ignore[arg-type]
    try:
        scheduler.look()
        for second in (1, 2, 3):
            clock.now = T0 + second + 0.1
            scheduler.look()  # nobody works the queue: it stays at its bound
        assert app.metrics.value(names.SCHEDULE_TICKS, unit="bounded", outcome="enqueued") == 1
        assert app.metrics.value(names.SCHEDULE_TICKS, unit="bounded", outcome="overloaded") == 2
    finally:
        scheduler.stop()
        app.close()


def test_the_unit_gets_its_tick_time(make: Callable[..., tuple[Foundry, Scheduler]]) -> None:
    clock = Clock(T0 + 0.5)
    app, scheduler = make(clock, ("ledger",))
    scheduler.look()
    clock.now = T0 + 1.05
    scheduler.look()
    worker = Worker(app, burst=True, concurrency=1, poll=0.1)
    worker.run()
    [job] = jobs(scheduler, "ledger")
    state = scheduler.runtime.backend.get(job.id)
    assert state is not None
    assert state.status is JobStatus.SUCCEEDED
    assert app.job(job.id).result(timeout=10) == "2023-11-14T22:13:21+00:00"


def test_a_bug_in_the_scheduler_stops_it_and_says_so(make: Callable[..., tuple[Foundry, Scheduler]]) -> None:
    _, scheduler = make(Clock(T0))

    def broken() -> list[Any]:
        raise RuntimeError("a bug")

    scheduler.store.records = broken  # type: ignore[method-assign]
    scheduler.start()
    deadline = time.monotonic() + 10
    while scheduler.failure is None:
        assert time.monotonic() < deadline, "the scheduler's failure was never recorded"
        time.sleep(0.01)
    assert isinstance(scheduler.failure, WorkerFailedError)
    assert "RuntimeError: a bug" in str(scheduler.failure)


def test_a_unit_that_declares_a_datetime_gets_the_tick_as_one(
    make: Callable[..., tuple[Foundry, Scheduler]],
) -> None:
    clock = Clock(T0 + 0.5)
    app, scheduler = make(clock, ("typed_ledger", "ledger"))
    scheduler.look()
    clock.now = T0 + 1.01
    scheduler.look()
    worker = Worker(app, concurrency=1, poll=0.05).start()
    try:
        typed = [app.job(j.id).result(timeout=30) for j in jobs(scheduler, "typed_ledger")]
        text = [app.job(j.id).result(timeout=30) for j in jobs(scheduler, "ledger")]
    finally:
        worker.stop(5.0)
    # a datetime (aware, the tick's instant) where the unit declares one; its ISO text where it declares str
    assert typed == [dt.datetime.fromtimestamp(T0 + 1, dt.UTC)]
    assert typed[0].tzinfo is not None
    assert text == [dt.datetime.fromtimestamp(T0 + 1, dt.UTC).isoformat()]
