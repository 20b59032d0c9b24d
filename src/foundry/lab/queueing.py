"""Closed-form queueing models for a pool of ``c`` identical workers fed by one FCFS queue.

Every result carries the name of the method that produced it, because the methods do
not agree and the reader must know which one they are quoting:

- ``"Erlang C (exact M/M/c)"``: Poisson arrivals, exponential service. Exact. Evaluated
  through the Erlang B recursion ``B(k) = a·B(k-1) / (k + a·B(k-1))``, which stays in
  [0, 1] at every step, so it is stable for thousands of workers (no factorials, no
  ``a**c`` overflow).
- ``"Allen–Cunneen G/G/c approx."``: Erlang C's queueing delay scaled by
  ``(ca² + cs²) / 2`` — the usual approximation for general arrival and service
  variability (``ca``, ``cs`` are coefficients of variation; 1 is Poisson/exponential).
  Exact for M/M/c, exact for M/G/1 (Pollaczek–Khinchine), good to ~10 % elsewhere.
- ``"Sakasegawa G/G/c approx."``: Sakasegawa's (1977) closed form for the probability of
  waiting, ``ρ^(√(2(c+1)) − 1)``, with the same Kingman factor ``(ca² + cs²) / 2``
  (Hopp & Spearman's *Factory Physics* formula). It needs no Erlang C at all, which is
  why simulators and calculators use it — and it is the formula behind seed 003's
  "W 59.8 ms" for 8 workers at ρ = 0.75 (exact Erlang C gives 58.9 ms).

Times are seconds, rates per second. ``ρ ≥ 1`` has no steady state: the queue grows
without bound, and :func:`analyse_pool` says so instead of returning a number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from foundry.errors import LabInputError

__all__ = [
    "ALLEN_CUNNEEN",
    "ERLANG_C",
    "SAKASEGAWA",
    "Metrics",
    "PoolAnalysis",
    "allen_cunneen",
    "analyse_pool",
    "check_positive",
    "erlang_b",
    "erlang_c",
    "mmc",
    "mmc_response_quantile",
    "sakasegawa",
    "workers_for",
]

ERLANG_C = "Erlang C (exact M/M/c)"
ALLEN_CUNNEEN = "Allen–Cunneen G/G/c approx."
SAKASEGAWA = "Sakasegawa G/G/c approx."


def check_positive(name: str, value: float, fix: str, *, allow_zero: bool = False) -> float:
    """``value`` as a float, or :class:`LabInputError` naming ``name`` and the fix."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LabInputError(name, value, "is not a number", fix)
    number = float(value)
    if not math.isfinite(number):
        raise LabInputError(name, value, "is not finite", fix)
    if number < 0 or (number == 0 and not allow_zero):
        raise LabInputError(name, value, "must be positive" if not allow_zero else "is negative", fix)
    return number


def check_workers(name: str, value: int, fix: str = "give at least 1 worker") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise LabInputError(name, value, "is not a whole number of workers", fix)
    if value < 1:
        raise LabInputError(name, value, "must be at least 1", fix)
    return value


def erlang_b(c: int, a: float) -> float:
    """Erlang B: probability that all ``c`` servers are busy in M/M/c/c at offered load ``a``."""
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    return b


def erlang_c(c: int, a: float) -> float:
    """Erlang C: probability that an arrival waits in M/M/c at offered load ``a = λ/μ < c``."""
    rho = a / c
    if rho >= 1.0:
        return 1.0
    b = erlang_b(c, a)
    return b / (1.0 - rho * (1.0 - b))


@dataclass(frozen=True, slots=True)
class Metrics:
    """Steady-state figures of one method. ``half_widths`` holds the confidence-interval
    half-width of each field for a simulation (empty for closed forms)."""

    method: str
    p_wait: float
    wq: float
    """Mean time waiting in the queue (s)."""
    w: float
    """Mean response time, queue + service (s)."""
    lq: float
    """Mean number waiting."""
    l: float  # noqa: E741 - L is the name the literature uses
    """Mean number in the system (waiting + in service)."""
    little_l: float
    """λ × W: Little's law. Equal to ``l`` by construction for closed forms; for a
    simulation ``l`` is the time-averaged count and ``little_l`` is λ̂ × mean W,
    measured independently."""
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    note: str = ""
    half_widths: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "method": self.method,
            "p_wait": self.p_wait,
            "wq_s": self.wq,
            "w_s": self.w,
            "lq": self.lq,
            "l": self.l,
            "little_l": self.little_l,
            "p50_s": self.p50,
            "p95_s": self.p95,
            "p99_s": self.p99,
            "note": self.note,
        }
        if self.half_widths:
            out["ci_half_widths"] = dict(self.half_widths)
        return out


