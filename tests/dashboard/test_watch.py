"""Each decision's watch list becomes figures with limits derived from the declaration;
drift re-asks the decision engine with what was measured."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundry.decide import Measured, decide, reclassify
from foundry.decide import drift as engine_drift
from foundry.decide.bills import DELIVERY_BILLS, EXECUTION_BILLS
from foundry.decide.engine import EST_DRIFT
from foundry.observe import names
from foundry.observe.dashboard.watch import RULES, drift, evaluate
from foundry.traits import Traits, traits_from_kwargs


def _rows(metric: str, *rows: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {metric: list(rows)}


def test_every_watched_metric_of_every_bill_has_a_rule() -> None:
    watched = {m for bill in (*DELIVERY_BILLS.values(), *EXECUTION_BILLS.values()) for m in bill.watch}
    assert watched <= set(RULES), sorted(watched - set(RULES))
    assert set(RULES) <= set(names.ALL)


def test_loop_lag_is_judged_against_a_quarter_of_the_latency_budget() -> None:
    traits = traits_from_kwargs(
        "charge", {"est": "40ms", "bound": "io", "concurrency": 300, "latency": "50ms"}
    )
    d = decide(traits)
    assert names.LOOP_LAG in d.watch

    def lag(p99: float) -> Any:
        metrics = _rows(names.LOOP_LAG, {"labels": {"loop": "main"}, "p99": p99})
        return next(f for f in evaluate(d, traits, metrics, unit="charge") if f.metric == names.LOOP_LAG)

    assert lag(0.002).state == "ok"
    assert lag(0.011).state == "near"
    over = lag(0.040)
    assert over.state == "over"
    assert over.limit == pytest.approx(0.0125)
    assert "50 ms latency budget" in over.why


def test_figures_without_samples_say_no_data_and_other_units_do_not_count() -> None:
    traits = traits_from_kwargs("resize", {"durable": True, "est": "20ms", "queue": "images"})
    d = decide(traits)
    metrics = {
        names.UNIT_DURATION: [{"labels": {"unit": "other"}, "p99": 9.0, "count": 100}],
        names.QUEUE_OLDEST_AGE: [{"labels": {"queue": "images", "source": "engine"}, "value": 3.0}],
    }
    figures = {f.metric: f for f in evaluate(d, traits, metrics, unit="resize", queue="images")}
    assert figures[names.UNIT_DURATION].state == "nodata"
    age = figures[names.QUEUE_OLDEST_AGE]
    assert age.value == 3.0
    assert age.state == "over"
    assert age.source == "engine"


def test_the_engines_figure_wins_over_what_processes_report() -> None:
    traits = traits_from_kwargs("resize", {"durable": True, "queue": "images"})
    d = decide(traits)
    metrics = _rows(
        names.QUEUE_DEPTH,
        {"labels": {"queue": "images", "source": "engine"}, "value": 7},
        {"labels": {"queue": "images", "source": "fleet", "instance": "a"}, "value": 7},
        {"labels": {"queue": "images", "source": "fleet", "instance": "b"}, "value": 7},
    )
    [depth] = [
        f
        for f in evaluate(d, traits, metrics, unit="resize", queue="images")
        if f.metric == names.QUEUE_DEPTH
    ]
    assert depth.value == 7  # not 21: the workers all read the same queue


def test_a_pool_with_every_worker_busy_is_over() -> None:
    traits = traits_from_kwargs(
        "sign", {"est": "35ms", "bound": "cpu", "concurrency": 40, "workers": 4, "releases_gil": True}
    )
    d = decide(traits)
    assert names.POOL_BUSY in d.watch, d.model
    metrics = _rows(names.POOL_BUSY, {"labels": {"unit": "sign"}, "value": 4})
    [busy] = [f for f in evaluate(d, traits, metrics, unit="sign") if f.metric == names.POOL_BUSY]
    assert busy.state == "over"


def test_drift_names_the_model_the_measured_size_calls_for() -> None:
    # Given the signing step declared small (2 ms) at 50/s: run in the caller
    traits = traits_from_kwargs("sign", {"est": "2ms", "bound": "cpu", "rate": "50/s"})
    d = decide(traits)
    slow = _rows(names.UNIT_DURATION, {"labels": {"unit": "sign"}, "p50": 0.5, "count": 50})
    # When 50 runs measured a median of 500 ms, then the warning is the engine's own
    [warning] = drift(d, traits, slow, unit="sign")
    measured = Measured(est=0.5, source="the median of 50 runs")
    [line] = engine_drift(traits, measured)
    again = reclassify(traits, measured)
    assert again.model != d.model
    assert warning == (
        f"{line}; reclassify this phase: {again.model} (decided by {again.decided_by}), not {d.model}"
    )
    assert "declared est=2ms but the median of 50 runs measured 500ms" in warning


def test_drift_follows_the_engines_rule_and_says_when_the_decision_holds() -> None:
    traits = traits_from_kwargs(
        "charge", {"est": "40ms", "bound": "io", "concurrency": 300, "latency": "50ms"}
    )
    d = decide(traits)

    def at(p50: float, count: int = 50) -> list[str]:
        return drift(
            d,
            traits,
            _rows(names.UNIT_DURATION, {"labels": {"unit": "charge"}, "p50": p50, "count": count}),
            unit="charge",
        )

    # EST_DRIFT apart (either way) is drift, whatever the model it gives
    for p50 in (40e-3 * EST_DRIFT, 40e-3 / EST_DRIFT, 30.0):
        [warning] = at(p50)
        assert "still holds" in warning, warning
    # less than that, too few runs, or nothing declared: nothing to say
    assert at(40e-3 * EST_DRIFT * 0.9) == []
    assert at(30.0, count=5) == []
    assert (
        drift(
            d,
            None,
            _rows(names.UNIT_DURATION, {"labels": {"unit": "charge"}, "p50": 30.0, "count": 50}),
            unit="charge",
        )
        == []
    )
    other = _rows(names.UNIT_DURATION, {"labels": {"unit": "elsewhere"}, "p50": 30.0, "count": 50})
    assert drift(d, traits, other, unit="charge") == []


@settings(max_examples=60, deadline=None)
@given(
    est=st.one_of(st.none(), st.floats(0.0001, 3600)),
    latency=st.one_of(st.none(), st.floats(0.001, 60)),
    concurrency=st.one_of(st.none(), st.integers(1, 10_000)),
    durable=st.booleans(),
    value=st.floats(0, 1e6),
)
def test_every_figure_of_any_decision_has_a_state(
    est: float | None, latency: float | None, concurrency: int | None, durable: bool, value: float
) -> None:
    traits = Traits(est=est, latency=latency, concurrency=concurrency, durable=durable)
    d = decide(traits)
    metrics = {
        m: [
            {
                "labels": {"unit": "u", "queue": "default", "loop": "main"},
                "value": value,
                "rate": value,
                "p50": value,
                "p99": value,
                "count": 1,
            }
        ]
        for m in d.watch
    }
    for f in evaluate(d, traits, metrics, unit="u", queue="default"):
        assert f.state in ("ok", "near", "over", "nodata")
        assert f.why
