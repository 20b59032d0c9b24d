"""Live reclassification: moving a phase off the event loop while the process runs.

The loop watchdog (:mod:`foundry.observe.watchdog`) already finds the phase that holds a
loop and re-decides it from what it measured (``reclassify(traits, Measured(bound="cpu",
est=held_for))``). :class:`PhaseMover` acts on those reports for the phases marked with
``@unit.phase`` (:class:`~foundry.execute.phase.Phase`), one mover per app:

1. **Attribution.** Each hook's function is registered with every watchdog in the
   process (``foundry.observe.watchdog.attribute``): a stall in it is that phase's,
   reported with the phase's own traits and decision, whatever the function is called.
2. **The rule.** A report moves a phase when it names the phase and its function is on
   the sampled stack; the loop was held by that phase, not merely saturated by many short
   steps; the re-decided model runs it on a pool (``threads``, ``bounded_pool``,
   ``processes`` — not in the caller, which is the loop it held); the phase still runs
   inline; the unit or the phase declared ``adaptive=True``; and it happened
   :data:`MOVE_AFTER` times within :data:`MOVE_WITHIN` seconds (one stall is an accident —
   a cold cache, a GC pause —, three in ten seconds is the phase). A phase that did not
   opt in is left where it is: the report itself says "declare adaptive=True".
3. **The move.** On the mover's thread, the new runner is made and started
   (``Phase.prepare``: a process pool's first child has answered) before one assignment
   swaps it in (``Phase.swap``): calls already running inline finish on the loop, every
   later call goes to the pool. Pure-Python computing under the GIL goes to processes
   (the decision says so); when a child process cannot import the function (a closure, a
   lambda, ``python -c``) or process workers do not start, it goes to a bounded thread
   pool instead, and the log says what that costs (the GIL is still shared with the
   loop, but handed back every switch interval instead of held for the whole step).
   ``unit.phases[phase]`` and the watchdog's entry take the new decision (``app.plan()``,
   ``explain``, the dashboard); one WARNING is logged::

       reclassified 'handle_payment.sign': direct/async → direct/processes (loop watchdog,
       held ≈ 35 ms ×3): moved off the loop

   and ``foundry_phase_moved_total{unit, phase, from, to}`` counts it. Nothing is moved
   back (the decision was measured; a regression would be a new measurement).
4. **The other way.** A phase running on process workers whose children measure little
   CPU per call (CPU/wall ≤ :data:`WAITING` over :data:`DRIFT_CALLS` calls: it waits, and
   holds a process while it does) is re-decided from that (``Measured(bound="io")``); the
   drift is logged once with the new decision and counted in
   ``foundry_phase_drift_total{unit, phase, to}``, and ``phase.drift`` holds it. It is
   not moved back: a plain function that waits would block the loop it was moved onto.

Threads: the watchdog's callback only puts the report in a queue (it runs on the watching
thread); one mover thread per app acts, started by the first report about one of its
phases or the first pool a phase starts (so declaring units in a child process starts
nothing), and stopped by ``app.close()``, which also closes the phases' pools and ends
automatic moves for that app.
"""

from __future__ import annotations

import inspect
import logging
import queue
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from foundry.decide import Decision, Host, Measured, reclassify
from foundry.decide.fmt import fmt_seconds
from foundry.execute.phase import POOLS, Phase
from foundry.observe import names
from foundry.observe.metrics import Registry
from foundry.observe.stall import StallReport, Target
from foundry.observe.watchdog import attribute, subscribe

__all__ = ["DRIFT_CALLS", "MOVE_AFTER", "MOVE_WITHIN", "WAITING", "Move", "PhaseMover"]

log = logging.getLogger("foundry.adaptive")

MOVE_AFTER = 3  # reports about one phase ...
MOVE_WITHIN = 10.0  # ... within this many seconds move it
DRIFT_CALLS = 20  # calls a process pool answers before its CPU/wall is judged
WAITING = 0.2  # CPU/wall at or below this is waiting-bound (what `foundry profile` uses)
CHECK_EVERY = 1.0  # seconds between the mover's looks at its pools' measurements
_MOVED_HELP = "Phases moved off an event loop at run time, by the decision they had and got"
_DRIFT_HELP = "Phases on process workers measured waiting-bound, by the decision proposed"

_GIL_CAVEAT = (
    "; on a bounded thread pool, not processes: {why}. Under the GIL its computing still "
    "shares the interpreter with the loop, which now gets it back every switch interval "
    "(5 ms) instead of after the whole step. Fix: define the function at the top level of "
    "an importable module so process workers can run it"
)


