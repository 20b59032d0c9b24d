"""Discrete-event simulation: a small event engine, and a G/G/c FCFS pool simulator with
warm-up discard and independent replications reported as mean ± Student-t interval.

No wall clock anywhere: simulated time only, and every random draw comes from a
:class:`random.Random` seeded from ``(seed, replication)``, so a run is reproducible
bit for bit.

The pool simulator advances customer by customer (Kiefer–Wolfowitz): with servers'
next-free times in a heap, an arrival at ``t`` starts at ``max(t, earliest free)`` and
occupies that server until ``start + service``. For FCFS this *is* the event-driven
simulation, with the events of one customer processed together — a third of the heap
traffic of a generic engine, which is what lets a test run 9 grid points in seconds.
:class:`EventLoop` is the generic engine for the models that need one (permits with
timeouts, server shapes).

Little's law is checked, not assumed: ``L`` is measured as the time average of the
number in system over the observation window (from every customer's interval), and
compared with ``λ̂ × mean W`` from the customers who arrived in that window.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from array import array
from collections.abc import Callable
from dataclasses import dataclass

from foundry.errors import LabInputError
from foundry.lab.distributions import Dist
from foundry.lab.queueing import Metrics, check_positive, check_workers
from foundry.lab.stats import Estimate, estimate, quantile

__all__ = ["MAX_CUSTOMERS", "EventLoop", "PoolSim", "sim_label", "simulate_pool"]

MAX_CUSTOMERS = 2_000_000
"""Per replication: a bound on the work a horizon run can ask for."""


def sim_label(confidence: float, half: float | None = None, unit: str = "") -> str:
    """How a simulated number is labelled: ``simulation, 95% CI ±0.8 ms``."""
    text = f"simulation, {confidence * 100:g}% CI"
    return f"{text} ±{half:.3g}{unit}" if half is not None else text


class EventLoop:
    """A discrete-event engine: actions ordered by (time, insertion order)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def after(self, delay: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (self.now + max(0.0, delay), next(self._seq), action))

    def run(self, until: float = math.inf, max_events: int = 50_000_000) -> int:
        """Process events up to simulated time ``until``; returns how many ran."""
        ran = 0
        heap = self._heap
        while heap and heap[0][0] <= until:
            if ran >= max_events:
                raise LabInputError(
                    "events", ran, "exceeded the simulation's event budget", "simulate fewer requests"
                )
            self.now, _, action = heapq.heappop(heap)
            action()
            ran += 1
        return ran


@dataclass(frozen=True, slots=True)
class _Rep:
    p_wait: float
    wq: float
    w: float
    lq: float
    l: float  # noqa: E741
    throughput: float
    utilisation: float
    p50: float
    p95: float
    p99: float
    in_system_at_end: float


@dataclass(frozen=True, slots=True)
class PoolSim:
    """Simulated G/G/c: every figure is an :class:`~foundry.lab.stats.Estimate`."""

    workers: int
    arrivals: Dist
    service: Dist
    customers: int
    warmup: int
    replications: int
    seed: int
    confidence: float
    horizon: float | None
    p_wait: Estimate
    wq: Estimate
    w: Estimate
    lq: Estimate
    """Time-averaged number waiting."""
    l: Estimate  # noqa: E741
    """Time-averaged number in system."""
    little_l: Estimate
    """λ̂ × mean W, from the same replications (Little's law check)."""
    throughput: Estimate
    utilisation: Estimate
    p50: Estimate
    p95: Estimate
    p99: Estimate
    in_system_at_end: Estimate
    """Customers in the system at the horizon (horizon runs), else at the last arrival."""

    @property
    def label(self) -> str:
        return sim_label(self.confidence)

    def metrics(self) -> Metrics:
        """The figures as a :class:`Metrics` row with half-widths."""
        fields = ("p_wait", "wq", "w", "lq", "l", "little_l", "p50", "p95", "p99")
        est: dict[str, Estimate] = {name: getattr(self, name) for name in fields}
        return Metrics(
            self.label,
            est["p_wait"].mean,
            est["wq"].mean,
            est["w"].mean,
            est["lq"].mean,
            est["l"].mean,
            est["little_l"].mean,
            p50=est["p50"].mean,
            p95=est["p95"].mean,
            p99=est["p99"].mean,
            note=(
                f"{self.replications} replications × {self.customers} customers "
                f"({self.warmup} warm-up discarded), seed {self.seed}; arrivals {self.arrivals.describe()}, "
                f"service {self.service.describe()}"
                if self.horizon is None
                else f"{self.replications} replications over a {self.horizon:g} s horizon from empty, seed "
                f"{self.seed}; transient figures, not a steady state"
            ),
            half_widths={name: e.half_width for name, e in est.items()},
        )

    def as_dict(self) -> dict[str, object]:
        names = ("p_wait", "wq", "w", "lq", "l", "little_l", "throughput", "utilisation")
        out: dict[str, object] = {
            "method": self.label,
            "workers": self.workers,
            "arrivals": self.arrivals.describe(),
            "service": self.service.describe(),
            "customers": self.customers,
            "warmup": self.warmup,
            "replications": self.replications,
            "seed": self.seed,
            "horizon_s": self.horizon,
        }
        for name in (*names, "p50", "p95", "p99", "in_system_at_end"):
            out[name] = getattr(self, name).as_dict()
        return out


def _overlap_sum(lo: array[float], hi: array[float], t0: float, t1: float) -> float:
    total = 0.0
    for a, b in zip(lo, hi, strict=True):
        if b > t0 and a < t1:
            total += (b if b < t1 else t1) - (a if a > t0 else t0)
    return total


