"""The scheduler: declared schedules' ticks become queue jobs, exactly one per tick.

``foundry run`` starts one :class:`Scheduler` per process; run as many as you like, on
as many machines: they agree without talking to each other, through the queue's store.

**Exactly one job per tick.** Ticks are instants every process computes alike (a cron
expression in its zone, or multiples of an interval since the epoch). At each look a
scheduler reads the schedule records (:mod:`foundry.backends.queue.schedules`: one read
for every schedule), asks each :class:`~foundry.schedules.Schedule` what is due after its
watermark (:meth:`~foundry.schedules.Schedule.due`: on-time ticks, and the missed ones its
policy keeps), and for each due tick

1. enqueues the unit's job with the idempotency key ``<unit>:schedule:<UTC time>`` — the
   queue's contract makes a second enqueue of that key, by any scheduler, create nothing;
2. then advances the schedule's record to the tick (the watermark only moves forward).

A scheduler killed between the two leaves a tick whose job exists and whose record does
not say so: the next look (its own, or another's) enqueues the same key again, which
creates nothing. So however many schedulers race, crash or restart, a tick has one job,
and the queue's at-least-once delivery with its single completion record makes it one
run (a worker killed mid-run means the job runs again, its completion written once).

The one window left: the key stops guarding once the tick's job record is purged (its
``result_ttl``, 7 days by default) — a scheduler that read the record, then froze for
longer than that before enqueuing, would enqueue the tick again. The record itself never
expires.

**First sight.** A schedule with no record has missed nothing: the scheduler writes its
watermark as *now* and the first tick is the next one. **Failures:** a store that cannot
be reached fails the look (logged; the next look retries, the ticks stay due, as *late*
for :data:`~foundry.schedules.ON_TIME` seconds, then *missed*); a queue at its
``max_pending`` skips that tick for this scheduler (logged, counted ``overloaded``).

Time is injected (``clock``): :meth:`Scheduler.look` is one pass at ``clock()``, and the
tests drive it with a manual clock. Metrics: ``foundry_schedule_ticks_total{unit,
outcome}`` (``enqueued`` by this scheduler, ``duplicate`` — another one had, ``skipped``
by the policy, ``overloaded``) and ``foundry_schedule_lateness_seconds{unit}`` (from the
tick to its job's enqueue, for the jobs this scheduler created).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from foundry.backends.queue.schedules import ScheduleRecord, ScheduleStore, schedule_store
from foundry.deliver.queue import QueueRunner, release_runtime, runtime_for
from foundry.errors import BackendError, OverloadError, SubmitError, WorkerFailedError
from foundry.observe import names
from foundry.runtime import RuntimeContext, UnitSpec
from foundry.schedules import Schedule
from foundry.typed import payloads_for

__all__ = ["MAX_SLEEP", "Scheduled", "Scheduler"]

log = logging.getLogger("foundry.scheduler")

MAX_SLEEP = 1.0  # longest a scheduler goes without looking (another's progress, a clock jump, stop)


@dataclass(frozen=True, slots=True)
class Scheduled:
    """One scheduled unit: its spec, its schedule, and whether it takes ``scheduled_at=``."""

    spec: UnitSpec
    schedule: Schedule
    takes_tick: bool = False


def _wants_datetime(spec: UnitSpec) -> bool:
    """The unit declares ``scheduled_at: datetime`` (then it gets the tick as an aware
    datetime in the schedule's zone; else as its ISO 8601 text, as before)."""
    types = payloads_for(spec.name, spec.fn)
    now = dt.datetime.now(dt.UTC)
    return types.accepts("scheduled_at", now) and not types.accepts("scheduled_at", now.isoformat())


@dataclass
class _Entry:
    unit: Scheduled
    runner: QueueRunner
    cursor: float | None = None  # every tick up to here is settled, as far as this scheduler knows
    last: ScheduleRecord | None = None
    enqueued: int = 0


class Scheduler:
    """Enqueues the ticks of ``units`` on the app's queue (see the module docstring)."""

    def __init__(
        self,
        units: Iterable[Scheduled],
        ctx: RuntimeContext,
        *,
        clock: Callable[[], float] = time.time,
        name: str | None = None,
    ) -> None:
        self.clock = clock
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.failure: WorkerFailedError | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._entries: list[_Entry] = []
        self.runtime = runtime_for(ctx)
        try:
            self.store: ScheduleStore = schedule_store(self.runtime.backend)
            for unit in units:
                if unit.spec.decision.delivery != "queue":
                    raise SubmitError(
                        f"unit {unit.spec.name!r}: a schedule enqueues queue jobs, and this unit runs on "
                        f"{unit.spec.decision.model}. Fix: declare it durable=True"
                    )
                self._entries.append(_Entry(unit, QueueRunner(unit.spec, ctx)))
        except BaseException:
            self.close()
            raise
        self.since = clock()  # when this scheduler last looked (or started)
        m = ctx.metrics
        self._m_ticks = m.counter(names.SCHEDULE_TICKS, "schedule ticks, by outcome", ("unit", "outcome"))
        self._m_late = m.gauge(names.SCHEDULE_LATENESS, "seconds from a tick to its job's enqueue", ("unit",))

    @property
    def units(self) -> list[Scheduled]:
        return [e.unit for e in self._entries]

    # -- one look ------------------------------------------------------------------------

    def look(self) -> float:
        """Enqueue what is due now; the unix time of the next tick of any schedule. Raises
        :class:`~foundry.errors.BackendError` when the store cannot be reached (what was
        enqueued stays enqueued; the rest is due at the next look)."""
        now = self.clock()
        records = {r.name: r for r in self.store.records()}
        for entry in self._entries:
            self._look_at(entry, records.get(entry.unit.spec.name), now)
        self.since = now
        return min((self.next_run(e) for e in self._entries), default=now + MAX_SLEEP)

    def _look_at(self, entry: _Entry, record: ScheduleRecord | None, now: float) -> None:
        unit, schedule = entry.unit.spec.name, entry.unit.schedule
        if record is not None:
            entry.last = record
        if record is None and entry.cursor is None:  # first sight: nothing was missed
            self._advance(entry, now, "")
            entry.cursor = now
            return
        last = max(v for v in (entry.cursor, record.last_tick if record else None) if v is not None)
        due = schedule.due(last, now, self.since)
        if due.skipped:
            self._m_ticks.labels(unit, "skipped").inc(due.skipped)
            log.warning(
                "schedule of %s: %s%d missed tick(s) after %s were skipped (missed=%s)%s",
                unit,
                "at least " if due.more else "",
                due.skipped,
                schedule.stamp(last),
                schedule.policy,
                "; the most recent one runs now" if due.run and schedule.missed == "skip" else "",
            )
        as_datetime = entry.unit.takes_tick and _wants_datetime(entry.unit.spec)
        for tick in due.run:
            at = schedule.at(tick)
            kwargs: dict[str, Any] = (
                {"scheduled_at": at if as_datetime else at.isoformat()} if entry.unit.takes_tick else {}
            )
            try:
                done = entry.runner.enqueue_keyed((), kwargs, schedule.key(tick))
            except OverloadError as exc:
                self._m_ticks.labels(unit, "overloaded").inc()
                log.warning("schedule of %s: tick %s skipped: %s", unit, schedule.stamp(tick), exc)
                entry.cursor = tick
                continue
            if done.created:
                entry.enqueued += 1
                self._m_ticks.labels(unit, "enqueued").inc()
                self._m_late.labels(unit).set(max(0.0, self.clock() - tick))
                log.info("schedule of %s: tick %s enqueued as job %s", unit, schedule.stamp(tick), done.id)
            else:
                self._m_ticks.labels(unit, "duplicate").inc()
            self._advance(entry, tick, done.id)
            entry.cursor = tick

    def _advance(self, entry: _Entry, tick: float, job: str) -> None:
        schedule = entry.unit.schedule
        record = ScheduleRecord(
            entry.unit.spec.name, schedule.expression, schedule.tz, tick, job, self.clock()
        )
        if self.store.advance(record) or entry.last is None or entry.last.last_tick < tick:
            entry.last = record

    def next_run(self, entry: _Entry) -> float:
        settled = max(entry.cursor or 0.0, entry.last.last_tick if entry.last else 0.0, self.since)
        return entry.unit.schedule.next_after(settled)

    def status(self) -> list[dict[str, Any]]:
        """Per schedule: unit, schedule, policy, next run and last tick (unix times), as
        this scheduler knows them (for ``foundry run``'s output and its fleet record)."""
        rows = []
        for e in self._entries:
            s = e.unit.schedule
            last = e.last if e.last is not None and e.last.last_job else None
            rows.append(
                {
                    "unit": e.unit.spec.name,
                    "schedule": s.describe(),
                    "missed": s.policy,
                    "next": self.next_run(e),
                    "last": None if last is None else last.last_tick,
                    "last_job": None if last is None else last.last_job,
                    "enqueued": e.enqueued,
                }
            )
        return rows

    # -- running ---------------------------------------------------------------------------

    def run(self, until: threading.Event | None = None) -> None:
        """Look, sleep until the next tick (at most :data:`MAX_SLEEP`), until :meth:`stop`
        or ``until``. A store that cannot be reached is retried with back-off."""
        stop = self._stop
        pause = 0.1
        while not stop.is_set() and not (until is not None and until.is_set()):
            try:
                nxt = self.look()
            except BackendError as exc:
                log.warning("scheduler %s: %s; looking again in %.1fs", self.name, exc, pause)
                stop.wait(pause)
                pause = min(pause * 2, 5.0)
                continue
            pause = 0.1
            stop.wait(min(MAX_SLEEP, max(0.0, nxt - self.clock())))

    def start(self) -> Scheduler:
        """Run in a thread of its own. A bug that escapes it stops the scheduler and is
        kept in ``failure`` (``foundry run`` exits non-zero): it never looks alive dead."""

        def guarded() -> None:
            try:
                self.run()
            except BaseException as exc:
                error = WorkerFailedError(
                    f"scheduler {self.name}: it failed ({type(exc).__name__}: {exc}); no ticks are enqueued "
                    "by this process any more (other schedulers go on). Fix: see the traceback logged above; "
                    "restart it"
                )
                error.__cause__ = exc
                self.failure = error
                log.critical("%s", error, exc_info=exc)

        self._thread = threading.Thread(target=guarded, name="foundry-scheduler", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop looking (a look in progress finishes its tick), then :meth:`close`."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for entry in self._entries:
            entry.runner.close()
        release_runtime(self.runtime)
