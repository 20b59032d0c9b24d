"""Loop lag and loop starvation: a monitor and a watchdog for a running asyncio loop.

**Loop lag** (:class:`LoopMonitor`) is the direct measurement of "a ready task is not
running": a callback is scheduled every ``interval`` and the delay between when it was
due and when it ran is recorded in ``foundry_loop_lag_seconds`` (p50/p99/max). Aggregate
CPU cannot see a starved loop (one pinned core is 12 % of an eight-core box); lag can.

**The watchdog** (:class:`Watchdog`) is a thread that notices when that callback is more
than ``threshold`` late — the loop is blocked — and then samples the loop thread's stack
(``sys._current_frames()``) and its current task (``asyncio.current_task(loop)``) every
few milliseconds until the loop comes back. It names the task, the innermost frame of
*your* code that held the loop (library and asyncio frames are skipped), and the declared
unit whose function is on that stack, and reports::

    loop 'main' blocked ≥ 212 ms: task 'Task-7' (handle_payment) held it in sign_body
    (payments.py:41) ≈ 35 ms at a time. This phase is compute-bound: reclassify —
    decide(bound="cpu", est="35ms") → direct/bounded_pool

with the new :class:`~foundry.decide.Decision` attached. It costs one timer callback per
``interval`` on the loop and one short wake-up per ``poll`` in the thread — nothing per
task (asyncio's debug mode, by contrast, times every callback and costs ~25×).

Limits, honestly: detection needs the blocked code to let the watchdog thread take the
GIL, which pure-Python code does every switch interval (5 ms) and most C code that
computes for long does too; a C call that holds the GIL for its whole duration is still
measured (lag) and reported when it ends, but sampled only before and after. The
culprit frame is a sample, not a trace: code that holds the loop for less than a few
milliseconds at a time is attributed statistically.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import sys
import sysconfig
import threading
import time
from collections import Counter as Tally
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from foundry.decide import Decision, decide
from foundry.observe import names
from foundry.observe.metrics import Registry
from foundry.traits import Traits

__all__ = ["FrameInfo", "LoopMonitor", "StallReport", "Watchdog", "watch_loop"]

log = logging.getLogger("foundry.watchdog")

_INFRA_MODULES = (
    "asyncio",
    "concurrent",
    "threading",
    "selectors",
    "contextlib",
    "functools",
    "uvloop",
    "foundry.",  # Foundry's own modules, except the demos and examples below
)
_USER_MODULES = ("foundry.demos", "foundry.examples")
_LIBRARY_DIRS = tuple(
    {
        path
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (path := sysconfig.get_paths().get(key))
    }
)
# The loop's own machinery: frames outside the callback or task step that is running.
_LOOP_FRAMES = frozenset(
    {
        ("asyncio.events", "_run"),
        ("asyncio.base_events", "_run_once"),
        ("asyncio.base_events", "run_forever"),
        ("asyncio.base_events", "run_until_complete"),
    }
)
_STALL_POLL = 0.004  # seconds between samples while the loop is blocked
_MAX_SAMPLES = 512  # per stall: a loop stuck for minutes does not grow memory


class UnitLike(Protocol):
    """A declared unit (``WorkUnit`` or ``UnitSpec``): what the watchdog attributes to."""

    @property
    def name(self) -> str: ...

    @property
    def fn(self) -> Callable[..., Any]: ...

    @property
    def traits(self) -> Traits: ...


@dataclass(frozen=True, slots=True)
class FrameInfo:
    function: str
    filename: str
    lineno: int
    module: str

    def __str__(self) -> str:
        short = self.filename.rsplit("/", 1)[-1]
        return f"{self.function} ({short}:{self.lineno})"


@dataclass(frozen=True, slots=True)
class StallReport:
    """One stretch of time the loop did not run its ready callbacks."""

    loop: str
    blocked_for: float
    """Seconds a ready callback waited (a lower bound on how long the loop was held)."""
    held_for: float
    """Estimated seconds the culprit held the loop at a time (from the samples)."""
    culprit: FrameInfo | None
    """The innermost frame of your code on the loop thread's stack."""
    task: str | None
    coroutine: str | None
    unit: str | None
    """The declared unit whose function was on the stack, when one was."""
    phase: str
    decision: Decision | None
    """What ``decide`` answers once the phase is known to be compute-bound."""
    stack: tuple[FrameInfo, ...] = ()
    tasks: tuple[str, ...] = ()
    """Every task seen holding the loop during this stall."""
    samples: int = 0
    ongoing: bool = False
    """Reported while still blocked (it lasted longer than ``report_after``)."""
    saturated: bool = False
    """Many short steps back to back held the loop, not one phase (``decision`` is None)."""
    at: float = field(default_factory=time.time)

    @property
    def message(self) -> str:
        where = f" in {self.culprit}" if self.culprit else ""
        who = f"task {self.task!r}" if self.task else "a callback (no task)"
        if self.coroutine:
            who += f" ({self.coroutine})"
        still = " and is still blocked" if self.ongoing else ""
        if self.saturated:
            return (
                f"loop {self.loop!r} blocked ≥ {self.blocked_for * 1e3:.0f} ms{still}: {len(self.tasks)} "
                f"tasks ran back to back, none for long (≈ {self.held_for * 1e3:.0f} ms each; last seen "
                f"{self.culprit or '?'}): the loop is saturated, not held by one compute-bound phase. "
                "Fix: fewer units ready at once (a lower concurrency= or permits), or spread the load "
                "over more processes"
            )
        text = (
            f"loop {self.loop!r} blocked ≥ {self.blocked_for * 1e3:.0f} ms{still}: {who} held it{where}"
            f" ≈ {self.held_for * 1e3:.0f} ms at a time."
        )
        if self.decision is not None:
            subject = f"{self.unit}.{self.phase}" if self.unit and self.phase != "main" else self.phase
            text += (
                f" This phase is compute-bound: reclassify {subject!r} — "
                f'decide(bound="cpu", est="{self.held_for * 1e3:.0f}ms") → {self.decision.model}'
            )
        return text

    def __str__(self) -> str:
        return self.message