def _replicate(
    c: int, arrivals: Dist, service: Dist, rng: random.Random, n: int, warm: int, horizon: float | None
) -> _Rep:
    next_gap = arrivals.sampler(rng)
    next_service = service.sampler(rng)
    free = [0.0] * c
    arr: array[float] = array("d")
    start: array[float] = array("d")
    end: array[float] = array("d")
    replace = heapq.heapreplace
    t = 0.0
    count = 0
    limit = MAX_CUSTOMERS if horizon is not None else n
    while count < limit:
        t += next_gap()
        if horizon is not None and t > horizon:
            break
        f = free[0]
        s = t if f <= t else f
        e = s + next_service()
        replace(free, e)
        arr.append(t)
        start.append(s)
        end.append(e)
        count += 1
    else:
        if horizon is not None:
            raise LabInputError(
                "horizon",
                horizon,
                f"needs more than {MAX_CUSTOMERS} arrivals per replication",
                "shorten the horizon or lower the rate",
            )
    first = warm if horizon is None else 0
    measured = count - first
    if measured < 2:
        raise LabInputError(
            "customers",
            n,
            "leaves fewer than 2 measured customers",
            "simulate more customers or a longer horizon",
        )
    t0 = arr[first] if horizon is None else 0.0
    t1 = arr[count - 1] if horizon is None else horizon
    window = t1 - t0
    if window <= 0:
        raise LabInputError("customers", n, "spans no simulated time", "simulate more customers")
    waits = [start[i] - arr[i] for i in range(first, count)]
    resp = sorted(end[i] - arr[i] for i in range(first, count))
    w_mean = math.fsum(resp) / measured
    busy = _overlap_sum(start, end, t0, t1)
    return _Rep(
        p_wait=sum(1 for x in waits if x > 0) / measured,
        wq=math.fsum(waits) / measured,
        w=w_mean,
        lq=_overlap_sum(arr, start, t0, t1) / window,
        l=_overlap_sum(arr, end, t0, t1) / window,
        throughput=measured / window,
        utilisation=busy / (c * window),
        p50=quantile(resp, 0.50),
        p95=quantile(resp, 0.95),
        p99=quantile(resp, 0.99),
        in_system_at_end=float(sum(1 for i in range(count) if arr[i] <= t1 < end[i])),
    )


def simulate_pool(
    workers: int,
    service: Dist,
    rate: float,
    *,
    arrivals: Dist | None = None,
    customers: int = 20_000,
    warmup: int | None = None,
    replications: int = 10,
    seed: int = 0,
    confidence: float = 0.95,
    horizon: float | None = None,
) -> PoolSim:
    """Simulate a G/G/c FCFS pool.

    ``arrivals`` defaults to Poisson at ``rate``; when given, its mean is replaced by
    ``1/rate`` (its kind and CV are kept). Steady-state mode (``horizon=None``) runs
    ``customers`` per replication and discards the first ``warmup`` (default a fifth);
    it refuses ρ ≥ 1, which has no steady state. Horizon mode runs from empty for
    ``horizon`` simulated seconds, allows ρ ≥ 1, and reports what happened by then.
    """
    workers = check_workers("workers", workers)
    rate = check_positive("rate", rate, 'give a positive arrival rate, e.g. "120/s"')
    if not isinstance(customers, int) or customers < 10:
        raise LabInputError("customers", customers, "is fewer than 10", "simulate at least 10 customers")
    if not isinstance(replications, int) or replications < 2:
        raise LabInputError(
            "replications", replications, "is fewer than 2", "run at least 2 replications for an interval"
        )
    warm = customers // 5 if warmup is None else warmup
    if not 0 <= warm <= customers - 2:
        raise LabInputError(
            "warmup", warm, f"must be between 0 and customers-2 ({customers - 2})", "discard fewer customers"
        )
    if horizon is not None:
        horizon = check_positive("horizon", horizon, 'give a simulated duration, e.g. "10s"')
    base = arrivals or Dist.of(1.0 / rate, 1.0, "exponential")
    arrivals = Dist(1.0 / rate, base.scv, base.kind, base.values)
    rho = rate * service.mean / workers
    if rho >= 1.0 and horizon is None:
        raise LabInputError(
            "rate",
            rate,
            f"gives ρ = {rho:.3f} ≥ 1 with {workers} workers: the queue grows without bound, so a "
            "steady-state simulation never converges",
            "give a horizon (--horizon 10s) to watch it grow from empty, add workers, or lower the rate",
        )
    reps = [
        _replicate(workers, arrivals, service, random.Random(f"{seed}/{r}"), customers, warm, horizon)
        for r in range(replications)
    ]

    def est(name: str) -> Estimate:
        return estimate([getattr(rep, name) for rep in reps], confidence)

    return PoolSim(
        workers=workers,
        arrivals=arrivals,
        service=service,
        customers=customers,
        warmup=warm if horizon is None else 0,
        replications=replications,
        seed=seed,
        confidence=confidence,
        horizon=horizon,
        p_wait=est("p_wait"),
        wq=est("wq"),
        w=est("w"),
        lq=est("lq"),
        l=est("l"),
        little_l=estimate([rep.throughput * rep.w for rep in reps], confidence),
        throughput=est("throughput"),
        utilisation=est("utilisation"),
        p50=est("p50"),
        p95=est("p95"),
        p99=est("p99"),
        in_system_at_end=est("in_system_at_end"),
    )
