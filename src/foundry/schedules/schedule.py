"""A unit's schedule: when its ticks are, and which of them run after a gap.

``@app.work(schedule=..., tz=..., missed=..., catch_up=...)`` builds a :class:`Schedule`
at declaration time, where every bad value raises a
:class:`~foundry.errors.DeclarationError` naming the unit, the field, the value and the
fix. Two spellings:

* ``schedule="*/5 * * * *"`` — a cron expression (:mod:`foundry.schedules.cron`), in
  ``tz`` (an IANA zone, default ``"UTC"``);
* ``schedule="every 30s"`` — a fixed interval of whole seconds (at least 1 s): ticks at
  every multiple of the interval since the Unix epoch, so every process agrees on them
  (``every 1h`` ticks on the hour in UTC; ``every 1d`` at 00:00 UTC). An interval is
  elapsed time: it takes no ``tz``.

**Late and missed ticks.** A tick that comes due while a scheduler runs is *late*, not
missed, for :data:`ON_TIME` seconds: the scheduler enqueues it when it looks (a stall, a
slow store, or the death of another ``foundry run`` loses nothing). A tick that came due
before the scheduler started (every ``foundry run`` was down), or longer ago than that
(the store was unreachable), and that no scheduler had enqueued, is *missed*; the unit's
``missed=`` policy says what happens to missed ticks:

* ``missed="skip"`` (default): missed ticks do not run — except that when no tick is on
  time, the **most recent missed tick runs once**, so after downtime the job runs once,
  as soon as a scheduler is back (Celery beat's behaviour; APScheduler calls it
  coalescing);
* ``missed="catch_up"`` (``catch_up=N``, default 10, at most 1000): the ``N`` most recent
  missed ticks run, oldest first; older ones are skipped. ``catch_up=N`` alone implies it.

A schedule declared for the first time has missed nothing: its first tick is the first
one after a scheduler first saw it. Nothing here does I/O or reads the clock.
"""

from __future__ import annotations

import datetime as dt
import inspect
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from foundry.errors import DeclarationError
from foundry.schedules.cron import Cron
from foundry.traits import parse_duration

__all__ = [
    "FIELDS",
    "MAX_CATCH_UP",
    "ON_TIME",
    "Due",
    "Schedule",
    "split_schedule",
]

ON_TIME = 60.0  # seconds a tick stays late rather than missed
MAX_CATCH_UP = 1000
DEFAULT_CATCH_UP = 10
COUNT_CAP = 10_000  # missed ticks counted one by one at most (the count says "more" beyond)
FIELDS = ("schedule", "tz", "missed", "catch_up")
_EVERY_FIX = 'write e.g. schedule="every 30s", "every 5m" or "every 1h" (whole seconds, at least 1s)'


@dataclass(frozen=True, slots=True)
class Due:
    """What a scheduler does at one look: the ticks to enqueue now (oldest first) and
    how many missed ticks the policy skips (``more``: at least that many)."""

    run: tuple[float, ...]
    skipped: int = 0
    more: bool = False


