"""Small, dependency-free statistics for the lab: Student-t confidence intervals over
independent replications, and empirical quantiles.

The t quantile is computed exactly (regularised incomplete beta by Lentz's continued
fraction, inverted by bisection), so a confidence interval from 3 replications is as
honest as one from 300. No numpy, no scipy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from foundry.errors import LabInputError

__all__ = ["Estimate", "estimate", "quantile", "t_quantile"]


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction for the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(c) > tiny else 1.0 + aa / tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(c) > tiny else 1.0 + aa / tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _t_cdf(t: float, df: float) -> float:
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (0 < p < 1)."""
    if not 0.0 < p < 1.0:
        raise LabInputError("p", p, "is not a probability strictly between 0 and 1", "pass e.g. 0.975")
    if df <= 0:
        raise LabInputError("df", df, "must be positive", "use at least 2 replications")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if _t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


@dataclass(frozen=True, slots=True)
class Estimate:
    """A mean over independent replications with its confidence interval."""

    mean: float
    half_width: float
    """Half-width of the interval: the truth lies in ``mean ± half_width`` with ``confidence``."""
    confidence: float
    n: int
    """Number of replications behind the estimate."""

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def as_dict(self) -> dict[str, float | int]:
        return {
            "mean": self.mean,
            "half_width": self.half_width,
            "low": self.low,
            "high": self.high,
            "confidence": self.confidence,
            "replications": self.n,
        }


def estimate(values: Sequence[float], confidence: float = 0.95) -> Estimate:
    """Mean and Student-t confidence interval of independent replication results."""
    if not 0.0 < confidence < 1.0:
        raise LabInputError(
            "confidence", confidence, "is not strictly between 0 and 1", "pass e.g. 0.95 or 0.99"
        )
    n = len(values)
    if n == 0:
        raise LabInputError("replications", 0, "gave no results", "run at least 2 replications")
    mean = math.fsum(values) / n
    if n == 1:
        return Estimate(mean, math.inf, confidence, 1)
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * math.sqrt(variance / n)
    return Estimate(mean, half, confidence, n)


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of already-sorted data (nearest rank; 0.0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[rank]