class LoopMonitor:
    """Measures a loop's lag: a callback every ``interval`` s, its lateness recorded."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        registry: Registry | None = None,
        name: str = "main",
        interval: float = 0.05,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"loop monitor {name!r}: interval={interval!r} must be > 0 seconds")
        self.loop = loop
        self.name = name
        self.interval = interval
        self.registry = registry if registry is not None else Registry()
        self.lag = self.registry.histogram(
            names.LOOP_LAG, "Seconds a due callback waited for the event loop", ("loop",)
        ).labels(name)
        self.due: float | None = None  # monotonic time the next tick is due
        self.thread_id: int | None = None
        self.ticks = 0
        self.busy = 0.0  # seconds the loop spent in this monitor's callbacks (its cost)
        self.recent: deque[tuple[float, float]] = deque(maxlen=16)  # (due, lag)
        self._handle: asyncio.TimerHandle | asyncio.Handle | None = None
        self._running = False

    def start(self) -> None:
        if self._running:
            return
        self._running = True
        if _on_loop_thread(self.loop):
            self._first()  # now: a block that starts right after this call is seen
        else:
            self._handle = self.loop.call_soon_threadsafe(self._first)

    def _first(self) -> None:
        self.thread_id = threading.get_ident()
        self.due = time.monotonic() + self.interval
        self._handle = self.loop.call_later(self.interval, self._tick)

    def _tick(self) -> None:
        now = time.monotonic()
        due = self.due if self.due is not None else now
        lag = now - due if now > due else 0.0
        self.lag.observe(lag)
        self.recent.append((due, lag))
        self.ticks += 1
        if self._running:
            self.due = now + self.interval
            self._handle = self.loop.call_later(self.interval, self._tick)
        self.busy += time.monotonic() - now

    def lag_for(self, due: float) -> float | None:
        for seen, lag in reversed(self.recent):
            if seen == due:
                return lag
        return None

    def stop(self) -> None:
        self._running = False
        handle, self._handle = self._handle, None
        if handle is None or self.loop.is_closed():
            return
        if _on_loop_thread(self.loop):
            handle.cancel()
        else:
            try:
                self.loop.call_soon_threadsafe(handle.cancel)
            except RuntimeError:  # closed meanwhile
                pass

    def summary(self) -> dict[str, float]:
        """p50/p99/max lag in seconds, and the sample count."""
        return self.lag.summary()


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _is_user(module: str, filename: str) -> bool:
    if module.startswith(_USER_MODULES):
        return True
    if module == "__main__":
        return True
    if module.startswith(_INFRA_MODULES) or filename.startswith("<"):  # "<frozen runpy>"
        return False
    return not filename.startswith(_LIBRARY_DIRS)


@dataclass(slots=True)
class _Sample:
    at: float
    task: str | None
    coroutine: str | None
    culprit: FrameInfo | None
    unit: str | None
    stack: tuple[FrameInfo, ...]


def _where(sample: _Sample) -> tuple[str, str] | None:
    culprit = sample.culprit
    return None if culprit is None else (culprit.function, culprit.filename)


def _segments(samples: list[_Sample]) -> int:
    """Runs of consecutive samples with the same holder (task and culprit function)."""
    return 1 + sum((a.task, _where(a)) != (b.task, _where(b)) for a, b in itertools.pairwise(samples))


@dataclass(slots=True)
class _Stall:
    due: float
    samples: list[_Sample] = field(default_factory=list)
    reported: bool = False


class Watchdog:
    """Detects a blocked loop, names what held it, and proposes a new decision.

    ``units`` (``WorkUnit`` or ``UnitSpec`` objects) let it attribute a stall to a
    declared unit and re-decide it with ``traits.merged(bound="cpu", est=<measured>)``;
    an unknown culprit is re-decided from ``Traits(bound="cpu", est=<measured>)``.
    Reports go to ``reports`` (the last ``max_reports``), to ``on_stall``, to the
    ``foundry.watchdog`` logger, and count in ``foundry_loop_blocked_total``.
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
        self.blocked = self.registry.counter(
            names.LOOP_BLOCKED, "Times the event loop was blocked beyond the watchdog threshold", ("loop",)
        ).labels(name)
        self.reports: deque[StallReport] = deque(maxlen=max_reports)
        self.on_stall = on_stall
        self.log_reports = log_reports
        self._units: dict[Any, tuple[str, Traits, str]] = {}
        self.watch(*units)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.thread_cpu = 0.0

    def watch(self, *units: UnitLike) -> None:
        """Attribute stalls whose stack passes through these units' functions."""
        for unit in units:
            fn = inspect.unwrap(unit.fn)
            code = getattr(fn, "__code__", None)
            if code is not None:
                self._units[code] = (unit.name, unit.traits, fn.__name__)

    # -- lifecycle --------------------------------------------------------------

    def start(self) -> Watchdog:
        if self._thread is not None:
            return self
        self._stop.clear()
        self.monitor.start()
        self._thread = threading.Thread(target=self._watch, name=f"foundry-watchdog-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(5.0)
        self.monitor.stop()

    def __enter__(self) -> Watchdog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> Watchdog:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        self.stop()

    # -- the watching thread ----------------------------------------------------

    def _watch(self) -> None:
        stall: _Stall | None = None
        wait = self.poll
        while not self._stop.wait(wait):
            self.thread_cpu = time.thread_time()  # this thread's CPU so far: the watchdog's cost
            loop = self.loop
            if loop.is_closed():
                return
            due = self.monitor.due
            if due is None or not loop.is_running():
                stall, wait = None, self.poll
                continue
            behind = time.monotonic() - due
            if behind > self.threshold:
                sample = self._sample()
                if self.monitor.due != due:
                    continue  # it ran while we looked: not blocked any more
                if stall is None or stall.due != due:
                    if stall is not None and not stall.reported:  # the loop ran, then blocked again
                        lag = self.monitor.lag_for(stall.due)
                        self._emit(stall, lag if lag is not None else self.threshold, ongoing=False)
                    stall = _Stall(due)
                if sample is not None and len(stall.samples) < _MAX_SAMPLES:
                    stall.samples.append(sample)
                if not stall.reported and behind >= self.report_after:
                    stall.reported = True
                    self._emit(stall, behind, ongoing=True)
                # Sample often at first, then back off: a long stall costs a bounded share.
                wait = max(_STALL_POLL, min(self.poll, (behind - self.threshold) / 16))
            elif stall is not None and self.monitor.due != stall.due:
                if not stall.reported:
                    lag = self.monitor.lag_for(stall.due)
                    self._emit(stall, lag if lag is not None else behind, ongoing=False)
                stall = None
                wait = self.poll

    def _sample(self) -> _Sample | None:
        thread_id = self.monitor.thread_id
        if thread_id is None:
            return None
        frame = sys._current_frames().get(thread_id)
        task = None
        try:
            task = asyncio.current_task(self.loop)
        except RuntimeError:
            pass
        stack: list[FrameInfo] = []
        culprit: FrameInfo | None = None
        outermost: str | None = None  # the outermost frame of your code: the task's real body
        unit: str | None = None
        inside = True  # still inside the running callback/task step (not yet in the loop's frames)
        while frame is not None:
            code = frame.f_code
            module = str(frame.f_globals.get("__name__", ""))
            info = FrameInfo(code.co_name, code.co_filename, frame.f_lineno, module)
            stack.append(info)
            if (module, code.co_name) in _LOOP_FRAMES or module.startswith(("asyncio.runners", "uvloop")):
                inside = False
            if inside and _is_user(module, code.co_filename):
                outermost = code.co_qualname
                if culprit is None:
                    culprit = info
            if unit is None and code in self._units:
                unit = self._units[code][0]
            frame = frame.f_back
        del frame
        if culprit is None and stack:
            culprit = stack[0]
        coroutine = None
        task_name = None
        if task is not None:
            task_name = task.get_name()
            coro = task.get_coro()
            coroutine = outermost or getattr(coro, "__qualname__", None) or type(coro).__name__
        return _Sample(time.monotonic(), task_name, coroutine, culprit, unit, tuple(reversed(stack)))

    def _emit(self, stall: _Stall, blocked_for: float, *, ongoing: bool) -> None:
        report = self._report(stall, blocked_for, ongoing)
        self.blocked.inc()
        self.reports.append(report)
        if self.log_reports:
            log.warning("%s", report.message)
        if self.on_stall is not None:
            try:
                self.on_stall(report)
            except Exception:  # a broken callback must not stop the watchdog
                log.exception("watchdog %r: on_stall callback failed", self.name)

    def _report(self, stall: _Stall, blocked_for: float, ongoing: bool) -> StallReport:
        samples = stall.samples
        if not samples:
            return StallReport(self.name, blocked_for, blocked_for, None, None, None, None, "main", None)
        tally = Tally((_where(s), s.unit) for s in samples)
        (where, unit), _ = tally.most_common(1)[0]
        chosen = next(s for s in reversed(samples) if (_where(s), s.unit) == (where, unit))
        culprit = chosen.culprit
        segments = _segments(samples)
        held = self._held_for(samples, segments, blocked_for)
        tasks = tuple(dict.fromkeys(s.task for s in samples if s.task))
        # The holder changed at (nearly) every sample: many short steps back to back, not
        # one phase holding the loop. Reclassifying a phase would not help; fewer ready
        # units at once (or more processes) would.
        saturated = len(samples) >= 2 and len(tasks) >= 2 and segments >= 0.8 * len(samples)
        traits = Traits()
        phase = culprit.function if culprit is not None else "main"
        if unit is not None:
            _name, traits, fn_name = next(v for v in self._units.values() if v[0] == unit)
            if culprit is not None and culprit.function == fn_name:
                phase = "main"
        proposal = (
            None
            if saturated
            else decide(traits.merged(bound="cpu", est=round(held, 4), model=None), phase=phase)
        )
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
            stack=chosen.stack,
            tasks=tasks,
            samples=len(samples),
            ongoing=ongoing,
            saturated=saturated,
        )

    def _held_for(self, samples: list[_Sample], segments: int, blocked_for: float) -> float:
        """How long one holder kept the loop: the sampled span split by holder changes."""
        if segments == 1:
            return blocked_for
        span = samples[-1].at - samples[0].at
        return max(span / (segments - 1), _STALL_POLL)

    # -- reading ----------------------------------------------------------------

    def overhead(self) -> dict[str, float]:
        """What watching has cost so far: CPU seconds of the watchdog's thread, seconds the
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