@dataclass(frozen=True, slots=True)
class Move:
    """One phase moved: what it was, what it became, and the evidence."""

    subject: str
    before: Decision
    after: Decision
    reports: int
    held_for: float  # the median of the reports' held_for
    at: float = field(default_factory=time.time)
    caveat: str = ""

    def __repr__(self) -> str:
        return f"<Move {self.subject}: {self.before.model} → {self.after.model}, {self.reports} reports>"


State = Literal["inline", "moving", "moved", "failed"]


@dataclass(eq=False, slots=True)
class _Watched:
    phase: Phase
    seen: deque[tuple[float, float]] = field(default_factory=deque)  # (report.at, held_for)
    state: State = "inline"
    runner_id: int = 0  # the runner its baseline below belongs to
    baseline: tuple[int, float, float] = (0, 0.0, 0.0)  # (calls, wall, cpu) at the window's start
    drifted: bool = False


class PhaseMover:
    """Moves ``adaptive`` phases off the loop when the watchdog keeps finding them there
    (see the module docstring)."""

    def __init__(
        self,
        registry: Registry,
        *,
        host: Host | None = None,
        move_after: int = MOVE_AFTER,
        within: float = MOVE_WITHIN,
    ) -> None:
        self.host = host
        self.move_after = move_after
        self.within = within
        self.moved: list[Move] = []
        self._phases: dict[tuple[str, str], _Watched] = {}
        self._lock = threading.Lock()
        self._inbox: queue.SimpleQueue[StallReport | threading.Event | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._closed = False
        self._moves = registry.counter(names.PHASE_MOVED, _MOVED_HELP, ("unit", "phase", "from", "to"))
        self._drifts = registry.counter(names.PHASE_DRIFT, _DRIFT_HELP, ("unit", "phase", "to"))

    def add(self, phase: Phase) -> None:
        """Attribute ``phase``'s stalls to it and watch it."""
        with self._lock:
            self._phases[(phase.unit, phase.name)] = _Watched(phase)
            if self._unsubscribe is None and not self._closed:
                self._unsubscribe = subscribe(self.receive)
        self._attribute(phase)
        phase.on_runner = self._on_pool

    def _attribute(self, phase: Phase) -> None:
        attribute(
            Target(
                phase.unit, phase.fn, phase.traits, phase=phase.name, decision=phase.decision, movable=True
            )
        )

    # -- on other threads: only hand over ------------------------------------------------

    def receive(self, report: StallReport) -> None:
        """Hand a report over (the watchdog subscription calls it, on the watching thread:
        it only filters and enqueues; the mover's thread acts)."""
        if report.saturated or report.unit is None or report.phase is None:
            return
        if (report.unit, report.phase) in self._phases:
            self._inbox.put(report)
            self._ensure_thread()

    def _on_pool(self, phase: Phase) -> None:
        """A phase started a pool: its measurements are worth a look."""
        self._ensure_thread()

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(target=self._run, name="foundry-phase-mover", daemon=True)
            self._thread.start()

    # -- the mover's thread ---------------------------------------------------------------

    def _run(self) -> None:
        next_check = time.monotonic() + CHECK_EVERY
        while True:
            try:
                report = self._inbox.get(timeout=max(0.0, next_check - time.monotonic()))
            except queue.Empty:
                report = None
            else:
                if report is None:
                    return
                if isinstance(report, threading.Event):  # sync(): everything before it is done
                    report.set()
                    continue
            try:
                if report is not None:
                    self._consider(report)
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + CHECK_EVERY
                    self._check_drift()
            except Exception:  # a bug here must not end adaptivity for the whole app
                log.exception("the phase mover failed on %s", report)

    def _consider(self, report: StallReport) -> None:
        watched = self._phases.get((report.unit or "", report.phase or ""))
        if watched is None or watched.state != "inline":
            return
        phase = watched.phase
        decision = report.decision
        if not phase.adaptive or not phase.inline or decision is None or decision.execution not in POOLS:
            return
        code = getattr(inspect.unwrap(phase.fn), "__code__", None)
        if code is not None and not any(
            f.function == code.co_name and f.filename == code.co_filename for f in report.stack
        ):
            return  # another app's phase of the same names
        watched.seen.append((report.at, report.held_for))
        while watched.seen and watched.seen[0][0] < report.at - self.within:
            watched.seen.popleft()
        if len(watched.seen) >= self.move_after:
            watched.state = "moving"
            self._move(watched, report, decision)

    def _move(self, watched: _Watched, report: StallReport, decision: Decision) -> None:
        phase = watched.phase
        measured = report.measured or Measured(est=report.held_for, bound="cpu", source="loop watchdog")
        caveat = ""
        why = self._unrunnable(phase, decision)
        if why is not None:
            decision, caveat = self._threads(phase, measured), _GIL_CAVEAT.format(why=why)
        try:
            runner = phase.prepare(decision)
        except Exception as exc:
            if decision.execution != "processes":
                return self._failed(watched, decision, exc)
            decision = self._threads(phase, measured)
            caveat = _GIL_CAVEAT.format(why=f"its process workers did not start ({exc})")
            try:
                runner = phase.prepare(decision)
            except Exception as again:
                return self._failed(watched, decision, again)
        with self._lock:
            if self._closed:  # the app closed while the pool was starting
                runner.close(1.0)
                return None
        before = phase.swap(runner, decision)
        self._attribute(phase)
        watched.state = "moved"
        held = statistics.median(h for _, h in watched.seen)
        move = Move(phase.subject, before, decision, len(watched.seen), held, caveat=caveat)
        self.moved.append(move)
        self._moves.labels(phase.unit, phase.name, before.model, decision.model).inc()
        log.warning(
            "reclassified %r: %s → %s (%s, held ≈ %.0f ms ×%d): moved off the loop%s",
            phase.subject,
            before.model,
            decision.model,
            measured.source,
            held * 1e3,
            len(watched.seen),
            caveat,
        )
        return None

    def _unrunnable(self, phase: Phase, decision: Decision) -> str | None:
        """Why process workers cannot run this phase's function (``None`` when they can)."""
        if decision.execution != "processes":
            return None
        from foundry.execute.processes import importability_error

        error = importability_error(replace(phase.spec, decision=decision))
        return None if error is None else "a child process cannot import its function"

    def _threads(self, phase: Phase, measured: Measured) -> Decision:
        """The measured decision, on a bounded thread pool (its GIL warning included)."""
        traits = replace(phase.traits, model="direct/bounded_pool")
        return reclassify(traits, measured, phase=phase.name, host=self.host, keep_override=True)

    def _failed(self, watched: _Watched, decision: Decision, exc: BaseException) -> None:
        watched.state = "failed"
        log.error(
            "could not move %r to %s (%s: %s): it stays inline, on the loop. Fix: declare the phase's "
            "traits so it starts off the loop (phases={%r: {'bound': 'cpu', ...}})",
            watched.phase.subject,
            decision.model,
            type(exc).__name__,
            exc,
            watched.phase.name,
        )

    def _check_drift(self) -> None:
        """Phases on process workers that measure waiting-bound: log once, re-decided."""
        for watched in list(self._phases.values()):
            phase = watched.phase
            runner = phase.runner
            measured = getattr(runner, "measured", None)
            if measured is None or watched.drifted:
                continue
            calls, wall, cpu = measured()
            if id(runner) != watched.runner_id:  # a new pool: it measured from its start
                watched.runner_id, watched.baseline = id(runner), (0, 0.0, 0.0)
            c0, w0, u0 = watched.baseline
            n, spent, used = calls - c0, wall - w0, cpu - u0
            if n < DRIFT_CALLS:
                continue
            watched.baseline = (calls, wall, cpu)
            ratio = used / spent if spent > 0 else 1.0
            if ratio > WAITING:
                continue
            est = spent / n
            proposal = reclassify(
                phase.traits,
                Measured(est=round(est, 4), bound="io", source="process pool"),
                phase=phase.name,
                host=self.host,
            )
            phase.drift = proposal
            watched.drifted = True
            self._drifts.labels(phase.unit, phase.name, proposal.model).inc()
            log.warning(
                "drift %r: it runs on %s, but its last %d calls measured CPU/wall %.2f (waiting-bound): "
                'decide(bound="io", est="%s") → %s. Not moved back: a plain function that waits would '
                "block the loop. Fix: make it `async def` on an async client and await it in the unit, "
                'or declare bound="io" so the next deploy decides it',
                phase.subject,
                phase.decision.model,
                n,
                ratio,
                fmt_seconds(est),
                proposal.model,
            )

    @property
    def running(self) -> bool:
        """Its thread is running (started by the first report or pool, ended by ``close``)."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def sync(self, timeout: float = 10.0) -> bool:
        """Wait until every report handed over so far has been acted on (``False`` when
        that took longer than ``timeout``, or the mover is closed)."""
        self._ensure_thread()
        with self._lock:
            if self._thread is None:
                return False
        done = threading.Event()
        self._inbox.put(done)
        return done.wait(timeout)

    # -- closing ----------------------------------------------------------------------------

    def close(self, timeout: float = 10.0) -> None:
        """Stop moving (this app's phases stay where they are) and close the phases' pools."""
        with self._lock:
            self._closed = True
            thread, self._thread = self._thread, None
            unsubscribe, self._unsubscribe = self._unsubscribe, None
            phases = [w.phase for w in self._phases.values()]
        if unsubscribe is not None:
            unsubscribe()
        if thread is not None:
            self._inbox.put(None)
            thread.join(timeout)
        for phase in phases:
            phase.close(timeout)
