"""The cron parser and its steps through time: fields, names, lists, ranges, steps, the
day/weekday rule, errors that name the unit, the field, the value and the fix, and
daylight-saving changes — checked against a brute-force walk over every minute."""

from __future__ import annotations

import datetime as dt
import math
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from foundry.errors import DeclarationError
from foundry.schedules import Cron

UTC = ZoneInfo("UTC")


def ts(*parts: int, tz: ZoneInfo = UTC) -> float:
    return dt.datetime(*parts, tzinfo=tz).timestamp()  # type: ignore[misc]


def walls(cron: Cron, start: float, n: int) -> list[str]:
    """The next ``n`` ticks after ``start``, as wall-clock times with their offsets."""
    out, t = [], start
    for _ in range(n):
        t = cron.next_after(t)
        out.append(dt.datetime.fromtimestamp(t, cron.tz).strftime("%a %Y-%m-%d %H:%M%z"))
    return out


@pytest.mark.parametrize(
    ("expression", "field", "expected"),
    [
        ("* * * * *", "minutes", tuple(range(60))),
        ("*/15 * * * *", "minutes", (0, 15, 30, 45)),
        ("5/15 * * * *", "minutes", (5, 20, 35, 50)),
        ("0-30/10 * * * *", "minutes", (0, 10, 20, 30)),
        ("1,2,40-42 * * * *", "minutes", (1, 2, 40, 41, 42)),
        ("0 9-17/4 * * *", "hours", (9, 13, 17)),
        ("0 0 * jan,JUL-sep *", "months", (1, 7, 8, 9)),
        ("0 0 * * Mon-Fri", "weekdays", frozenset({1, 2, 3, 4, 5})),
        ("0 0 * * 7", "weekdays", frozenset({0})),  # 7 is Sunday, like 0
        ("0 0 * * sun,SAT", "weekdays", frozenset({0, 6})),
        ("@hourly", "minutes", (0,)),
    ],
)
def test_fields_parse_to_their_values(expression: str, field: str, expected: object) -> None:
    assert getattr(Cron.parse(expression, UTC), field) == expected


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("* * * *", "has 4 fields, not five"),
        ("* * * * * *", "six fields"),
        ("60 * * * *", "60 in its minute field, outside 0-59"),
        ("* 24 * * *", "outside 0-23"),
        ("* * 0 * *", "outside 1-31"),
        ("* * * 13 *", "outside 1-12"),
        ("* * * * 8", "outside 0-7"),
        ("* * * foo *", "'foo' in its month field: not a number or a name (JAN"),
        ("*/0 * * * *", "step '0'"),
        ("10-5 * * * *", "runs backwards"),
        ("1,,2 * * * *", "empty item"),
        ("* * L * *", "'L' in its day field"),
        ("* * ? * *", "'?' in its day field"),
        ("0 0 30 2 *", "never fires"),
        ("@often", "not a cron alias"),
        ("", "is not a cron expression"),
    ],
)
def test_a_bad_expression_names_the_unit_field_value_and_fix(expression: str, words: str) -> None:
    with pytest.raises(DeclarationError) as caught:
        Cron.parse(expression, UTC, unit="nightly", field="schedule")
    error = caught.value
    assert (error.unit, error.field, error.value) == ("nightly", "schedule", expression)
    assert words in str(error)
    assert error.fix
    assert "Fix:" in str(error)


def test_ticks_step_through_minutes_hours_and_days() -> None:
    start = ts(2024, 1, 5, 16, 58, 30)  # a Friday
    assert walls(Cron.parse("*/5 * * * *", UTC), start, 3) == [
        "Fri 2024-01-05 17:00+0000",
        "Fri 2024-01-05 17:05+0000",
        "Fri 2024-01-05 17:10+0000",
    ]
    assert walls(Cron.parse("0 9 * * MON-FRI", UTC), start, 3) == [
        "Mon 2024-01-08 09:00+0000",  # the weekend is skipped
        "Tue 2024-01-09 09:00+0000",
        "Wed 2024-01-10 09:00+0000",
    ]
    assert walls(Cron.parse("@monthly", UTC), start, 2) == [
        "Thu 2024-02-01 00:00+0000",
        "Fri 2024-03-01 00:00+0000",
    ]


