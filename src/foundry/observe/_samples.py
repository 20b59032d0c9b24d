"""Samples of a loop thread's stack: which frame of your code, which task and which
declared unit held the loop. Frames are classified once per code object; a sample keeps
the raw stack and builds ``FrameInfo`` objects only for what is reported."""

from __future__ import annotations

import asyncio
import itertools
import sys
import sysconfig
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

from foundry.decide import Decision
from foundry.observe.stall import FrameInfo
from foundry.traits import Traits

__all__ = [
    "INFRA_MODULES",
    "STALL_POLL",
    "Entry",
    "Sample",
    "frame_info",
    "held_for",
    "saturated",
    "segments",
    "take_sample",
    "unit_of",
    "where",
]

STALL_POLL = 0.004  # seconds between samples while the loop is blocked

INFRA_MODULES = (
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


def is_user(module: str, filename: str) -> bool:
    if module.startswith(_USER_MODULES):
        return True
    if module == "__main__":
        return True
    if module.startswith(INFRA_MODULES) or filename.startswith("<"):  # "<frozen runpy>"
        return False
    return not filename.startswith(_LIBRARY_DIRS)


# code object -> (module, is your code, is the loop's own machinery): the same for every
# frame of that code, so a sample classifies a frame with one dictionary look-up.
_CODES: dict[CodeType, tuple[str, bool, bool]] = {}
_MAX_CODES = 50_000


def _classify(code: CodeType, f_globals: Mapping[str, Any]) -> tuple[str, bool, bool]:
    module = str(f_globals.get("__name__", ""))
    machinery = (module, code.co_name) in _LOOP_FRAMES or module.startswith(("asyncio.runners", "uvloop"))
    kind = (module, is_user(module, code.co_filename), machinery)
    if len(_CODES) >= _MAX_CODES:
        _CODES.clear()
    _CODES[code] = kind
    return kind


def frame_info(code: CodeType, line: int) -> FrameInfo:
    kind = _CODES.get(code)
    return FrameInfo(code.co_name, code.co_filename, line, kind[0] if kind is not None else "")


@dataclass(frozen=True, slots=True)
class Entry:
    """What the watchdog knows about one watched function."""

    unit: str
    phase: str | None  # set for a Target that is itself a phase (a workflow step, a phase hook)
    traits: Traits  # the phase's own traits for a phase Target, else the unit's
    fn_name: str
    decision: Decision | None
    phases: Mapping[str, Decision]
    phase_traits: Mapping[str, Traits] = field(default_factory=dict)  # a declared phase's own
    movable: bool = False  # a phase hook (``@unit.phase``): Foundry can move it off the loop


@dataclass(slots=True)
class Sample:
    at: float
    task: str | None
    coroutine: str | None
    culprit: FrameInfo | None
    entry: Entry | None  # the innermost watched function on the stack
    in_body: bool  # the culprit frame *is* that function (its own body held the loop)
    declared: str | None  # a declared phase of that unit whose function is on the stack
    raw: tuple[tuple[CodeType, int], ...]  # the stack, innermost first: (code, line)
    idle: bool = False  # the loop was in its own machinery (polling), not running a callback


def where(sample: Sample) -> tuple[str, str] | None:
    culprit = sample.culprit
    return None if culprit is None else (culprit.function, culprit.filename)


def unit_of(sample: Sample) -> str | None:
    return None if sample.entry is None else sample.entry.unit


def segments(samples: list[Sample]) -> int:
    """Runs of consecutive samples with the same holder (task and culprit function)."""
    return 1 + sum((a.task, where(a)) != (b.task, where(b)) for a, b in itertools.pairwise(samples))


def saturated(samples: list[Sample], least: int) -> bool:
    """The holder changed at (nearly) every one of at least ``least`` samples, between
    two tasks or more: the loop runs many short steps, no one phase holds it."""
    if len(samples) < least:
        return False
    tasks = {s.task for s in samples if s.task}
    return len(tasks) >= 2 and segments(samples) >= 0.8 * len(samples)


def held_for(mine: list[Sample], samples: list[Sample], blocked_for: float) -> float:
    """How long the culprit kept the loop at a time: ``mine`` are its samples among all
    of the stall's; its span split by the changes of task within it (six tasks signing
    35 ms each, back to back, are one 210 ms stall held ≈ 35 ms at a time)."""
    runs = segments(mine)
    if runs == 1:
        if len(samples) - len(mine) <= 2:  # all of it, but for a sample at either edge
            return blocked_for
        return max(mine[-1].at - mine[0].at, STALL_POLL)
    return max((mine[-1].at - mine[0].at) / (runs - 1), STALL_POLL)


def take_sample(
    thread_id: int | None, loop: asyncio.AbstractEventLoop, entries: Mapping[CodeType, Entry]
) -> Sample | None:
    """One look at the loop thread's stack and current task; ``None`` before the loop
    thread is known."""
    if thread_id is None:
        return None
    frame = sys._current_frames().get(thread_id)
    task = None
    try:
        task = asyncio.current_task(loop)
    except RuntimeError:
        pass
    raw: list[tuple[CodeType, int]] = []  # innermost first; FrameInfo only for a reported one
    culprit: tuple[CodeType, int] | None = None
    outermost: str | None = None  # the outermost frame of your code: the task's real body
    entry: Entry | None = None
    in_body = False
    declared: str | None = None
    passed: list[str] = []  # functions between the culprit and the watched one
    looking = bool(entries)  # for the innermost watched function on the stack
    inside = True  # still inside the running callback/task step (not yet in the loop's frames)
    innermost = ""  # the module of the innermost frame
    while frame is not None:
        code = frame.f_code
        kind = _CODES.get(code)
        if kind is None:
            kind = _classify(code, frame.f_globals)
        if not raw:
            innermost = kind[0]
        raw.append((code, frame.f_lineno))
        if kind[2]:
            inside = False
        if inside and kind[1]:
            outermost = code.co_qualname
            if culprit is None:
                culprit = raw[-1]
        if looking:
            entry = entries.get(code)
            if entry is not None:
                looking = False
                in_body = culprit is not None and code is culprit[0]
                declared = next((name for name in passed if name in entry.phases), None)
            else:
                passed.append(code.co_name)
        frame = frame.f_back
    del frame
    if culprit is None and task is None and raw and innermost.startswith(INFRA_MODULES):
        # Only the loop's machinery on the stack: it is between callbacks, polling (uvloop
        # polls on a stale clock for up to a tick after a long callback; a process short
        # of CPU runs its timers late) — the loop is not held by anyone.
        return Sample(time.monotonic(), None, None, None, None, False, None, (), idle=True)
    if culprit is None and raw:
        culprit = raw[0]
    coroutine = None
    task_name = None
    if task is not None:
        task_name = task.get_name()
        coro = task.get_coro()
        coroutine = outermost or getattr(coro, "__qualname__", None) or type(coro).__name__
    return Sample(
        time.monotonic(),
        task_name,
        coroutine,
        None if culprit is None else frame_info(*culprit),
        entry,
        in_body,
        declared,
        tuple(raw),
    )
