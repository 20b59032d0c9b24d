"""What the loop watchdog reports: :class:`StallReport`, one stretch of time a loop did
not run its ready callbacks, with the frame, the unit and the phase that held it and the
decision that phase should have had.

A report is a structured event: ``as_dict()`` is its JSON form (what a log pipeline or a
live reclassifier consumes), ``message`` the sentence a person reads. Reports go to every
subscriber (``Watchdog.subscribe``, ``foundry.observe.watchdog.subscribe``), so code that
acts on a stall — moving a phase off the loop at run time — needs no log parsing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from foundry.decide import Decision, Measured
from foundry.traits import Traits

__all__ = ["FrameInfo", "StallReport", "Target", "UnitLike"]


class UnitLike(Protocol):
    """A declared unit (``WorkUnit`` or ``UnitSpec``): what the watchdog attributes to.
    ``decision``, ``phases`` and ``phase_traits`` are read when present (both have them)."""

    @property
    def name(self) -> str: ...

    @property
    def fn(self) -> Callable[..., Any]: ...

    @property
    def traits(self) -> Traits: ...


@dataclass(frozen=True, slots=True)
class Target:
    """Code to attribute stalls to that is not a declared unit of its own: a workflow's
    step (``unit`` the workflow, ``phase`` the step) or a stream consumer's handler."""

    name: str
    fn: Callable[..., Any]
    traits: Traits = field(default_factory=Traits)
    phase: str | None = None
    decision: Decision | None = None
    phases: Mapping[str, Decision] = field(default_factory=dict)
    movable: bool = False
    """A phase hook (``@unit.phase``): Foundry can move it off the loop (``adaptive=True``)."""


@dataclass(frozen=True, slots=True)
class FrameInfo:
    function: str
    filename: str
    lineno: int
    module: str

    def __str__(self) -> str:
        short = self.filename.rsplit("/", 1)[-1]
        return f"{self.function} ({short}:{self.lineno})"

    def as_dict(self) -> dict[str, Any]:
        return {"function": self.function, "file": self.filename, "line": self.lineno, "module": self.module}


_IN_THE_CALLER = frozenset({"sequential", "async"})
"""Executions that run a phase in its caller: awaited on a loop, on that loop."""


def _model(decision: Decision | None) -> str | None:
    return None if decision is None else decision.model


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
    """The declared unit whose code was on the stack, when one was."""
    phase: str | None
    """``"main"`` when the unit's own body held the loop; a declared phase's name when
    a function of that name was on the stack; else the culprit function's name (a phase
    nobody declared). ``None`` when nothing was sampled."""
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
    current: Decision | None = None
    """How the unit (or its declared phase) is decided now, when the unit is known."""
    measured: Measured | None = None
    """What the watchdog measured, from which ``decision`` was re-decided."""
    movable: bool = False
    """The phase runs through a phase hook (``@unit.phase``): Foundry can move it."""
    adaptive: bool = False
    """... and its unit (or the phase) opted in: Foundry moves it once this recurs."""
    at: float = field(default_factory=time.time)

    @property
    def subject(self) -> str | None:
        """What to reclassify: ``"unit"`` for its body, ``"unit.phase"`` for a phase,
        the function's name for code outside any declared unit."""
        if self.unit is None:
            return self.phase
        if self.phase in (None, "main"):
            return self.unit
        return f"{self.unit}.{self.phase}"

    @property
    def message(self) -> str:
        still = " and is still blocked" if self.ongoing else ""
        head = f"loop {self.loop!r} blocked ≥ {self.blocked_for * 1e3:.0f} ms{still}"
        if self.saturated:
            return (
                f"{head}: {len(self.tasks)} tasks ran back to back, none for long (≈ "
                f"{self.held_for * 1e3:.0f} ms each; last seen {self.culprit or '?'}): the loop is "
                "saturated, not held by one compute-bound phase. Fix: fewer units ready at once (a "
                "lower concurrency= or permits), or spread the load over more processes"
            )
        if self.samples == 0:
            return (
                f"{head}: nothing was sampled while it was held (a C call that keeps the GIL "
                "throughout, or a hold that ended before the watchdog looked)"
            )
        who = f"task {self.task!r}" if self.task else "a callback (no task)"
        if self.coroutine:
            who += f" ({self.coroutine})"
        if self.unit is not None:
            who = f"unit {self.unit!r}, {who},"
        where = f" in {self.culprit}" if self.culprit else ""
        text = f"{head}: {who} held it{where} ≈ {self.held_for * 1e3:.0f} ms at a time."
        if self.decision is None:
            return text
        if self.unit is None:
            what = "This phase is"
        elif self.phase in (None, "main"):
            what = f"The body of unit {self.unit!r} is"
        else:
            what = f"Phase {self.phase!r} of unit {self.unit!r} is"
        now = f" (now {self.current.model})" if self.current is not None else ""
        text = (
            f"{text} {what} compute-bound: reclassify {self.subject!r} — "
            f'decide(bound="cpu", est="{self.held_for * 1e3:.0f}ms") → {self.decision.model}{now}'
        )
        if self.decision.execution in _IN_THE_CALLER:
            # decide keeps it in the caller -- which, for code awaited on a loop, is the loop
            # it just held: say why, and what would move it.
            load = self.decision.load
            if load.cores == 1 and not load.cores_assumed:
                fix = "this machine has one core: run it in a worker on another host (durable=True)"
            else:
                fix = "declare concurrency= (or rate= with est=) so the load sizes a pool off the loop"
            text += f", which still runs it in the caller, on this loop. Fix: {fix}"
        elif self.unit is not None and self.phase not in (None, "main"):
            text += f". {self._moving()}"
        return text

    def _moving(self) -> str:
        """What moves the phase off the loop: Foundry (adaptive), or a declaration."""
        current = self.current
        if self.movable and current is not None and current.execution not in _IN_THE_CALLER:
            return (
                f"It runs on {current.model} now: a call that started inline before the move "
                "finished on the loop"
            )
        if self.movable and self.adaptive:
            return (
                f"adaptive=True: Foundry moves it to {self.decision.model if self.decision else 'a pool'} "
                "if this recurs"
            )
        if self.movable:
            return "Declare adaptive=True to move it automatically"
        hook = f'Run it through @{self.unit}.phase("{self.phase}") (awaited)'
        if self.adaptive:
            return f"{hook}: the unit is adaptive=True, so Foundry then moves it"
        return f"{hook} and declare adaptive=True to move it automatically"

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data: the event a reclassifier or a log pipeline reads."""
        decision = self.decision
        return {
            "loop": self.loop,
            "unit": self.unit,
            "phase": self.phase,
            "subject": self.subject,
            "lag": self.blocked_for,
            "held_for": self.held_for,
            "frame": None if self.culprit is None else self.culprit.as_dict(),
            "task": self.task,
            "coroutine": self.coroutine,
            "tasks": list(self.tasks),
            "current": _model(self.current),
            "decision": None
            if decision is None
            else {
                "model": decision.model,
                "delivery": decision.delivery,
                "execution": decision.execution,
                "phase": decision.phase,
            },
            "samples": self.samples,
            "ongoing": self.ongoing,
            "saturated": self.saturated,
            "movable": self.movable,
            "adaptive": self.adaptive,
            "at": self.at,
            "message": self.message,
        }

    def __str__(self) -> str:
        return self.message
