"""Closed forms: Erlang B/C, the G/G/c approximations, percentiles, Little's law, and
the seed's pool figures — including which formula its W 59.8 ms came from."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from foundry.errors import FoundryError, LabInputError
from foundry.lab import queueing as q


def _erlang_c_logspace(c: int, a: float) -> float:
    """Independent check: Erlang C from Poisson terms in log space."""
    log_terms = [k * math.log(a) - math.lgamma(k + 1) for k in range(c)]
    log_last = c * math.log(a) - math.lgamma(c + 1) - math.log(1 - a / c)
    top = max(*log_terms, log_last)
    s = sum(math.exp(t - top) for t in log_terms)
    last = math.exp(log_last - top)
    return last / (s + last)


def test_seed_pool_capacity_and_utilisation() -> None:
    a = q.analyse_pool(8, 0.050, 120.0)
    assert a.capacity == pytest.approx(160.0)
    assert a.utilisation == pytest.approx(0.750)
    assert a.stable


def test_exact_erlang_c_does_not_give_the_seeds_59_8_ms() -> None:
    # Given the seed's pool, when solved exactly, then W is 58.9 ms, not 59.8
    exact = q.mmc(8, 0.050, 120.0)
    assert exact is not None
    assert exact.p_wait == pytest.approx(0.356981, abs=1e-6)
    assert exact.wq * 1000 == pytest.approx(8.9245, abs=1e-3)
    assert round(exact.w * 1000, 1) == 58.9
    assert round(exact.l, 2) == 7.07
    assert exact.l == pytest.approx(120.0 * exact.w)  # Little


def test_sakasegawa_reproduces_the_seeds_figures() -> None:
    saka = q.sakasegawa(8, 0.050, 120.0)
    assert saka is not None
    assert round(saka.w * 1000, 1) == 59.8
    assert round(saka.l, 1) == 7.2
    assert round(0.120 * saka.w * 1000, 1) == 7.2  # "0.120/ms × 59.8 ms = 7.2 in flight"
    assert saka.method == q.SAKASEGAWA


@pytest.mark.parametrize(
    ("c", "a"), [(1, 0.5), (2, 1.2), (8, 6.0), (50, 45.0), (1000, 990.0), (5000, 4900.0)]
)
def test_erlang_c_matches_an_independent_log_space_evaluation(c: int, a: float) -> None:
    assert q.erlang_c(c, a) == pytest.approx(_erlang_c_logspace(c, a), rel=1e-9)


def test_erlang_c_is_stable_for_very_large_pools() -> None:
    value = q.erlang_c(200_000, 199_000.0)
    assert 0.0 < value < 1.0
    assert math.isfinite(value)


@given(c=st.integers(1, 300), rho=st.floats(0.01, 0.99))
def test_erlang_c_is_a_probability_and_at_least_erlang_b(c: int, rho: float) -> None:
    a = rho * c
    b, pw = q.erlang_b(c, a), q.erlang_c(c, a)
    assert 0.0 <= b <= pw <= 1.0


@given(c=st.integers(1, 64), rho=st.floats(0.05, 0.95), s=st.floats(0.001, 10.0))
def test_littles_law_and_ordering_hold_for_every_method(c: int, rho: float, s: float) -> None:
    rate = rho * c / s
    for m in q.analyse_pool(c, s, rate).methods:
        assert m.l == pytest.approx(rate * m.w, rel=1e-9)
        assert m.lq == pytest.approx(rate * m.wq, rel=1e-9)
        assert m.w >= s


def test_allen_cunneen_equals_erlang_c_for_poisson_and_pk_for_one_server() -> None:
    ac, exact = q.allen_cunneen(4, 0.1, 30.0, 1.0, 1.0), q.mmc(4, 0.1, 30.0)
    assert ac is not None
    assert exact is not None
    assert ac.w == pytest.approx(exact.w)
    # M/D/1: Pollaczek–Khinchine gives Wq = ρ S / (2 (1 − ρ)); Allen–Cunneen is exact there
    md1 = q.allen_cunneen(1, 0.1, 8.0, 1.0, 0.0)
    assert md1 is not None
    assert md1.wq == pytest.approx(0.8 * 0.1 / (2 * 0.2))


def test_burstier_arrivals_mean_longer_waits() -> None:
    smooth = q.allen_cunneen(8, 0.05, 120.0, ca=0.5)
    bursty = q.allen_cunneen(8, 0.05, 120.0, ca=3.0)
    assert smooth is not None
    assert bursty is not None
    assert bursty.wq > 4 * smooth.wq


def test_mm1_response_percentile_is_exponential() -> None:
    # M/M/1 response time is Exp(μ − λ): p99 = ln(100) / (μ − λ)
    assert q.mmc_response_quantile(0.99, 1, 0.1, 5.0) == pytest.approx(math.log(100) / 5.0, rel=1e-6)


def test_unstable_pool_is_reported_as_unbounded_not_a_number() -> None:
    a = q.analyse_pool(8, 0.050, 160.0)
    assert not a.stable
    assert a.methods == ()
    assert a.unbounded is not None
    assert "grows without bound" in a.unbounded
    assert a.workers_for_stability == 9
    assert q.mmc(8, 0.05, 200.0) is None


def test_workers_for_a_target() -> None:
    c = q.workers_for(0.05, 120.0, target=0.06)
    assert c == 8  # 7 workers give ρ = 0.857 and W ≈ 79 ms
    m7, m8 = q.mmc(7, 0.05, 120.0), q.mmc(8, 0.05, 120.0)
    assert m7 is not None
    assert m8 is not None
    assert m7.w > 0.06 >= m8.w
    with pytest.raises(LabInputError, match="target"):
        q.workers_for(0.05, 120.0, target=0.04)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((0, 0.05, 120.0), "workers"),
        ((-3, 0.05, 120.0), "workers"),
        ((8, 0.0, 120.0), "service"),
        ((8, 0.05, -1.0), "rate"),
        ((8, math.nan, 1.0), "service"),
    ],
)
def test_invalid_inputs_name_field_value_and_fix(args: tuple[int, float, float], field: str) -> None:
    with pytest.raises(LabInputError) as info:
        q.analyse_pool(*args)
    err = info.value
    assert isinstance(err, FoundryError)
    assert isinstance(err, ValueError)
    assert err.field == field
    assert f"{field}=" in str(err)
    assert "Fix:" in str(err)


def test_negative_cv_is_rejected() -> None:
    with pytest.raises(LabInputError, match="ca"):
        q.analyse_pool(8, 0.05, 120.0, ca=-1.0)
