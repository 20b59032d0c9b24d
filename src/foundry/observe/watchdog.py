"""Loop lag and loop starvation: a monitor and a watchdog for a running asyncio loop.

**Loop lag** (:class:`LoopMonitor`) is the direct measurement of "a ready task is not
running": a callback is scheduled every ``interval`` and the delay between when it was
due and when it ran is recorded in ``foundry_loop_lag_seconds`` (p50/p99/max). Aggregate
CPU cannot see a starved loop (one pinned core is 12 % of an eight-core box); lag can.

**The watchdog** (:class:`Watchdog`) notices when that callback is more than
``threshold`` late — the loop is blocked — and then samples the loop thread's stack
(``sys._current_frames()``) and its current task (``asyncio.current_task(loop)``) every
few milliseconds until the loop comes back. It names the task, the innermost frame of
*your* code that held the loop (library and asyncio frames are skipped), and the declared
unit (and phase) whose code is on that stack, and reports::

    loop 'foundry' blocked ≥ 212 ms: unit 'handle_payment', task 'Task-7' (handle_payment),
    held it in sign_body (payments.py:41) ≈ 35 ms at a time. Phase 'sign_body' of unit
    'handle_payment' is compute-bound: reclassify 'handle_payment.sign_body' —
    decide(bound="cpu", est="35ms") → direct/processes (now direct/async)

with the new :class:`~foundry.decide.Decision` attached (:class:`StallReport`, a
structured event: ``as_dict()``; every subscriber gets it): the phase re-decided by
``foundry.decide.reclassify`` from what was measured (compute-bound, ``held_for`` at a
time) on this machine's cores — pure Python under the GIL goes to processes; code that
releases the GIL (declare ``releases_gil=True``) to a bounded pool.

A function registered with :func:`attribute` (what a phase hook, ``@unit.phase``, does)
is attributed on every watchdog in the process without name matching, and re-decided from
its phase's own traits; :class:`foundry.execute.adaptive.PhaseMover` subscribes to the
reports and, for units declared ``adaptive=True``, moves such a phase off the loop.

Foundry runs one on every event loop it runs — the managed loop of async units, a
queue worker's loop, workflow steps' and stream consumers' loops — unless the app's
``watchdog`` setting is off. It costs one timer callback per ``interval`` on the loop,
nothing per task (asyncio's debug mode, by contrast, times every callback and costs
~25×), and a share of one thread per process that looks at every watchdog when it asks
to be looked at (``foundry.observe._watcher``).

The parts: :class:`LoopMonitor` (``foundry.observe.lag``), the stack samples
(``foundry.observe._samples``), the shared watching thread (``foundry.observe._watcher``)
and the report (``foundry.observe.stall``); this module decides when a loop is blocked
and what to say about it.

Limits, honestly: detection needs the blocked code to let the watching thread take the
GIL, which pure-Python code does every switch interval (5 ms) and most C code that
computes for long does too; a C call that holds the GIL for its whole duration is still
measured (lag) and reported when it ends, but sampled only before and after. The
culprit frame is a sample, not a trace: code that holds the loop for less than a few
milliseconds at a time is attributed statistically.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
import weakref
from collections import Counter as Tally
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from types import CodeType
from typing import TypeVar

from foundry.decide import Decision, Measured, reclassify
from foundry.observe import names
from foundry.observe._samples import (
    STALL_POLL,
    Entry,
    Sample,
    frame_info,
    held_for,
    saturated,
    take_sample,
    unit_of,
    where,
)
from foundry.observe._watcher import watcher
from foundry.observe.lag import LAG_HELP, LoopMonitor, on_loop_thread
from foundry.observe.metrics import Registry
from foundry.observe.stall import FrameInfo, StallReport, Target, UnitLike
from foundry.profile import current_host
from foundry.traits import Traits

__all__ = [
    "FrameInfo",
    "LoopMonitor",
    "StallReport",
    "Target",
    "UnitLike",
    "Watchdog",
    "attribute",
    "subscribe",
    "watch_loop",
    "watching",
]

log = logging.getLogger("foundry.watchdog")

T = TypeVar("T")

_MAX_SAMPLES = 512  # per stall: a loop stuck for minutes does not grow memory
_SATURATION_SAMPLES = 8  # this many looks finding another task each time: saturation, look less
_SATURATION_LEAST = 4  # fewer looks in a stall than this are never called saturation
_MAX_CULPRITS = 50  # label sets of foundry_loop_culprit_total per loop; the rest count as "other"
_BLOCKED_HELP = "Times the event loop was blocked beyond the watchdog threshold"
_CULPRIT_HELP = "Loop stalls by the unit, phase and frame that held the loop"
_CULPRIT_LABELS = ("loop", "unit", "phase", "culprit")

_listeners: list[Callable[[StallReport], None]] = []
_listeners_lock = threading.Lock()


# Code every watchdog in the process attributes (phase hooks, ``attribute``), and a version
# that tells each watchdog when to rebuild its look-up table.
_attributed: dict[CodeType, Entry] = {}
_attributed_version = 0


def attribute(target: Target) -> Callable[[], None]:
    """Attribute stalls whose stack passes through ``target.fn`` on every watchdog in this
    process — those running now and those started later — as ``target.name`` (the unit)
    and ``target.phase``: what a phase hook (``@unit.phase``) registers, so that a stall in
    its function is its phase's without matching names. Registering the same function
    again replaces the entry (a moved phase's new decision). Returns a function that
    unregisters it."""
    global _attributed_version
    entry = _entry(target)
    if entry is None:
        raise ValueError(f"watchdog: {target.fn!r} has no code object to attribute stalls to")
    code, value = entry
    with _listeners_lock:
        _attributed[code] = value
        _attributed_version += 1

    def unregister() -> None:
        global _attributed_version
        with _listeners_lock:
            if _attributed.get(code) is value:
                del _attributed[code]
                _attributed_version += 1

    return unregister


def _entry(unit: UnitLike) -> tuple[CodeType, Entry] | None:
    fn = inspect.unwrap(unit.fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    return code, Entry(
        unit=unit.name,
        phase=unit.phase if isinstance(unit, Target) else None,
        traits=unit.traits,
        fn_name=getattr(fn, "__name__", unit.name),
        decision=getattr(unit, "decision", None),
        phases=dict(getattr(unit, "phases", None) or {}),
        phase_traits=dict(getattr(unit, "phase_traits", None) or {}),
        movable=isinstance(unit, Target) and unit.movable,
    )


def subscribe(callback: Callable[[StallReport], None]) -> Callable[[], None]:
    """Call ``callback`` with every report of every watchdog in this process (Foundry's
    own included); returns a function that unsubscribes. It runs on the watching
    thread: keep it short, hand real work to a queue."""
    with _listeners_lock:
        _listeners.append(callback)

    def unsubscribe() -> None:
        with _listeners_lock:
            if callback in _listeners:
                _listeners.remove(callback)

    return unsubscribe


@dataclass(slots=True)
class _Stall:
    due: float
    samples: list[Sample] = field(default_factory=list)
    idle: int = 0  # samples that found the loop idle in its own machinery
    reported: bool = False


class Watchdog:
    """Detects a blocked loop, names what held it, and proposes a new decision.

    ``units`` (``WorkUnit``, ``UnitSpec`` or :class:`Target` objects) let it attribute a
    stall to a declared unit and re-decide it from the measurement
    (``reclassify(unit.traits, Measured(bound="cpu", est=<measured>))`` on this machine's
    host); an unknown culprit is re-decided from ``Traits()`` the same way. Reports go to
    ``reports`` (the last ``max_reports``), to ``on_stall`` and every :meth:`subscribe`-r,
    to the ``foundry.watchdog`` logger, and count in ``foundry_loop_blocked_total`` and
    ``foundry_loop_culprit_total``.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop | None = None,
        *,
        registry: Registry | None = None,
        name: str = "main",
        threshold: float = 0.1,
        interval: float | None = None,
        poll: float | None = None,
        report_after: float = 1.0,
        units: Iterable[UnitLike] = (),
        on_stall: Callable[[StallReport], None] | None = None,
        max_reports: int = 100,
        log_reports: bool = True,
    ) -> None:
        if threshold <= 0:
            raise ValueError(f"watchdog {name!r}: threshold={threshold!r} must be > 0 seconds (e.g. 0.1)")
        self.loop = loop if loop is not None else asyncio.get_running_loop()
        self.name = name
        self.threshold = threshold
        self.registry = registry if registry is not None else Registry()
        self.monitor = LoopMonitor(
            self.loop,
            registry=self.registry,
            name=name,
            interval=interval if interval is not None else min(0.05, threshold / 2),
        )
        self.poll = poll if poll is not None else max(0.002, threshold / 2)
        self.report_after = max(report_after, threshold)
        self.blocked = self.registry.counter(names.LOOP_BLOCKED, _BLOCKED_HELP, ("loop",)).labels(name)
        self.reports: deque[StallReport] = deque(maxlen=max_reports)
        self.on_stall = on_stall
        self.log_reports = log_reports
        self.next_at = 0.0  # when the watching thread looks next (monotonic)
        self._entries: dict[CodeType, Entry] = {}
        self._lookup: dict[CodeType, Entry] = {}  # _entries and the process's attributed code
        self._lookup_version = -1
        self.watch(*units)
        self._subscribers: list[Callable[[StallReport], None]] = []
        self._guard = threading.Lock()  # the watching thread's look vs stop/pause on the loop's thread
        self._stall: _Stall | None = None
        self._active = False
        self._cpu_at_start = 0.0
        self._culprits = self.registry.counter(names.LOOP_CULPRIT, _CULPRIT_HELP, _CULPRIT_LABELS)
        self._culprit_keys: set[tuple[str, ...]] = set()
        # Other registries showing this loop (apps sharing the managed loop); weak: a
        # closed app's registry is not kept alive by a loop that lives on.
        self._exports: list[weakref.ref[Registry]] = []

    def watch(self, *units: UnitLike) -> None:
        """Attribute stalls whose stack passes through these units' functions."""
        for unit in units:
            entry = _entry(unit)
            if entry is not None:
                self._entries[entry[0]] = entry[1]
        self._lookup_version = -1

    def subscribe(self, callback: Callable[[StallReport], None]) -> Callable[[], None]:
        """Call ``callback`` with each of this watchdog's reports (on the watching
        thread); returns a function that unsubscribes."""
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    def export(self, registry: Registry) -> None:
        """Show this loop's series (lag, stalls, culprits) in ``registry`` too: the same
        metrics, readable through every app that runs work on this loop."""
        with self._guard:
            self._exports = [ref for ref in self._exports if ref() is not None]
            if registry is self.registry or any(ref() is registry for ref in self._exports):
                return
            registry.histogram(names.LOOP_LAG, LAG_HELP, ("loop",)).adopt(self.monitor.lag, self.name)
            registry.counter(names.LOOP_BLOCKED, _BLOCKED_HELP, ("loop",)).adopt(self.blocked, self.name)
            family = registry.counter(names.LOOP_CULPRIT, _CULPRIT_HELP, _CULPRIT_LABELS)
            for key in self._culprit_keys:
                family.adopt(self._culprits.labels(*key), *key)
            self._exports.append(weakref.ref(registry))

    # -- lifecycle --------------------------------------------------------------

    def start(self, *, paused: bool = False) -> Watchdog:
        """Start watching (``paused``: for a loop that is not running yet; call
        :meth:`resume` around each run)."""
        if self._active:
            return self
        self._active = True
        hub = watcher()
        self._cpu_at_start = hub.cpu
        if not paused:
            self.monitor.start()
        self.next_at = time.monotonic() + self.poll
        hub.add(self)
        return self

    def stop(self) -> None:
        """Stop watching. Called on the loop's thread while it runs (the end of the
        watched work), it also reports a stall that was still going on."""
        reports: list[StallReport | None] = []
        with self._guard:
            if self._active:
                self._active = False
                pending = None
                if on_loop_thread(self.loop) and self.monitor.due is not None:
                    late = time.monotonic() - self.monitor.due
                    if late > 0:
                        pending = (self.monitor.due, late)
                        self.monitor.lag.observe(late)
                reports = self._settle(pending)
        watcher().remove(self)
        self.monitor.stop()
        self._publish(reports)

    def resume(self) -> None:
        """The loop is about to run (from its owner thread): measure it again."""
        self.monitor.resume()

    def pause(self) -> None:
        """The loop stopped running (from its owner thread, right after it ran): the time
        it sits stopped is not lag; a stall it ended with is reported now."""
        with self._guard:
            reports = self._settle(self.monitor.pause())
        self._publish(reports)

    def __enter__(self) -> Watchdog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> Watchdog:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        self.stop()

    # -- looking (on the watching thread) --------------------------------------------------

    def step(self, now: float) -> float | None:
        """One look at the loop; seconds until the next, ``None`` once stopped."""
        with self._guard:
            if not self._active:
                return None
            if self.loop.is_closed():
                self._active = False
                return None
            reports: list[StallReport | None] = []
            wait = self._look(now, reports)
        self._publish(reports)
        return wait

    def _look(self, now: float, reports: list[StallReport | None]) -> float:
        due = self.monitor.due
        stall = self._stall
        if due is None or not self.loop.is_running():  # paused or stopped: nothing is late
            # A stall that ended (its tick ran) before the loop stopped is reported now.
            if stall is not None and not stall.reported and self.monitor.lag_for(stall.due) is not None:
                reports.append(self._ended(stall, 0.0))
            self._stall = None
            return self.poll
        behind = now - due
        if behind > self.threshold:
            sample = self._sample()
            if self.monitor.due != due:
                return STALL_POLL  # it ran while we looked: not blocked any more
            if stall is None or stall.due != due:
                if stall is not None and not stall.reported:  # the loop ran, then blocked again
                    reports.append(self._ended(stall, self.threshold))
                stall = self._stall = _Stall(due)
            if sample is not None and sample.idle:
                stall.idle += 1
            elif sample is not None and len(stall.samples) < _MAX_SAMPLES:
                stall.samples.append(sample)
            if not stall.reported and behind >= self.report_after:
                stall.reported = True
                reports.append(self._report(stall, behind, ongoing=True))
            if saturated(stall.samples[-_SATURATION_SAMPLES:], _SATURATION_SAMPLES):
                # Every recent look found another task: many short steps back to back (10k
                # tasks made ready at once). More samples would say the same: look as when idle.
                return self.poll
            # Sample often at first, then back off: a long stall costs a bounded share.
            return max(STALL_POLL, min(self.poll, (behind - self.threshold) / 16))
        if stall is not None and due != stall.due:
            if not stall.reported:
                reports.append(self._ended(stall, behind))
            self._stall = None
        # No need to look before the pending tick could be ``threshold`` late: a loop that
        # keeps up costs one look per threshold, and a block is seen the moment it counts.
        return max(STALL_POLL, due + self.threshold - now + 0.001)

    def _settle(self, pending: tuple[float, float] | None) -> list[StallReport | None]:
        """Under the guard, when the loop stops being watched or running: report the
        stall seen so far, and a last tick found overdue (``pending``) beyond the
        threshold — the loop was held until the very end."""
        reports: list[StallReport | None] = []
        stall, self._stall = self._stall, None
        if pending is not None and pending[1] > self.threshold:
            due, late = pending
            if stall is not None and stall.due != due:
                if not stall.reported:
                    reports.append(self._ended(stall, self.threshold))
                stall = None
            stall = stall or _Stall(due)
            if not stall.reported:
                reports.append(self._report(stall, late, ongoing=False))
            return reports
        if stall is not None and not stall.reported:
            reports.append(self._ended(stall, self.threshold))
        return reports

    def _sample(self) -> Sample | None:
        if self._lookup_version != _attributed_version:
            with _listeners_lock:
                version, attributed = _attributed_version, dict(_attributed)
            self._lookup = {**attributed, **self._entries}  # a unit watched here wins
            self._lookup_version = version
        return take_sample(self.monitor.thread_id, self.loop, self._lookup)

    def _ended(self, stall: _Stall, otherwise: float) -> StallReport | None:
        """The report on a stall that is over: blocked for as late as its tick ran (the
        monitor's record), or ``otherwise`` when that record has gone."""
        lag = self.monitor.lag_for(stall.due)
        return self._report(stall, lag if lag is not None else otherwise, ongoing=False)

    def _report(self, stall: _Stall, blocked_for: float, ongoing: bool) -> StallReport | None:
        """The report on ``stall``; ``None`` when every look found the loop idle (its timer
        ran late for want of CPU, or on uvloop's stale clock: lag, but nobody held it)."""
        samples = list(stall.samples)
        if not samples and stall.idle:
            return None
        if not samples:
            return StallReport(
                loop=self.name,
                blocked_for=blocked_for,
                held_for=blocked_for,
                culprit=None,
                task=None,
                coroutine=None,
                unit=None,
                phase=None,
                decision=None,
                ongoing=ongoing,
            )
        tally = Tally((where(s), unit_of(s)) for s in samples)
        (spot, unit), _ = tally.most_common(1)[0]
        mine = [s for s in samples if (where(s), unit_of(s)) == (spot, unit)]
        chosen = mine[-1]
        culprit = chosen.culprit
        held = held_for(mine, samples, blocked_for)
        tasks = tuple(dict.fromkeys(s.task for s in samples if s.task))
        # The holder changed at (nearly) every sample: many short steps back to back, not
        # one phase holding the loop. Reclassifying a phase would not help; fewer ready
        # units at once (or more processes) would. Only from a few looks on: a process
        # the machine starved gets two or three in a long stall, and two tasks seen once
        # each say nothing about how long either held the loop (then the spot seen most
        # is reported, as for one task).
        many = saturated(samples, _SATURATION_LEAST)
        traits = Traits()
        phase = culprit.function if culprit is not None else None
        current: Decision | None = None
        entry = chosen.entry
        if entry is not None:
            traits = entry.traits
            if entry.phase is not None:  # a step or a phase hook: that phase, whatever it called
                phase = entry.phase
                current = entry.decision
            elif chosen.declared is not None:
                phase = chosen.declared
                current = entry.phases.get(phase)
                traits = entry.phase_traits.get(phase, traits)  # the phase's own, not the unit's
            elif chosen.in_body:
                phase = "main"
                current = entry.decision
            else:  # an undeclared phase, running as the unit runs
                current = entry.decision
        # The measurement re-decides the phase (``foundry.decide.reclassify``: the declared
        # model= dropped, the drift from what was declared in its notes), for this machine.
        measured = Measured(est=round(held, 4), bound="cpu", source="loop watchdog")
        proposal = None if many else reclassify(traits, measured, phase=phase or "main", host=current_host())
        return StallReport(
            loop=self.name,
            blocked_for=blocked_for,
            held_for=held,
            culprit=culprit,
            task=chosen.task,
            coroutine=chosen.coroutine,
            unit=unit,
            phase=phase,
            decision=proposal,
            stack=tuple(frame_info(code, line) for code, line in reversed(chosen.raw)),
            tasks=tasks,
            samples=len(samples),
            ongoing=ongoing,
            saturated=many,
            current=current,
            measured=None if many else measured,
            movable=entry is not None and entry.movable,
            adaptive=traits.adaptive,
        )

    def _publish(self, reports: list[StallReport | None]) -> None:
        for report in reports:
            if report is None:
                continue
            self.blocked.inc()
            self.reports.append(report)
            self._count_culprit(report)
            if self.log_reports:
                log.warning("%s", report.message)
            with _listeners_lock:
                everyone = list(_listeners)
            for callback in (self.on_stall, *self._subscribers, *everyone):
                if callback is None:
                    continue
                try:
                    callback(report)
                except Exception:  # a broken callback must not stop the watchdog
                    log.exception("watchdog %r: a stall callback failed", self.name)

    def _count_culprit(self, report: StallReport) -> None:
        if report.saturated:
            key: tuple[str, ...] = (self.name, "", "", "saturated")
        else:
            culprit = "" if report.culprit is None else str(report.culprit)
            key = (self.name, report.unit or "", report.phase or "", culprit)
        with self._guard:
            if key not in self._culprit_keys:
                if len(self._culprit_keys) >= _MAX_CULPRITS:
                    key = (self.name, "", "", "other")
                if key not in self._culprit_keys:
                    self._culprit_keys.add(key)
                    child = self._culprits.labels(*key)
                    for ref in self._exports:
                        registry = ref()
                        if registry is not None:
                            family = registry.counter(names.LOOP_CULPRIT, _CULPRIT_HELP, _CULPRIT_LABELS)
                            family.adopt(child, *key)
            counter = self._culprits.labels(*key)
        counter.inc()

    # -- reading ----------------------------------------------------------------

    @property
    def thread_cpu(self) -> float:
        """CPU seconds the watching thread spent since this watchdog started (the thread
        is shared: with several watchdogs running, their looks share this figure)."""
        return max(0.0, watcher().cpu - self._cpu_at_start)

    def overhead(self) -> dict[str, float]:
        """What watching has cost so far: CPU seconds of the watching thread, seconds the
        loop spent in the monitor's callbacks, and how many of those there were."""
        return {
            "thread_cpu": self.thread_cpu,
            "loop_seconds": self.monitor.busy,
            "ticks": float(self.monitor.ticks),
        }

    def culprits(self) -> dict[str, int]:
        """How many stalls each culprit frame caused (for tables)."""
        tally: Tally[str] = Tally(str(r.culprit) for r in self.reports if r.culprit is not None)
        return dict(tally.most_common())


def watch_loop(
    loop: asyncio.AbstractEventLoop | None = None,
    *,
    registry: Registry | None = None,
    name: str = "main",
    threshold: float = 0.1,
    units: Iterable[UnitLike] = (),
    on_stall: Callable[[StallReport], None] | None = None,
) -> Watchdog:
    """Start a :class:`Watchdog` (with its lag monitor) on ``loop`` (default: the running
    loop). Use it as a context manager, or call ``stop()``."""
    return Watchdog(
        loop, registry=registry, name=name, threshold=threshold, units=units, on_stall=on_stall
    ).start()


async def watching(
    work: Awaitable[T],
    *,
    threshold: float | None,
    registry: Registry,
    name: str,
    units: Iterable[UnitLike] = (),
) -> T:
    """Await ``work`` with a watchdog on the running loop for as long as it runs (a loop
    made for one call, as ``asyncio.run`` makes); ``threshold=None`` watches nothing."""
    if threshold is None:
        return await work
    dog = Watchdog(registry=registry, name=name, threshold=threshold, units=units).start()
    try:
        return await work
    finally:
        dog.stop()