def test_a_tick_is_strictly_after_the_time_asked() -> None:
    cron = Cron.parse("*/5 * * * *", UTC)
    tick = ts(2024, 1, 1, 10, 5)
    assert cron.next_after(tick) == ts(2024, 1, 1, 10, 10)
    assert cron.next_after(tick - 0.001) == tick


def test_day_and_weekday_both_restricted_match_either() -> None:
    # cron's rule: "0 0 1 * MON" is the 1st of each month *and* every Monday
    assert walls(Cron.parse("0 0 1 * MON", UTC), ts(2024, 4, 28), 3) == [
        "Mon 2024-04-29 00:00+0000",
        "Wed 2024-05-01 00:00+0000",
        "Mon 2024-05-06 00:00+0000",
    ]
    # with either one starting with *, both must match: Fridays that are the 13th
    assert walls(Cron.parse("0 0 13 * */1", UTC), ts(2024, 1, 1), 1) == ["Sat 2024-01-13 00:00+0000"]
    assert walls(Cron.parse("0 0 * * FRI", UTC), ts(2024, 1, 1), 1) == ["Fri 2024-01-05 00:00+0000"]


def test_february_the_29th_waits_for_a_leap_year() -> None:
    assert walls(Cron.parse("0 0 29 2 *", UTC), ts(2024, 3, 1), 2) == [
        "Tue 2028-02-29 00:00+0000",
        "Sun 2032-02-29 00:00+0000",
    ]


BERLIN = ZoneInfo("Europe/Berlin")


def test_a_time_skipped_by_daylight_saving_fires_when_the_gap_ends() -> None:
    # 2024-03-31: Berlin goes from 02:00 CET straight to 03:00 CEST
    assert walls(Cron.parse("30 2 * * *", BERLIN), ts(2024, 3, 30, 12), 3) == [
        "Sun 2024-03-31 03:00+0200",
        "Mon 2024-04-01 02:30+0200",
        "Tue 2024-04-02 02:30+0200",
    ]
    # several skipped times fire once, together, and the rhythm goes on after the gap
    assert walls(Cron.parse("*/30 * * * *", BERLIN), ts(2024, 3, 31, 1, 10, tz=BERLIN), 4) == [
        "Sun 2024-03-31 01:30+0100",
        "Sun 2024-03-31 03:00+0200",
        "Sun 2024-03-31 03:30+0200",
        "Sun 2024-03-31 04:00+0200",
    ]


def test_a_time_repeated_by_daylight_saving_fires_once_at_its_first_occurrence() -> None:
    # 2024-10-27: Berlin's clocks go from 03:00 CEST back to 02:00 CET
    assert walls(Cron.parse("30 2 * * *", BERLIN), ts(2024, 10, 26, 12), 3) == [
        "Sun 2024-10-27 02:30+0200",  # not again at 02:30+0100
        "Mon 2024-10-28 02:30+0100",
        "Tue 2024-10-29 02:30+0100",
    ]
    # an hourly schedule pauses for the repeated hour (wall-clock times fire once)
    assert walls(Cron.parse("0 * * * *", BERLIN), ts(2024, 10, 27, 1, 30, tz=BERLIN), 3) == [
        "Sun 2024-10-27 02:00+0200",
        "Sun 2024-10-27 03:00+0100",
        "Sun 2024-10-27 04:00+0100",
    ]
    # asked from inside the repeated hour (second pass), it does not go back to the first
    second_pass = dt.datetime(2024, 10, 27, 2, 10, tzinfo=BERLIN, fold=1).timestamp()
    assert walls(Cron.parse("*/20 * * * *", BERLIN), second_pass, 1) == ["Sun 2024-10-27 03:00+0100"]


