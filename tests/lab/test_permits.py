"""Seed 003's permits table, the model behind it, and its simulation."""

from __future__ import annotations

import pytest

from foundry.errors import LabInputError
from foundry.lab.permits import SEED_PERMITS, PermitSettings, knee, simulate_permits, sweep

SEED_TABLE = [
    # permits, goodput/s, mean latency ms, timeouts, failed of 10K
    (1, 25, 43, 0.0, 0),
    (5, 125, 43, 0.0, 0),
    (10, 250, 43, 0.0, 0),
    (25, 625, 43, 0.0, 0),
    (50, 1000, 53, 0.0, 0),
    (100, 1000, 103, 0.0, 0),
    (200, 1000, 203, 0.0, 0),
    (350, 1000, 353, 0.0, 0),
    (500, 0, 503, 1.0, 10_000),
]


def test_defaults_reproduce_the_seed_table_exactly() -> None:
    rows = sweep()
    assert [r.permits for r in rows] == list(SEED_PERMITS)
    got = [(r.permits, round(r.goodput), round(r.latency * 1000), r.timeout_rate, r.failed) for r in rows]
    assert got == SEED_TABLE
    assert all(r.requests == 10_000 for r in rows)


def test_little_law_below_the_knee_and_queueing_above_it() -> None:
    s = PermitSettings()
    assert knee(s) == pytest.approx(40.0)
    for r in sweep([1, 10, 40, 80, 160], s):
        at_downstream = r.latency - s.overhead
        assert r.goodput == pytest.approx(r.permits / at_downstream)  # concurrency ÷ latency
        assert r.goodput <= s.capacity + 1e-9


def test_other_inputs_give_sensible_answers() -> None:
    # a downstream twice as big doubles the plateau and halves the queueing
    big = {r.permits: r for r in sweep([50, 100, 500], PermitSettings(capacity=2000.0))}
    assert big[100].goodput == pytest.approx(2000.0)
    assert big[100].latency * 1000 == pytest.approx(53.0)
    assert big[500].timeout_rate == 0.0  # 500 / 2000/s = 250 ms < 500 ms timeout
    # a shorter timeout makes the cliff come earlier
    short = {r.permits: r for r in sweep([100, 200], PermitSettings(timeout=0.150))}
    assert short[100].timeout_rate == 0.0
    assert short[200].timeout_rate == 1.0


def test_simulation_with_deterministic_service_matches_the_fluid_model_below_the_cliff() -> None:
    s = PermitSettings(requests=2_000)
    fluid = {r.permits: r for r in sweep([1, 10, 25, 50], s)}
    sim = simulate_permits([1, 10, 25, 50], s, cs=0.0, replications=2)
    for r in sim:
        assert r.goodput == pytest.approx(fluid[r.permits].goodput, rel=0.02)
        assert r.latency == pytest.approx(fluid[r.permits].latency, rel=0.02)
        assert r.failed == 0
        assert "simulation" in r.method


def test_simulation_shows_collapse_and_that_dropping_abandoned_calls_helps() -> None:
    s = PermitSettings(requests=3_000)
    wasted = simulate_permits([500], s, cs=1.0, replications=2, abandoned="wasted")[0]
    dropped = simulate_permits([500], s, cs=1.0, replications=2, abandoned="dropped")[0]
    assert wasted.timeout_rate > 0.3
    assert dropped.goodput > wasted.goodput


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: sweep([0]), "permits"),
        (lambda: sweep([]), "permits"),
        (lambda: sweep(settings=PermitSettings(capacity=-1.0)), "capacity"),
        (lambda: sweep(settings=PermitSettings(timeout=0.0)), "timeout"),
        (lambda: simulate_permits([1], abandoned="ignored"), "abandoned"),
    ],
)
def test_bad_inputs(call: object, field: str) -> None:
    with pytest.raises(LabInputError) as info:
        call()  # type: ignore[operator]
    assert info.value.field == field
