"""Random variates with a given mean and squared coefficient of variation (SCV = CV²),
drawn from a caller's seeded :class:`random.Random` (never the global one).

=================  ===========  ===========================================================
kind               SCV          shape
=================  ===========  ===========================================================
``deterministic``  0            every value is the mean
``gamma``          any > 0      shape 1/SCV (Erlang-k when 1/SCV is whole): smoother than Poisson
``exponential``    1            memoryless; Poisson arrivals
``h2``             ≥ 1          balanced-means two-phase hyperexponential: bursty
``lognormal``      any > 0      heavy right tail, common for measured service times
``batch``          2k − 1       arrivals only: batches of k at once, batches Poisson
``empirical``      measured     resample a measured list (trace-driven simulation)
=================  ===========  ===========================================================

``auto`` picks deterministic for SCV 0, gamma below 1, exponential at 1 and h2 above 1.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from foundry.errors import LabInputError

__all__ = ["KINDS", "PARAMETRIC", "Dist", "Sampler"]

KINDS: tuple[str, ...] = (
    "auto",
    "deterministic",
    "exponential",
    "gamma",
    "h2",
    "lognormal",
    "batch",
    "empirical",
)

PARAMETRIC: tuple[str, ...] = tuple(k for k in KINDS if k != "empirical")
"""Kinds :meth:`Dist.of` builds from a mean and a CV (``empirical`` needs the sample)."""

Sampler = Callable[[], float]


@dataclass(frozen=True, slots=True)
class Dist:
    """A distribution by mean, SCV and kind. ``values`` is the sample for ``empirical``."""

    mean: float
    scv: float = 1.0
    kind: str = "auto"
    values: tuple[float, ...] = field(default=(), repr=False)

    @classmethod
    def of(
        cls,
        mean: float,
        cv: float = 1.0,
        kind: str = "auto",
        *,
        field: str = "distribution",
        kind_field: str = "kind",
        kinds: tuple[str, ...] = PARAMETRIC,
    ) -> Dist:
        """Validate and resolve ``auto``; ``cv`` is the coefficient of variation (not squared).
        ``field`` names the CV and ``kind_field`` the kind in errors; ``kinds`` are allowed."""
        if kind not in kinds:
            raise LabInputError(
                kind_field, kind, "is not a known distribution", f"use one of {', '.join(kinds)}"
            )
        if not (math.isfinite(mean) and mean > 0):
            raise LabInputError(field, mean, "mean must be positive and finite", "give a positive mean")
        if not (math.isfinite(cv) and cv >= 0):
            raise LabInputError(
                field, cv, "coefficient of variation must be ≥ 0", "0 deterministic, 1 Poisson"
            )
        scv = cv * cv
        if kind == "auto":
            kind = (
                "deterministic" if scv == 0 else "gamma" if scv < 1 else "exponential" if scv == 1 else "h2"
            )
        if kind == "deterministic":
            scv = 0.0
        elif kind == "exponential":
            scv = 1.0
        elif kind == "h2" and scv < 1:
            raise LabInputError(field, cv, "is below 1, which a hyperexponential cannot have", "use gamma")
        elif kind in ("gamma", "lognormal") and scv == 0:
            kind = "deterministic"
        elif kind == "batch":
            k = max(1, round((scv + 1.0) / 2.0))
            scv = 2.0 * k - 1.0
        return cls(mean, scv, kind)

    @classmethod
    def empirical(cls, values: Sequence[float], *, field: str = "service times") -> Dist:
        clean = tuple(float(v) for v in values)
        if not clean:
            raise LabInputError(field, "[]", "is empty", "give at least one measured value")
        if any(not (math.isfinite(v) and v >= 0) for v in clean):
            raise LabInputError(
                field, "…", "contains a negative or non-finite value", "clean the measurements"
            )
        mean = math.fsum(clean) / len(clean)
        if mean <= 0:
            raise LabInputError(field, mean, "has a zero mean", "measure something that takes time")
        var = math.fsum((v - mean) ** 2 for v in clean) / max(1, len(clean) - 1)
        return cls(mean, var / (mean * mean), "empirical", clean)

    @property
    def cv(self) -> float:
        return math.sqrt(self.scv)

    @property
    def batch_size(self) -> int:
        return round((self.scv + 1.0) / 2.0) if self.kind == "batch" else 1

    def describe(self) -> str:
        if self.kind == "batch":
            return f"batches of {self.batch_size} (CV²={self.scv:g})"
        if self.kind == "empirical":
            return f"measured sample of {len(self.values)} (CV={self.cv:.2f})"
        return f"{self.kind} (CV={self.cv:.2f})"

    def sampler(self, rng: random.Random) -> Sampler:
        """A function drawing one value per call from ``rng``."""
        mean, scv = self.mean, self.scv
        if self.kind == "deterministic":
            return lambda: mean
        if self.kind == "exponential":
            rate = 1.0 / mean
            return lambda: rng.expovariate(rate)
        if self.kind == "gamma":
            shape, scale = 1.0 / scv, mean * scv
            return lambda: rng.gammavariate(shape, scale)
        if self.kind == "h2":
            p = (1.0 + math.sqrt((scv - 1.0) / (scv + 1.0))) / 2.0
            r1, r2 = 2.0 * p / mean, 2.0 * (1.0 - p) / mean
            return lambda: rng.expovariate(r1) if rng.random() < p else rng.expovariate(r2)
        if self.kind == "lognormal":
            sigma2 = math.log1p(scv)
            mu, sigma = math.log(mean) - sigma2 / 2.0, math.sqrt(sigma2)
            return lambda: rng.lognormvariate(mu, sigma)
        if self.kind == "empirical":
            values = self.values
            return lambda: values[rng.randrange(len(values))]
        # batch: k arrivals at once, batches Poisson with mean gap k·mean
        k = self.batch_size
        gap_rate = 1.0 / (k * mean)
        left = [0]

        def batch() -> float:
            if left[0] > 0:
                left[0] -= 1
                return 0.0
            left[0] = k - 1
            return rng.expovariate(gap_rate)

        return batch
