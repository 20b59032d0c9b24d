"""Cron expressions: five fields, parsed once, stepped in a time zone.

::

    ┌──────── minute    0-59
    │ ┌────── hour      0-23
    │ │ ┌──── day       1-31
    │ │ │ ┌── month     1-12 or JAN-DEC
    │ │ │ │ ┌ weekday   0-7 or SUN-SAT (0 and 7 are Sunday)
    * * * * *

A field is ``*``, a value (``5``, ``MON``), a range (``1-5``, ``MON-FRI``), a step
(``*/15``, ``0-30/10``, or ``5/15``: from 5 to the end of the range), or a comma list of
those (``0,30``, ``MON,WED-FRI``). Names are case-insensitive. ``@yearly``
(``@annually``), ``@monthly``, ``@weekly``, ``@daily`` (``@midnight``) and ``@hourly``
stand for their usual expressions. When both *day* and *weekday* are restricted (neither
starts with ``*``), a date matches when either does — cron's own rule: ``0 0 1 * MON``
is the first of the month *and* every Monday.

**Time zones.** The fields are wall-clock time in the schedule's zone (a
:class:`zoneinfo.ZoneInfo`). Where a daylight-saving change makes that ambiguous:

* a wall-clock time that happens twice (clocks go back) fires **once**, at its first
  occurrence — ``30 2 * * *`` runs once on the night the clocks go back, not twice;
  and a schedule with ``*`` in its hour field therefore pauses for the repeated hour
  (use an interval, ``every 15m``, for fixed elapsed spacing);
* a wall-clock time that does not exist (clocks go forward) fires at the instant the
  gap ends — ``30 2 * * *`` runs at 03:00 on the night the clocks go forward; several
  such times fire once, together.

So tick instants strictly increase and each matching day fires. Nothing here does I/O
or reads the clock: :meth:`Cron.next_after` is a pure function of its argument.
"""

from __future__ import annotations

import bisect
import datetime as dt
from dataclasses import dataclass
from zoneinfo import ZoneInfo

from foundry.errors import DeclarationError

__all__ = ["ALIASES", "SEARCH_YEARS", "Cron"]

ALIASES: dict[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
SEARCH_YEARS = 30  # an expression with no tick in this many years never fires (rejected when declared)

_MONTHS = {
    m: i + 1
    for i, m in enumerate(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
    )
}
_DAYS = {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}
# (name, low, high, names)
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("weekday", 0, 7, _DAYS),
)
_FIX = (
    'write five fields "minute hour day month weekday", e.g. "*/5 * * * *" (every 5 minutes) or '
    '"0 9 * * MON-FRI" (09:00 on weekdays); each field is *, N, A-B, */N, A-B/N or a comma list'
)
_DAY = dt.timedelta(days=1)


def _bad(unit: str, field: str, value: str, problem: str, fix: str = _FIX) -> DeclarationError:
    return DeclarationError(unit, field, value, problem, fix)


def _number(text: str, field: tuple[str, int, int, dict[str, int]], ctx: tuple[str, str, str]) -> int:
    name, low, high, names = field
    unit, field_name, expression = ctx
    token = text.strip().lower()
    if token in names:
        return names[token]
    if not token.isdigit():
        special = next((c for c in "?LW#" if c in text.upper()), None)
        if special is not None:
            raise _bad(
                unit,
                field_name,
                expression,
                f"uses {special!r} in its {name} field, which Foundry's cron does not support",
                "use plain values, ranges, steps and lists (e.g. a list of days instead of L or W)",
            )
        known = f" or a name ({', '.join(n.upper() for n in names)})" if names else ""
        raise _bad(unit, field_name, expression, f"has {text!r} in its {name} field: not a number{known}")
    value = int(token)
    if not low <= value <= high:
        raise _bad(
            unit,
            field_name,
            expression,
            f"has {value} in its {name} field, outside {low}-{high}",
            f"keep {name} values within {low}-{high}",
        )
    return value


def _parse_field(text: str, index: int, ctx: tuple[str, str, str]) -> tuple[frozenset[int], bool]:
    """The values one field allows, and whether it starts with ``*`` (cron's day/weekday rule)."""
    field = _FIELDS[index]
    name, low, high, _ = field
    unit, field_name, expression = ctx
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise _bad(unit, field_name, expression, f"has an empty item in its {name} field ({text!r})")
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) < 1:
                raise _bad(
                    unit,
                    field_name,
                    expression,
                    f"has step {step_text!r} in its {name} field: not a whole number of at least 1",
                    f"write e.g. */15 in the {name} field",
                )
            step = int(step_text)
        if base == "*":
            start, end = low, high
        elif "-" in base:
            a, _, b = base.partition("-")
            start, end = _number(a, field, ctx), _number(b, field, ctx)
            if start > end:
                raise _bad(
                    unit,
                    field_name,
                    expression,
                    f"has the range {base!r} in its {name} field, which runs backwards",
                    "write the smaller value first, or split a wrapping range in two (e.g. 22-23,0-2)",
                )
        else:
            start = _number(base, field, ctx)
            end = high if slash else start  # "5/15": from 5 to the end of the range
        values.update(range(start, end + 1, step))
    if name == "weekday" and 7 in values:  # 7 is Sunday, like 0
        values.discard(7)
        values.add(0)
    return frozenset(values), text.startswith("*")


