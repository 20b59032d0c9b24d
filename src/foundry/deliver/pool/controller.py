"""The elastic controller: a pool that sizes itself with the lab's queueing model.

Every ``interval`` (0.5 s) the controller reads its engine's counters and measures,
over the last ``window`` seconds (2 s), the **arrival rate** λ (attempts handed to the
engine per second) and the **service time** S: the mean of how long each attempt held
its worker, from the dispatcher's hand-off to its answer (the run, plus the pipes and
the worker's wake-up, which on a busy machine add a good part). It then asks M/M/c —
exact Erlang C, :func:`foundry.lab.queueing.mmc_response_quantile` — for the fewest
workers ``c`` whose **p99 response time** (waiting + service) is within the unit's
``latency=`` target, and clamps that to ``[min_workers, max_workers]``:

* no ``latency=`` declared: the fewest workers that keep utilisation ρ = λS/c ≤ 0.75;
* a target the service time alone cannot meet (M/M/c's p99 of service alone is
  S·ln 100 ≈ 4.6 S): the fewest workers for which P(wait) ≤ 1 %, so that the queue adds
  nothing to the p99 that more workers could remove — and the record says so;
* no arrivals: ``min_workers``.

It **grows at once** and **shrinks only after** the model has asked for fewer workers
on every tick for ``shrink_after`` seconds (3 s), to the largest of those answers, so a
lull between bursts does not shed workers that the next burst needs.

Every resize is a :class:`Resize` record (kept, the last 100), a log line at INFO, and
metrics: ``foundry_pool_resizes_total{unit,direction}`` and the gauges
``foundry_pool_target_workers``, ``foundry_pool_arrival_rate``,
``foundry_pool_service_seconds`` and ``foundry_pool_predicted_p99_seconds``, which hold
the numbers of the last decision. M/M/c assumes Poisson arrivals and exponential
service: for steadier work it over-provisions a little, which is the safe side.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from foundry.backends.pool import EngineStats, Sizable
from foundry.deliver.pool.resize import Resize
from foundry.lab.queueing import ERLANG_C, erlang_c, mmc_response_quantile

if TYPE_CHECKING:
    from foundry.deliver.pool.metrics import PoolMetrics

__all__ = ["Controller", "Resize", "size_for"]

log = logging.getLogger("foundry.pool")

UTILISATION = 0.75  # the ceiling when no latency target is declared
P_WAIT = 0.01  # when the target is out of the queue's reach: P(wait) at most this
QUANTILE = 0.99


def size_for(rate: float, service: float, target: float | None) -> tuple[int, str]:
    """The fewest workers the model says hold ``target`` (p99, seconds) at ``rate``
    arrivals/s of mean ``service`` seconds, unclamped, with the reason."""
    if rate <= 0 or service <= 0:
        return 0, "no arrivals"
    a = rate * service
    c = max(1, math.floor(a) + 1)  # the fewest with ρ < 1
    if target is None:
        c = max(c, math.ceil(a / UTILISATION))
        return c, f"no latency target: ρ ≤ {UTILISATION}"
    if service * math.log(1.0 / (1.0 - QUANTILE)) >= target:
        while erlang_c(c, a) > P_WAIT:
            c += 1
        return c, (
            f"the target is below the service time's own p99 (≈ {service * math.log(100) * 1000:.1f} ms): "
            f"sized for P(wait) ≤ {P_WAIT:.0%}"
        )
    while mmc_response_quantile(QUANTILE, c, service, rate) > target:
        c += 1
    return c, "p99 within the target"


class Controller:
    """Resizes a :class:`Sizable` engine to hold a p99 target (module docstring)."""

    def __init__(
        self,
        unit: str,
        engine: Sizable,
        *,
        minimum: int,
        maximum: int,
        target: float | None,
        est: float | None = None,
        metrics: PoolMetrics | None = None,
        interval: float = 0.5,
        window: float = 2.0,
        shrink_after: float = 3.0,
    ) -> None:
        self.unit = unit
        self.engine = engine
        self.minimum = minimum
        self.maximum = maximum
        self.target = target
        self.interval = interval
        self.window = window
        self.shrink_after = shrink_after
        self.metrics = metrics
        self.resizes: deque[Resize] = deque(maxlen=100)
        self._samples: deque[tuple[float, EngineStats]] = deque()
        self._service = est or 0.0
        self._lower_since: float | None = None
        self._lower_max = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"foundry-pool-size-{self.unit}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.tick(time.monotonic(), self.engine.stats())
            except Exception:  # the controller must never take the pool down
                log.exception("unit %r: the pool controller failed on one tick", self.unit)

    def measure(self, now: float, stats: EngineStats) -> tuple[float, float] | None:
        """``(rate, service)`` over the window, or ``None`` until there is a window."""
        self._samples.append((now, stats))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window:
            self._samples.popleft()
        then, old = self._samples[0]
        span = now - then
        if span < min(self.window, self.interval) * 0.5:
            return None
        rate = (stats.arrivals - old.arrivals) / span
        served = stats.served - old.served
        if served > 0:
            self._service = (stats.service_seconds - old.service_seconds) / served
        return rate, self._service

    def tick(self, now: float, stats: EngineStats) -> Resize | None:
        """One look at the engine; returns the resize it made, if any."""
        measured = self.measure(now, stats)
        if measured is None:
            return None
        rate, service = measured
        if service <= 0:
            return None
        wanted, reason = size_for(rate, service, self.target)
        clamped = min(self.maximum, max(self.minimum, wanted))
        current = self.engine.size()
        if self.metrics is not None:
            self.metrics.model(rate, service, self.target, clamped, _p99(clamped, service, rate))
        if clamped > current:
            self._lower_since = None
            return self._resize(current, clamped, wanted, rate, service, reason)
        if clamped < current:
            if self._lower_since is None:
                self._lower_since, self._lower_max = now, clamped
            self._lower_max = max(self._lower_max, clamped)
            if now - self._lower_since >= self.shrink_after:
                after = self._lower_max
                self._lower_since = None
                return self._resize(
                    current,
                    after,
                    wanted,
                    rate,
                    service,
                    f"{reason}; fewer wanted for {self.shrink_after:g}s",
                )
            return None
        self._lower_since = None
        return None

    def _resize(
        self, before: int, after: int, wanted: int, rate: float, service: float, reason: str
    ) -> Resize:
        record = Resize(
            at=time.time(),
            before=before,
            after=after,
            model_workers=wanted,
            rate=rate,
            service=service,
            target=self.target,
            predicted_p99=_p99(after, service, rate),
            method=ERLANG_C,
            reason=reason,
        )
        self.engine.resize(after)
        self.resizes.append(record)
        log.info("%s", record.line(self.unit))
        if self.metrics is not None:
            self.metrics.resized(record)
        return record

    def snapshot(self) -> dict[str, Any]:
        return {"unit": self.unit, "min": self.minimum, "max": self.maximum, "target": self.target}


def _p99(workers: int, service: float, rate: float) -> float:
    if workers < 1 or service <= 0:
        return math.inf
    if rate <= 0:
        return service * math.log(100)
    return mmc_response_quantile(QUANTILE, workers, service, rate)
