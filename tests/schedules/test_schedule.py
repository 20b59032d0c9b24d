"""Declaring a schedule on a unit, interval ticks, and the missed-tick policy — with
times given, never waited for."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from foundry import Foundry
from foundry.errors import DeclarationError, UnknownTraitError
from foundry.schedules import ON_TIME, Due, Schedule

T0 = 1_700_000_000.0  # a multiple of 10: a tick of "every 1s" and "every 10s"


# -- declaring ---------------------------------------------------------------------------------


def test_a_scheduled_unit_is_durable_and_keeps_its_schedule() -> None:
    app = Foundry("sched-decl", queue="memory://")

    @app.work(schedule="*/5 * * * *", tz="Europe/Berlin")
    def report() -> None: ...

    assert report.decision.delivery == "queue"  # schedule= implies durable=True
    assert report.schedule is not None
    assert (report.schedule.expression, report.schedule.tz, report.schedule.policy) == (
        "*/5 * * * *",
        "Europe/Berlin",
        "skip",
    )
    assert report.schedule.describe() == "*/5 * * * * (Europe/Berlin)"
    plain = app.work(durable=True)(lambda: None)
    assert plain.schedule is None


def _declare(**options: Any) -> None:
    app = Foundry("sched-bad", queue="memory://")
    app.work(name="nightly", **options)(lambda: None)


@pytest.mark.parametrize(
    ("options", "field", "words"),
    [
        ({"schedule": "every 0.5s"}, "schedule", "whole seconds, at least 1"),
        ({"schedule": "every"}, "schedule", "names no interval"),
        ({"schedule": "every soon"}, "schedule", "that is not a duration"),
        ({"schedule": 5}, "schedule", "is not a schedule"),
        ({"schedule": "61 * * * *"}, "schedule", "outside 0-59"),
        ({"schedule": "every 30s", "tz": "Europe/Berlin"}, "tz", "has no time zone"),
        ({"schedule": "0 0 * * *", "tz": "Mars/Olympus"}, "tz", "is not a time zone"),
        ({"schedule": "0 0 * * *", "missed": "later"}, "missed", "not a missed-tick policy"),
        ({"schedule": "0 0 * * *", "missed": "skip", "catch_up": 3}, "catch_up", 'missed="skip"'),
        ({"schedule": "0 0 * * *", "catch_up": 0}, "catch_up", "from 1 to 1000"),
        ({"schedule": "0 0 * * *", "catch_up": True}, "catch_up", "from 1 to 1000"),
        ({"tz": "UTC"}, "tz", "without schedule="),
        ({"catch_up": 3}, "catch_up", "without schedule="),
        ({"schedule": "0 0 * * *", "durable": False}, "schedule", "runs on direct/"),
    ],
)
def test_a_bad_schedule_names_the_unit_field_value_and_fix(
    options: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(DeclarationError) as caught:
        _declare(**options)
    error = caught.value
    assert (error.unit, error.field, error.value) == ("nightly", field, options[field])
    assert words in str(error)
    assert "Fix:" in str(error)


def test_a_typo_of_a_schedule_option_is_suggested() -> None:
    with pytest.raises(UnknownTraitError, match="did you mean 'schedule'"):
        _declare(schedul="0 0 * * *")


def test_a_scheduled_unit_must_be_callable_with_no_arguments() -> None:
    app = Foundry("sched-args", queue="memory://")
    with pytest.raises(DeclarationError, match="requires 'region'") as caught:

        @app.work(schedule="@daily")
        def rollup(region: str) -> None: ...

    assert caught.value.field == "schedule"
    assert "rollup" not in app.units  # nothing half-declared


# -- ticks -------------------------------------------------------------------------------------


def test_interval_ticks_are_multiples_of_the_interval_since_the_epoch() -> None:
    every = Schedule("u", "every 10s")
    assert every.next_after(T0) == T0 + 10
    assert every.next_after(T0 + 3.7) == T0 + 10
    assert Schedule("u", "every 1h").next_after(T0) % 3600 == 0  # on the hour, in UTC
    assert every.key(T0) == "schedule:2023-11-14T22:13:20Z"
    assert every.at(T0) == dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC)


def test_a_cron_tick_is_named_in_its_zone_and_keyed_in_utc() -> None:
    berlin = Schedule("u", "0 9 * * *", tz="Europe/Berlin")
    tick = berlin.next_after(T0)
    assert berlin.at(tick).isoformat() == "2023-11-15T09:00:00+01:00"
    assert berlin.key(tick) == "schedule:2023-11-15T08:00:00Z"


# -- the missed-tick policy ----------------------------------------------------------------------


def test_on_time_ticks_all_run_however_late_the_scheduler_looks() -> None:
    every = Schedule("u", "every 1s")
    # a live scheduler that last looked at T0 and stalled for 5 s: nothing was missed
    assert every.due(T0, T0 + 5.2, since=T0) == Due((T0 + 1, T0 + 2, T0 + 3, T0 + 4, T0 + 5))
    assert every.due(T0, T0 + 0.9, since=T0) == Due(())


def test_skip_runs_only_the_latest_missed_tick_after_downtime() -> None:
    every = Schedule("u", "every 1s")
    # every scheduler was down from T0 to T0 + 900.5; one starts now
    due = every.due(T0, T0 + 900.5, since=T0 + 900.5)
    assert due == Due((T0 + 900,), skipped=899)
    # with an on-time tick, no missed one runs
    assert every.due(T0, T0 + 900.5, since=T0 + 899.5) == Due((T0 + 900,), skipped=899)


def test_catch_up_runs_the_most_recent_missed_ticks_bounded() -> None:
    every = Schedule("u", "every 10s", missed="catch_up", catch_up=3)
    due = every.due(T0, T0 + 1000, since=T0 + 1000)
    assert due == Due((T0 + 980, T0 + 990, T0 + 1000), skipped=97)  # 100 missed, the last 3 run
    # fewer missed than allowed: all of them
    assert every.due(T0, T0 + 20, since=T0 + 20) == Due((T0 + 10, T0 + 20))
    assert Schedule("u", "@daily", catch_up=5).missed == "catch_up"  # catch_up= implies it


def test_catch_up_of_a_cron_schedule_across_days() -> None:
    daily = Schedule("u", "0 3 * * *", tz="Europe/Berlin", missed="catch_up", catch_up=2)
    last = dt.datetime(2024, 3, 1, 3, tzinfo=daily.zone).timestamp()
    now = dt.datetime(2024, 3, 11, 12, tzinfo=daily.zone).timestamp()
    due = daily.due(last, now, since=now)
    assert [daily.at(t).strftime("%m-%d %H:%M") for t in due.run] == ["03-10 03:00", "03-11 03:00"]
    assert due.skipped == 8


def test_a_store_outage_longer_than_on_time_makes_ticks_missed() -> None:
    every = Schedule("u", "every 1s")
    # the scheduler lived throughout, but its looks failed for 3 minutes
    due = every.due(T0, T0 + 180.5, since=T0)
    assert due.run == tuple(T0 + s for s in range(int(180 - ON_TIME) + 1, 181))
    assert due.skipped == int(180 - ON_TIME)


def test_a_huge_gap_in_a_dense_cron_schedule_is_counted_up_to_a_bound() -> None:
    every_minute = Schedule("u", "* * * * *")
    due = every_minute.due(T0, T0 + 30 * 86400, since=T0 + 30 * 86400)
    assert len(due.run) == 1
    assert due.more
    assert due.skipped == 10_000 - 1