@dataclass(frozen=True, slots=True)
class Cron:
    """A parsed five-field expression in a time zone (see the module docstring)."""

    expression: str
    tz: ZoneInfo
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: tuple[int, ...]
    weekdays: frozenset[int]  # 0 = Sunday
    day_star: bool
    weekday_star: bool

    @classmethod
    def parse(cls, expression: str, tz: ZoneInfo, *, unit: str = "?", field: str = "schedule") -> Cron:
        """Parse ``expression``; a bad one raises :class:`DeclarationError` naming the field."""
        if not isinstance(expression, str) or not expression.strip():
            raise _bad(unit, field, expression, "is not a cron expression")
        text = expression.strip()
        text = ALIASES.get(text.lower(), text)
        if text.startswith("@"):
            raise _bad(
                unit,
                field,
                expression,
                "is not a cron alias Foundry knows",
                f"use one of {', '.join(ALIASES)}, or five fields",
            )
        parts = text.split()
        if len(parts) == 6:
            raise _bad(
                unit,
                field,
                expression,
                "has six fields; Foundry's cron has five (minute hour day month weekday), no seconds",
                'drop the seconds field, or for sub-minute spacing write schedule="every 30s"',
            )
        if len(parts) != 5:
            raise _bad(unit, field, expression, f"has {len(parts)} fields, not five")
        ctx = (unit, field, expression)
        parsed = [_parse_field(part, i, ctx) for i, part in enumerate(parts)]
        cron = cls(
            expression=expression.strip(),
            tz=tz,
            minutes=tuple(sorted(parsed[0][0])),
            hours=tuple(sorted(parsed[1][0])),
            days=parsed[2][0],
            months=tuple(sorted(parsed[3][0])),
            weekdays=parsed[4][0],
            day_star=parsed[2][1],
            weekday_star=parsed[4][1],
        )
        if cron._next_naive(dt.datetime(2000, 1, 1), years=SEARCH_YEARS) is None:
            raise _bad(
                unit,
                field,
                expression,
                f"never fires (no date matches its day and month fields in {SEARCH_YEARS} years)",
                "check the day and month fields (e.g. 30 2 * * * is fine, 0 0 30 2 * never happens)",
            )
        return cron

    # -- matching wall-clock time --------------------------------------------------------

    def matches_day(self, day: dt.date) -> bool:
        if day.month not in self.months:
            return False
        in_days = day.day in self.days
        in_weekdays = day.isoweekday() % 7 in self.weekdays
        if self.day_star or self.weekday_star:
            return in_days and in_weekdays
        return in_days or in_weekdays

    def matches(self, wall: dt.datetime) -> bool:
        """Whether the wall-clock minute ``wall`` (naive or aware: its fields) is a match."""
        return (
            wall.second == 0
            and wall.microsecond == 0
            and wall.minute in self.minutes
            and wall.hour in self.hours
            and self.matches_day(wall.date())
        )

    def _next_naive(self, after: dt.datetime, years: int = SEARCH_YEARS) -> dt.datetime | None:
        """The first matching naive wall-clock minute strictly after ``after`` (``None``:
        none within ``years``)."""
        t = after.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
        last_year = t.year + years
        while t.year <= last_year:
            if t.month not in self.months:
                later = bisect.bisect_right(self.months, t.month)
                if later < len(self.months):
                    t = dt.datetime(t.year, self.months[later], 1)
                else:
                    t = dt.datetime(t.year + 1, self.months[0], 1)
                continue
            if self.matches_day(t.date()):
                h = bisect.bisect_left(self.hours, t.hour)
                while h < len(self.hours):
                    hour = self.hours[h]
                    first = t.minute if hour == t.hour else 0
                    m = bisect.bisect_left(self.minutes, first)
                    if m < len(self.minutes):
                        return t.replace(hour=hour, minute=self.minutes[m])
                    h += 1
            t = dt.datetime.combine(t.date() + _DAY, dt.time())
        return None

    # -- instants --------------------------------------------------------------------------

    def _offset(self, instant: float) -> dt.timedelta | None:
        return dt.datetime.fromtimestamp(instant, self.tz).utcoffset()

    def instant(self, wall: dt.datetime) -> float:
        """The unix time a matching naive wall-clock time fires at: its first occurrence
        when it happens twice, the end of the gap when it does not happen at all."""
        first = wall.replace(tzinfo=self.tz, fold=0).timestamp()
        if dt.datetime.fromtimestamp(first, self.tz).replace(tzinfo=None) == wall:
            return first
        # Skipped by a change of offset: ``fold=1`` reads it with the offset before the
        # change (an instant before the gap), ``fold=0`` with the one after (after it).
        # The change itself, to the second, is where the gap ends.
        lo = int(wall.replace(tzinfo=self.tz, fold=1).timestamp())
        hi = int(first) + 1
        after = self._offset(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._offset(mid) == after:
                hi = mid
            else:
                lo = mid
        return float(hi)

    def next_after(self, t: float) -> float:
        """The first tick strictly after unix time ``t``."""
        wall = dt.datetime.fromtimestamp(t, self.tz).replace(tzinfo=None)
        while True:
            nxt = self._next_naive(wall)
            if nxt is None:  # parse() rejected expressions that never fire
                raise AssertionError(f"cron {self.expression!r} has no tick after {t}")
            instant = self.instant(nxt)
            if instant > t:
                return instant
            wall = nxt  # t is in the hour repeated when clocks went back: past first occurrences
