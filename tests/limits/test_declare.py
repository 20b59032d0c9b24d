"""Declaring limits: ``rate_limit=``, ``max_concurrency=`` and ``per=`` on ``@app.work``,
and the errors for bad values (naming the unit, the field, the value and the fix)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from foundry import Foundry
from foundry.errors import DeclarationError
from foundry.traits import RateLimit, parse_rate_limit


@pytest.fixture
def app() -> Iterator[Foundry]:
    made = Foundry("limits-declare", queue="memory://")
    try:
        yield made
    finally:
        made.close()


def charge(customer_id: str, cents: int) -> None: ...


@pytest.mark.parametrize(
    ("text", "count", "period"),
    [("100/s", 100, 1.0), ("10/m", 10, 60.0), ("500/h", 500, 3600.0), (" 3 / s ", 3, 1.0)],
)
def test_a_rate_limit_is_a_count_per_second_minute_or_hour(text: str, count: int, period: float) -> None:
    limit = parse_rate_limit(text)
    assert limit == RateLimit(count, period)
    assert limit.rate == count / period


def test_the_traits_are_kept_on_the_unit(app: Foundry) -> None:
    unit = app.work(durable=True, rate_limit="100/s", max_concurrency=5, per="customer_id")(charge)
    assert unit.traits.rate_limit == RateLimit(100, 1.0)
    assert str(unit.traits.rate_limit) == "100/s"
    assert (unit.traits.max_concurrency, unit.traits.per) == (5, "customer_id")


@pytest.mark.parametrize(
    ("options", "field", "fix"),
    [
        ({"rate_limit": "100/sec"}, "rate_limit", 'use "100/s"'),
        ({"rate_limit": "5/minute"}, "rate_limit", 'use "5/m"'),
        ({"rate_limit": "5/hours"}, "rate_limit", 'use "5/h"'),
        ({"rate_limit": "5/day"}, "rate_limit", '"N/s", "N/m" or "N/h"'),
        ({"rate_limit": "0/s"}, "rate_limit", "at least 1"),
        ({"rate_limit": "1.5/s"}, "rate_limit", "whole number"),
        ({"rate_limit": 100}, "rate_limit", 'rate_limit="100/s"'),
        ({"max_concurrency": 0}, "max_concurrency", "at least 1"),
        ({"max_concurrency": "5"}, "max_concurrency", "whole number"),
        ({"max_concurrency": 2, "per": "customer id"}, "per", 'per="customer_id"'),
        ({"per": "customer_id"}, "per", "add rate_limit="),
        ({"max_concurrency": 2, "per": "customer"}, "per", "customer_id, cents"),
    ],
)
def test_bad_limits_name_the_unit_field_value_and_fix(
    app: Foundry, options: dict[str, object], field: str, fix: str
) -> None:
    with pytest.raises(DeclarationError) as caught:
        app.work(durable=True, **options)(charge)
    message = str(caught.value)
    assert "charge" in message
    assert field in message
    assert repr(options[field]) in message
    assert fix in message


def test_a_limited_units_decision_watches_its_waits(app: Foundry) -> None:
    unit = app.work(durable=True, rate_limit="5/m")(charge)
    assert {"foundry_limit_waiting", "foundry_limit_wait_seconds_total"} <= set(unit.decision.watch)
    plain = app.work(durable=True, name="plain")(charge)
    assert "foundry_limit_waiting" not in plain.decision.watch


def test_limits_need_a_durable_queue(app: Foundry) -> None:
    with pytest.raises(DeclarationError, match=r"max_concurrency.*not on a queue.*durable=True"):
        app.work(max_concurrency=3)(charge)


def test_a_limit_below_the_declared_arrival_rate_warns(app: Foundry) -> None:
    slow = app.work(durable=True, rate="50/s", rate_limit="10/s", name="slow")(charge)
    assert [w.code for w in slow.decision.warnings] == ["limit-below-demand"]
    assert 'rate_limit="10/s"' in slow.decision.warnings[0].message
    narrow = app.work(durable=True, rate="50/s", est="200ms", max_concurrency=5, name="narrow")(charge)
    assert "max_concurrency=5" in narrow.decision.warnings[0].message  # 5 / 0.2 s = 25/s
    roomy = app.work(durable=True, rate="5/s", rate_limit="10/s", est="200ms", max_concurrency=5, name="ok")(
        charge
    )
    assert roomy.decision.warnings == ()
    keyed = app.work(durable=True, rate="50/s", rate_limit="10/s", per="customer_id", name="keyed")(charge)
    assert keyed.decision.warnings == ()