class Schedule:
    """When a unit's ticks are, and the missed-tick policy (see the module docstring)."""

    def __init__(
        self,
        unit: str,
        schedule: str,
        *,
        tz: str | None = None,
        missed: str | None = None,
        catch_up: int | None = None,
    ) -> None:
        self.unit = unit
        if not isinstance(schedule, str) or not schedule.strip():
            raise DeclarationError(
                unit,
                "schedule",
                schedule,
                "is not a schedule",
                'write a cron expression, e.g. schedule="*/5 * * * *", or an interval, "every 30s"',
            )
        self.expression = " ".join(schedule.split())
        self.period: float | None = None
        self.cron: Cron | None = None
        words = self.expression.split(" ", 1)
        if words[0].lower() == "every":
            if tz is not None:
                raise DeclarationError(
                    unit,
                    "tz",
                    tz,
                    f"was given with the interval schedule={schedule!r}; an interval is elapsed time and "
                    "has no time zone",
                    'drop tz=, or use a cron expression for wall-clock times (e.g. "0 0 * * *" with tz=)',
                )
            self.tz = "UTC"
            self.zone = ZoneInfo("UTC")
            self.period = _period(unit, schedule, words[1] if len(words) > 1 else "")
        else:
            self.tz, self.zone = _zone(unit, "UTC" if tz is None else tz)
            self.cron = Cron.parse(schedule, self.zone, unit=unit, field="schedule")
        self.missed, self.catch_up = _policy(unit, missed, catch_up)

    # -- ticks -------------------------------------------------------------------------

    def next_after(self, t: float) -> float:
        """The first tick strictly after unix time ``t``."""
        if self.period is not None:
            return (math.floor(t / self.period) + 1) * self.period
        assert self.cron is not None
        return self.cron.next_after(t)

    def ticks(self, after: float, upto: float, limit: int) -> list[float]:
        """The ticks in ``(after, upto]``, oldest first, at most ``limit`` (the first ones)."""
        return list(itertools.islice(self._iter(after, upto), limit))

    def _iter(self, after: float, upto: float) -> Iterator[float]:
        t = self.next_after(after)
        while t <= upto:
            yield t
            t = self.next_after(t)

    def _count(self, after: float, upto: float) -> tuple[int, bool]:
        """How many ticks are in ``(after, upto]`` (``True``: at least that many)."""
        if upto <= after:
            return 0, False
        if self.period is not None:
            first = math.floor(after / self.period) + 1
            return max(0, math.floor(upto / self.period) - first + 1), False
        n = len(self.ticks(after, upto, COUNT_CAP + 1))
        return min(n, COUNT_CAP), n > COUNT_CAP

    def _latest(self, after: float, upto: float, n: int) -> list[float]:
        """The ``n`` most recent ticks in ``(after, upto]``, oldest first."""
        if upto <= after or n <= 0:
            return []
        if self.period is not None:
            last = math.floor(upto / self.period)
            first = max(math.floor(after / self.period) + 1, last - n + 1)
            return [k * self.period for k in range(first, last + 1)]
        # Look back over a window a little longer than n gaps between ticks, and widen it
        # until it holds n ticks or reaches ``after``.
        gap = max(60.0, self.next_after(upto) - upto)
        window = gap * (n + 1)
        while True:
            start = max(after, upto - window)
            found = deque(self._iter(start, upto), maxlen=n)
            if len(found) >= n or start <= after:
                return list(found)
            window *= 4

    def due(self, last: float, now: float, since: float) -> Due:
        """What a scheduler enqueues at ``now``: every tick up to ``last`` is settled
        (enqueued, or before the schedule was first seen), and ``since`` is when this
        scheduler last looked (or started). A tick after ``since`` and at most
        :data:`ON_TIME` old is on time; the older unsettled ones are missed, and the
        policy keeps some of them (the module docstring)."""
        if self.next_after(last) > now:
            return Due(())
        edge = max(last, since, now - ON_TIME)  # ticks after edge are on time
        on_time = self.ticks(edge, now, int(ON_TIME) + 2)
        missed, more = self._count(last, edge)
        keep = self.catch_up if self.missed == "catch_up" else (0 if on_time else 1)
        kept = self._latest(last, edge, min(keep, missed))
        return Due((*kept, *on_time), missed - len(kept), more)

    # -- naming ------------------------------------------------------------------------

    def at(self, tick: float) -> dt.datetime:
        """The tick as an aware datetime in the schedule's zone."""
        return dt.datetime.fromtimestamp(tick, self.zone)

    @staticmethod
    def stamp(tick: float) -> str:
        """The tick in UTC, ISO 8601 to the second: ``2025-01-31T09:05:00Z`` (job keys)."""
        return dt.datetime.fromtimestamp(tick, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def key(self, tick: float) -> str:
        """The idempotency key of the tick's job (the queue prefixes the unit name)."""
        return f"schedule:{self.stamp(tick)}"

    @property
    def policy(self) -> str:
        return f"catch_up={self.catch_up}" if self.missed == "catch_up" else "skip"

    def describe(self) -> str:
        """``*/5 * * * * (Europe/Berlin)`` or ``every 30s``."""
        return self.expression if self.period is not None else f"{self.expression} ({self.tz})"

    def __repr__(self) -> str:
        return f"<Schedule {self.unit} {self.describe()} missed={self.policy}>"


def _period(unit: str, schedule: str, text: str) -> float:
    if not text.strip():
        raise DeclarationError(unit, "schedule", schedule, "names no interval after 'every'", _EVERY_FIX)
    try:
        seconds = parse_duration(text, unit=unit, field_name="schedule")
    except DeclarationError as exc:
        raise DeclarationError(
            unit, "schedule", schedule, f"names an interval {text.strip()!r} that {exc.problem}", _EVERY_FIX
        ) from exc
    if seconds < 1 or seconds != int(seconds):
        raise DeclarationError(
            unit,
            "schedule",
            schedule,
            f"is an interval of {seconds:g} seconds; intervals are whole seconds, at least 1",
            _EVERY_FIX,
        )
    return float(seconds)


def _zone(unit: str, tz: object) -> tuple[str, ZoneInfo]:
    fix = 'name an IANA time zone, e.g. tz="Europe/Berlin" or "UTC" (on Windows: pip install tzdata)'
    if not isinstance(tz, str) or not tz:
        raise DeclarationError(unit, "tz", tz, "is not a time zone name", fix)
    try:
        return tz, ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise DeclarationError(unit, "tz", tz, f"is not a time zone ({exc})", fix) from exc


def _policy(unit: str, missed: str | None, catch_up: int | None) -> tuple[str, int]:
    if missed is not None and missed not in ("skip", "catch_up"):
        raise DeclarationError(
            unit,
            "missed",
            missed,
            "is not a missed-tick policy",
            'use missed="skip" (after downtime the latest missed tick runs once) or missed="catch_up" '
            "with catch_up=N (the N most recent missed ticks run)",
        )
    if catch_up is None:
        return (missed or "skip", DEFAULT_CATCH_UP if missed == "catch_up" else 1)
    if missed == "skip":
        raise DeclarationError(
            unit,
            "catch_up",
            catch_up,
            'was given with missed="skip", which runs at most the latest missed tick',
            'drop catch_up=, or write missed="catch_up"',
        )
    if isinstance(catch_up, bool) or not isinstance(catch_up, int) or not 1 <= catch_up <= MAX_CATCH_UP:
        raise DeclarationError(
            unit,
            "catch_up",
            catch_up,
            f"is not a whole number from 1 to {MAX_CATCH_UP}",
            f"give the most missed ticks to run after downtime, e.g. catch_up=10 (at most {MAX_CATCH_UP})",
        )
    return "catch_up", catch_up


def split_schedule(unit: str, options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(schedule options, the rest)`` of ``@app.work``'s keywords; ``tz``, ``missed`` or
    ``catch_up`` without ``schedule`` is an error."""
    mine = {k: v for k, v in options.items() if k in FIELDS}
    rest = {k: v for k, v in options.items() if k not in FIELDS}
    if mine and mine.get("schedule") is None:
        name = next(iter(mine))
        if any(v is not None for v in mine.values()):
            raise DeclarationError(
                unit,
                name,
                mine[name],
                "was given without schedule=",
                'add schedule="*/5 * * * *" (cron) or schedule="every 30s", or drop it',
            )
        return {}, rest
    return mine, rest


def takes_tick(unit: str, fn: Callable[..., Any], schedule: str) -> bool:
    """Whether a scheduled unit's function takes ``scheduled_at=`` (the tick's time);
    one that requires any other argument cannot be called by a schedule."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read (a builtin): call it bare
        return False
    needed = [
        p.name
        for p in params
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        and p.name != "scheduled_at"
    ]
    if needed:
        raise DeclarationError(
            unit,
            "schedule",
            schedule,
            f"calls the unit with no arguments, and it requires {', '.join(map(repr, needed))}",
            "give those parameters defaults; a scheduled unit may take scheduled_at= (the tick's time, "
            "ISO 8601 in the schedule's zone) and nothing else that is required",
        )
    return any(
        (p.name == "scheduled_at" and p.kind is not inspect.Parameter.POSITIONAL_ONLY)
        or p.kind is inspect.Parameter.VAR_KEYWORD
        for p in params
    )
