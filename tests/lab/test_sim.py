"""The simulator against the closed forms: it must agree with Erlang C within its own
confidence interval, keep Little's law, and be reproducible from its seed."""

from __future__ import annotations

import math
import random

import pytest

from foundry.errors import LabInputError
from foundry.lab import queueing as q
from foundry.lab.distributions import Dist
from foundry.lab.sim import EventLoop, simulate_pool

SERVICE = 0.05


@pytest.mark.parametrize("c", [1, 2, 8])
@pytest.mark.parametrize("rho", [0.3, 0.6, 0.85])
def test_simulation_agrees_with_erlang_c_within_its_interval(c: int, rho: float) -> None:
    # Given M/M/c at utilisation rho, when simulated (seeded, 99% CI), then exact W and Wq lie inside
    rate = rho * c / SERVICE
    exact = q.mmc(c, SERVICE, rate)
    assert exact is not None
    sim = simulate_pool(c, Dist.of(SERVICE, 1.0), rate, customers=20_000, replications=10, confidence=0.99)
    assert sim.w.contains(exact.w), (sim.w, exact.w)
    assert sim.wq.contains(exact.wq), (sim.wq, exact.wq)
    assert sim.p_wait.contains(exact.p_wait), (sim.p_wait, exact.p_wait)
    # and the interval is informative, not a licence: half-width under 15% of W
    assert sim.w.half_width < 0.15 * exact.w
    assert sim.utilisation.mean == pytest.approx(rho, abs=0.03)


@pytest.mark.parametrize(("c", "rho"), [(1, 0.7), (4, 0.8)])
def test_littles_law_holds_in_simulation(c: int, rho: float) -> None:
    # L measured as a time average of the number in system vs λ̂ × mean W of the same window
    sim = simulate_pool(c, Dist.of(SERVICE, 1.0), rho * c / SERVICE, customers=10_000, replications=5)
    assert sim.l.mean == pytest.approx(sim.little_l.mean, rel=0.02)
    assert sim.lq.mean == pytest.approx(sim.throughput.mean * sim.wq.mean, rel=0.03)


def test_same_seed_same_numbers_and_another_seed_differs() -> None:
    args = (2, Dist.of(SERVICE, 1.0), 30.0)
    a = simulate_pool(*args, customers=2_000, replications=3, seed=7)
    b = simulate_pool(*args, customers=2_000, replications=3, seed=7)
    c = simulate_pool(*args, customers=2_000, replications=3, seed=8)
    assert a.w == b.w
    assert a.l == b.l
    assert a.w.mean != c.w.mean


def test_bursty_arrivals_follow_allen_cunneen_roughly() -> None:
    # H2 arrivals with ca = 2 more than double the wait of Poisson; Allen–Cunneen predicts ×2.5
    rate = 0.75 * 4 / SERVICE
    bursty = simulate_pool(
        4, Dist.of(SERVICE, 1.0), rate, arrivals=Dist.of(1.0, 2.0, "h2"), customers=20_000, replications=6
    )
    poisson = q.mmc(4, SERVICE, rate)
    approx = q.allen_cunneen(4, SERVICE, rate, ca=2.0, cs=1.0)
    assert poisson is not None
    assert approx is not None
    assert bursty.wq.mean > 2 * poisson.wq
    assert bursty.wq.mean == pytest.approx(approx.wq, rel=0.35)


@pytest.mark.parametrize(
    ("kind", "cv"),
    [("deterministic", 0.0), ("gamma", 0.5), ("exponential", 1.0), ("h2", 2.0), ("lognormal", 1.5)],
)
def test_distributions_have_their_mean_and_cv(kind: str, cv: float) -> None:
    dist = Dist.of(2.0, cv, kind)
    draw = dist.sampler(random.Random(1))
    xs = [draw() for _ in range(40_000)]
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    assert mean == pytest.approx(2.0, rel=0.04)
    assert math.sqrt(var) / mean == pytest.approx(cv, abs=0.08 * max(cv, 1.0))


def test_batch_arrivals_have_cv_squared_2k_minus_1() -> None:
    dist = Dist.of(1.0, math.sqrt(5.0), "batch")
    assert dist.batch_size == 3
    assert dist.scv == 5.0
    draw = dist.sampler(random.Random(2))
    gaps = [draw() for _ in range(30_000)]
    assert sum(1 for g in gaps if g == 0.0) / len(gaps) == pytest.approx(2 / 3, abs=0.01)
    assert sum(gaps) / len(gaps) == pytest.approx(1.0, rel=0.05)


def test_unstable_queue_needs_a_horizon() -> None:
    with pytest.raises(LabInputError) as info:
        simulate_pool(2, Dist.of(SERVICE, 1.0), 50.0)
    assert info.value.field == "rate"
    assert "horizon" in info.value.fix


def test_horizon_shows_an_unstable_queue_growing() -> None:
    # λ = 50/s against capacity 40/s: ~10 more per second stay behind
    sim = simulate_pool(2, Dist.of(SERVICE, 1.0), 50.0, horizon=20.0, replications=4)
    assert sim.in_system_at_end.mean > 100
    assert sim.utilisation.mean > 0.95
    assert sim.throughput.mean == pytest.approx(50.0, rel=0.15)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"workers": 0}, "workers"),
        ({"rate": -1.0}, "rate"),
        ({"replications": 1}, "replications"),
        ({"customers": 5}, "customers"),
        ({"warmup": 20_000}, "warmup"),
    ],
)
def test_bad_simulation_inputs(kwargs: dict[str, float], field: str) -> None:
    args: dict[str, object] = {"workers": 2, "rate": 10.0, **kwargs}
    with pytest.raises(LabInputError) as info:
        simulate_pool(args.pop("workers"), Dist.of(SERVICE, 1.0), args.pop("rate"), **args)  # type: ignore[arg-type]
    assert info.value.field == field


def test_bad_distribution_inputs() -> None:
    with pytest.raises(LabInputError, match="hyperexponential"):
        Dist.of(1.0, 0.5, "h2")
    with pytest.raises(LabInputError, match="not a known distribution"):
        Dist.of(1.0, 1.0, "pareto")
    with pytest.raises(LabInputError, match="empty"):
        Dist.empirical([])


def test_event_loop_orders_by_time_then_insertion() -> None:
    loop = EventLoop()
    seen: list[str] = []
    loop.after(2.0, lambda: seen.append("b"))
    loop.after(1.0, lambda: seen.append("a"))
    loop.after(2.0, lambda: seen.append("c"))
    assert loop.run() == 3
    assert seen == ["a", "b", "c"]
    assert loop.now == 2.0
