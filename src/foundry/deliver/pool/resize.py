"""The record of one resize of an elastic pool.

Its own module because two sides use it: the controller (``controller.py``) makes one
per resize, and the pool's metrics (``metrics.py``), which the controller writes to,
count it; neither has to import the other for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Resize"]


@dataclass(frozen=True, slots=True)
class Resize:
    """One decision of the controller that changed the pool's size, with its numbers."""

    at: float  # unix time
    before: int
    after: int
    model_workers: int  # what the model asked for, before clamping and shrink damping
    rate: float  # arrivals per second measured over the window
    service: float  # mean service seconds measured over the window
    target: float | None  # the p99 latency target (seconds)
    predicted_p99: float  # the model's p99 at ``after`` workers (inf: unstable)
    method: str
    reason: str

    def line(self, unit: str) -> str:
        p99 = "unstable" if math.isinf(self.predicted_p99) else f"{self.predicted_p99 * 1000:.1f} ms"
        target = "none" if self.target is None else f"{self.target * 1000:.0f} ms"
        return (
            f"unit {unit!r}: pool {self.before} → {self.after} workers: arrivals {self.rate:.1f}/s, "
            f"service {self.service * 1000:.2f} ms, p99 target {target}; {self.method} predicts p99 {p99} "
            f"at {self.after} ({self.reason})"
        )