def test_half_hour_daylight_saving_and_a_skipped_day() -> None:
    # Lord Howe Island moves its clocks by 30 minutes; Samoa skipped 2011-12-30 entirely
    lord_howe = ZoneInfo("Australia/Lord_Howe")
    assert walls(Cron.parse("15 2 * * *", lord_howe), ts(2024, 10, 5, 12, tz=lord_howe), 2) == [
        "Sun 2024-10-06 02:30+1100",  # 02:00-02:30 does not exist that night
        "Mon 2024-10-07 02:15+1100",
    ]
    apia = ZoneInfo("Pacific/Apia")
    assert walls(Cron.parse("0 12 30 12 *", apia), ts(2011, 12, 1, tz=apia), 2) == [
        "Sat 2011-12-31 00:00+1400",  # the day did not happen: it fires when it would have ended
        "Sun 2012-12-30 12:00+1400",
    ]


# -- against a brute-force walk ----------------------------------------------------------------

TRANSITIONS = [
    ("Europe/Berlin", (2024, 3, 31)),
    ("Europe/Berlin", (2024, 10, 27)),
    ("America/New_York", (2024, 3, 10)),
    ("America/New_York", (2024, 11, 3)),
    ("Australia/Lord_Howe", (2024, 4, 7)),
    ("Australia/Lord_Howe", (2024, 10, 6)),
    ("Pacific/Apia", (2011, 12, 30)),
    ("UTC", (2024, 2, 29)),
]


def _field(values: frozenset[int] | None) -> str:
    return "*" if values is None else ",".join(map(str, sorted(values)))


def _reference(fields: list[frozenset[int] | None], zone: ZoneInfo, start: float, end: float) -> list[float]:
    """Every tick in (start, end] by the documented rules, minute by minute: a matching
    wall-clock minute at its first occurrence, and the end of a gap holding a match."""
    minutes, hours, days, months, weekdays = fields

    def matches(wall: dt.datetime) -> bool:
        def has(values: frozenset[int] | None, value: int) -> bool:
            return values is None or value in values

        in_day = has(days, wall.day)
        in_weekday = has(weekdays, wall.isoweekday() % 7)
        day_ok = (
            (in_day or in_weekday) if days is not None and weekdays is not None else in_day and in_weekday
        )
        return has(minutes, wall.minute) and has(hours, wall.hour) and has(months, wall.month) and day_ok

    out: set[float] = set()
    m = math.floor(start / 60) * 60 + 60
    while m <= end:
        wall = dt.datetime.fromtimestamp(m, zone)
        if wall.fold == 0 and matches(wall):
            out.add(float(m))
        before = dt.datetime.fromtimestamp(m - 60, zone).replace(tzinfo=None)
        skipped = wall.replace(tzinfo=None) - before - dt.timedelta(minutes=1)
        probe = before + dt.timedelta(minutes=1)
        while skipped > dt.timedelta(0):  # the wall-clock minutes that never happened
            if matches(probe):
                out.add(float(m))
                break
            probe += dt.timedelta(minutes=1)
            skipped -= dt.timedelta(minutes=1)
        m += 60
    return sorted(out)


def _values(low: int, high: int) -> st.SearchStrategy[frozenset[int] | None]:
    return st.none() | st.frozensets(st.integers(low, high), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    minutes=_values(0, 59),
    hours=_values(0, 23),
    days=st.none() | st.frozensets(st.integers(1, 31), min_size=20, max_size=31),
    weekdays=st.none() | st.frozensets(st.integers(0, 6), min_size=4, max_size=7),
    where=st.sampled_from(TRANSITIONS),
)
def test_ticks_match_a_minute_by_minute_walk_across_daylight_saving(
    minutes: frozenset[int] | None,
    hours: frozenset[int] | None,
    days: frozenset[int] | None,
    weekdays: frozenset[int] | None,
    where: tuple[str, tuple[int, int, int]],
) -> None:
    name, day = where
    zone = ZoneInfo(name)
    fields = [minutes, hours, days, None, weekdays]
    expression = " ".join(_field(f) for f in fields)
    try:
        cron = Cron.parse(expression, zone)
    except DeclarationError:
        assume(False)
        raise
    start = dt.datetime(*day, tzinfo=zone).timestamp() - 86400  # type: ignore[misc]
    end = start + 2 * 86400
    got, t = [], start
    while (t := cron.next_after(t)) <= end:
        got.append(t)
    assert got == _reference(fields, zone, start, end), expression