def _check(c: int, service: float, rate: float) -> tuple[int, float, float]:
    c = check_workers("workers", c)
    service = check_positive("service", service, 'give the mean service time, e.g. "50ms"')
    rate = check_positive("rate", rate, 'give a non-negative arrival rate, e.g. "120/s"', allow_zero=True)
    return c, service, rate


def _check_cv(name: str, value: float) -> float:
    return check_positive(
        name,
        value,
        "give a coefficient of variation ≥ 0 (0 deterministic, 1 Poisson/exponential)",
        allow_zero=True,
    )


def _unstable(c: int, service: float, rate: float) -> bool:
    return rate * service / c >= 1.0


def _from_wq(
    method: str, c: int, service: float, rate: float, p_wait: float, wq: float, note: str
) -> Metrics:
    w = wq + service
    return Metrics(method, p_wait, wq, w, rate * wq, rate * w, rate * w, note=note)


def mmc(c: int, service: float, rate: float) -> Metrics | None:
    """Exact M/M/c (Erlang C) with percentiles of the response time; ``None`` when ρ ≥ 1."""
    c, service, rate = _check(c, service, rate)
    if _unstable(c, service, rate):
        return None
    a = rate * service
    pw = erlang_c(c, a)
    wq = pw / (c / service - rate) if rate > 0 else 0.0
    base = _from_wq(ERLANG_C, c, service, rate, pw, wq, "Poisson arrivals, exponential service; exact")
    return Metrics(
        base.method,
        base.p_wait,
        base.wq,
        base.w,
        base.lq,
        base.l,
        base.little_l,
        p50=mmc_response_quantile(0.50, c, service, rate),
        p95=mmc_response_quantile(0.95, c, service, rate),
        p99=mmc_response_quantile(0.99, c, service, rate),
        note=base.note,
    )


def allen_cunneen(c: int, service: float, rate: float, ca: float = 1.0, cs: float = 1.0) -> Metrics | None:
    """Allen–Cunneen G/G/c: ``Wq ≈ Wq(M/M/c) · (ca² + cs²)/2``; ``None`` when ρ ≥ 1."""
    c, service, rate = _check(c, service, rate)
    ca, cs = _check_cv("ca", ca), _check_cv("cs", cs)
    if _unstable(c, service, rate):
        return None
    a = rate * service
    pw = erlang_c(c, a)
    wq_mmc = pw / (c / service - rate) if rate > 0 else 0.0
    factor = (ca * ca + cs * cs) / 2.0
    return _from_wq(
        ALLEN_CUNNEEN,
        c,
        service,
        rate,
        pw,
        wq_mmc * factor,
        f"Erlang C delay × (ca²+cs²)/2 = × {factor:.3g} (ca={ca:g}, cs={cs:g})",
    )


def sakasegawa(c: int, service: float, rate: float, ca: float = 1.0, cs: float = 1.0) -> Metrics | None:
    """Sakasegawa / Hopp–Spearman G/G/c: ``Wq ≈ (ca²+cs²)/2 · ρ^(√(2(c+1))−1) / (c(1−ρ)) · S``."""
    c, service, rate = _check(c, service, rate)
    ca, cs = _check_cv("ca", ca), _check_cv("cs", cs)
    if _unstable(c, service, rate):
        return None
    rho = rate * service / c
    pw = rho ** (math.sqrt(2.0 * (c + 1)) - 1.0) if rho > 0 else 0.0
    factor = (ca * ca + cs * cs) / 2.0
    wq = factor * pw / (c * (1.0 - rho)) * service
    return _from_wq(
        SAKASEGAWA,
        c,
        service,
        rate,
        pw,
        wq,
        f"P(wait) ≈ ρ^(√(2(c+1))−1) (Sakasegawa 1977), × (ca²+cs²)/2 = × {factor:.3g}",
    )


def _response_tail(t: float, c: int, service: float, rate: float) -> float:
    """P(W > t) for M/M/c: W = Wq + S, Wq = 0 w.p. 1−C else Exp(cμ−λ), S ~ Exp(μ)."""
    mu = 1.0 / service
    theta = c * mu - rate
    pw = erlang_c(c, rate * service)
    if abs(theta - mu) < 1e-12 * mu:
        both = (1.0 + mu * t) * math.exp(-mu * t)
    else:
        both = (theta * math.exp(-mu * t) - mu * math.exp(-theta * t)) / (theta - mu)
    return (1.0 - pw) * math.exp(-mu * t) + pw * both


def mmc_response_quantile(q: float, c: int, service: float, rate: float) -> float:
    """The ``q`` quantile of the M/M/c response time (queue + service), exact, by bisection."""
    if not 0.0 < q < 1.0:
        raise LabInputError("quantile", q, "is not strictly between 0 and 1", "pass e.g. 0.99")
    c, service, rate = _check(c, service, rate)
    if _unstable(c, service, rate):
        return math.inf
    lo, hi = 0.0, service
    while _response_tail(hi, c, service, rate) > 1.0 - q:
        hi *= 2.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        if _response_tail(mid, c, service, rate) > 1.0 - q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def workers_for(
    service: float,
    rate: float,
    *,
    target: float,
    ca: float = 1.0,
    cs: float = 1.0,
    max_utilisation: float = 1.0,
    limit: int = 1_000_000,
) -> int:
    """Smallest worker count whose Allen–Cunneen mean response time is ≤ ``target`` seconds
    and whose utilisation is ≤ ``max_utilisation`` (exact Erlang C when ca = cs = 1)."""
    service = check_positive("service", service, 'give the mean service time, e.g. "50ms"')
    rate = check_positive("rate", rate, 'give an arrival rate, e.g. "120/s"', allow_zero=True)
    target = check_positive("target", target, 'give a latency target, e.g. "100ms"')
    if target <= service:
        raise LabInputError(
            "target",
            target,
            f"is not above the mean service time {service * 1000:.3g} ms, so no pool size can meet it",
            "raise the target or make the work faster",
        )
    c = max(1, math.floor(rate * service / max_utilisation) + 1) if rate > 0 else 1
    while c <= limit:
        if rate * service / c <= max_utilisation:
            m = allen_cunneen(c, service, rate, ca, cs)
            if m is not None and m.w <= target:
                return c
        c += 1
    raise LabInputError(
        "rate", rate, f"needs more than {limit} workers", "lower the rate or the service time"
    )


@dataclass(frozen=True, slots=True)
class PoolAnalysis:
    """A pool of ``workers`` with mean service ``service`` s at ``rate`` arrivals/s."""

    workers: int
    service: float
    rate: float
    ca: float
    cs: float
    capacity: float
    """workers / service (requests/s)."""
    utilisation: float
    """ρ = rate / capacity."""
    methods: tuple[Metrics, ...]
    """Empty when ρ ≥ 1."""
    unbounded: str | None
    """Why there is no steady state (ρ ≥ 1), or ``None``."""
    workers_for_stability: int
    """Smallest worker count with ρ < 1."""

    @property
    def stable(self) -> bool:
        return self.unbounded is None

    def method(self, name: str) -> Metrics:
        for m in self.methods:
            if m.method == name:
                return m
        raise KeyError(name)

    def as_dict(self) -> dict[str, object]:
        return {
            "inputs": {
                "workers": self.workers,
                "service_s": self.service,
                "rate_per_s": self.rate,
                "ca": self.ca,
                "cs": self.cs,
            },
            "capacity_per_s": self.capacity,
            "utilisation": self.utilisation,
            "stable": self.stable,
            "unbounded": self.unbounded,
            "workers_for_stability": self.workers_for_stability,
            "methods": [m.as_dict() for m in self.methods],
        }


def analyse_pool(workers: int, service: float, rate: float, ca: float = 1.0, cs: float = 1.0) -> PoolAnalysis:
    """Capacity, utilisation and every closed form that applies, side by side."""
    workers, service, rate = _check(workers, service, rate)
    ca, cs = _check_cv("ca", ca), _check_cv("cs", cs)
    capacity = workers / service
    rho = rate / capacity
    stable_at = math.floor(rate * service) + 1
    if rho >= 1.0:
        reason = (
            f"arrivals {rate:g}/s ≥ capacity {capacity:.1f}/s (ρ = {rho:.3f}): the queue grows without "
            f"bound, so W and L have no steady-state value. Need ≥ {stable_at} workers for ρ < 1, or "
            "shed/bound the intake"
        )
        return PoolAnalysis(workers, service, rate, ca, cs, capacity, rho, (), reason, stable_at)
    found = (allen_cunneen(workers, service, rate, ca, cs), sakasegawa(workers, service, rate, ca, cs))
    methods = tuple(m for m in (mmc(workers, service, rate), *found) if m is not None)
    return PoolAnalysis(workers, service, rate, ca, cs, capacity, rho, methods, None, stable_at)
