"""The work pool's metrics, under the stable names of :mod:`foundry.observe.names`.

Per unit: ``foundry_unit_in_flight`` (open requests), ``foundry_unit_completed_total``,
``foundry_unit_failed_total`` and ``foundry_unit_duration_seconds`` (submit to answer,
retries included) with ``model="pool"``; ``foundry_pool_queue_wait_seconds`` (how long
attempts waited for a free worker); ``foundry_queue_depth`` (attempts waiting now);
``foundry_pool_busy``; ``foundry_pool_workers{state}`` and one
``foundry_pool_worker_state{worker,state}`` per worker; ``foundry_pool_rejected_total``
(refused at the intake), ``foundry_pool_lost_total`` (attempts lost),
``foundry_pool_retries_total``; ``foundry_child_exits_total{code}`` and
``foundry_child_restarts_total`` (dead workers and their replacements); and the elastic
controller's ``foundry_pool_resizes_total{direction}`` with the numbers of its last
decision (``foundry_pool_target_workers``, ``foundry_pool_arrival_rate``,
``foundry_pool_service_seconds``, ``foundry_pool_predicted_p99_seconds``,
``foundry_pool_latency_target_seconds``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from foundry.observe import names
from foundry.observe.metrics import Registry

if TYPE_CHECKING:
    from foundry.deliver.pool.resize import Resize

__all__ = ["PoolMetrics"]

MODEL = "pool"
_STATES = ("idle", "busy", "starting", "retiring")


class PoolMetrics:
    """Registers one unit's pool metrics; the engine's counters are read at read time."""

    def __init__(
        self, registry: Registry, unit: str, stats: Callable[[], Any], open_requests: Callable[[], int]
    ) -> None:
        self.unit = unit
        self._stats = stats
        labels = (unit, MODEL)
        two = ("unit", "model")
        self.in_flight = registry.gauge(names.UNIT_IN_FLIGHT, "Units running now", two).labels(*labels)
        self.completed = registry.counter(names.UNIT_COMPLETED, "Units completed", two).labels(*labels)
        self.failed = registry.counter(names.UNIT_FAILED, "Units that raised", two).labels(*labels)
        self.duration = registry.histogram(names.UNIT_DURATION, "Seconds per unit", two).labels(*labels)
        self.queue_wait = registry.histogram(
            names.POOL_QUEUE_WAIT, "Seconds an attempt waited for a free worker", ("unit",)
        ).labels(unit)
        self.rejected = registry.counter(
            names.POOL_REJECTED, "Submissions refused by a full intake", ("unit",)
        ).labels(unit)
        self.retried = registry.counter(
            names.POOL_RETRIES, "Lost attempts of idempotent units sent to another worker", ("unit",)
        ).labels(unit)
        self.lost = registry.counter(
            names.POOL_LOST, "Requests that ended lost (worker died, timed out, cut off)", ("unit",)
        ).labels(unit)
        self._resizes = registry.counter(names.POOL_RESIZES, "Elastic resizes", ("unit", "direction"))
        self._exits = registry.counter(
            names.CHILD_EXITS, "Child process exits, by exit code", ("unit", "code")
        )
        self.restarts = registry.counter(names.CHILD_RESTARTS, "Child processes replaced", ("unit",)).labels(
            unit
        )
        gauge = registry.gauge
        self._target = gauge(names.POOL_TARGET_WORKERS, "Workers the controller sized for", ("unit",)).labels(
            unit
        )
        self._rate = gauge(names.POOL_ARRIVAL_RATE, "Measured arrivals per second", ("unit",)).labels(unit)
        self._service = gauge(names.POOL_SERVICE_SECONDS, "Measured mean service seconds", ("unit",)).labels(
            unit
        )
        self._p99 = gauge(names.POOL_PREDICTED_P99, "M/M/c p99 at the chosen size", ("unit",)).labels(unit)
        self._goal = gauge(names.POOL_LATENCY_TARGET, "The unit's p99 latency target", ("unit",)).labels(unit)
        self._open = open_requests
        self._lock = threading.Lock()
        self._seen_exits: dict[str, int] = {}
        self._seen_restarts = 0
        mine: Mapping[str, str] = {"unit": unit}

        def one(read: Callable[[Any], float]) -> Callable[[], Iterable[tuple[Mapping[str, str], float]]]:
            def collect() -> list[tuple[Mapping[str, str], float]]:
                s = self._stats()
                return [] if s is None else [(mine, float(read(s)))]

            return collect

        self._unregister = [
            registry.collect(
                names.QUEUE_DEPTH, "Items accepted and not started, per hand-off", one(lambda s: s.waiting)
            ),
            registry.collect(names.POOL_BUSY, "Busy workers", one(lambda s: s.busy)),
            registry.collect(names.POOL_WORKERS, "Workers by state", self._by_state),
            registry.collect(
                names.POOL_WORKER_STATE, "1 per worker, labelled with its state", self._per_worker
            ),
            registry.on_read(self._sync),
        ]

    def _by_state(self) -> list[tuple[Mapping[str, str], float]]:
        s = self._stats()
        if s is None:
            return []
        counts = dict.fromkeys(_STATES, 0)
        for _, state in s.workers:
            counts[state] = counts.get(state, 0) + 1
        return [({"unit": self.unit, "state": k}, float(v)) for k, v in counts.items()]

    def _per_worker(self) -> list[tuple[Mapping[str, str], float]]:
        s = self._stats()
        if s is None:
            return []
        return [({"unit": self.unit, "worker": w, "state": state}, 1.0) for w, state in s.workers]

    def _sync(self) -> None:
        """Bring the exit and restart counters up to the engine's (monotonic) counts."""
        self.in_flight.set(self._open())
        s = self._stats()
        if s is None:
            return
        with self._lock:
            for code, count in s.exits:
                seen = self._seen_exits.get(code, 0)
                if count > seen:
                    self._exits.labels(self.unit, code).inc(count - seen)
                    self._seen_exits[code] = count
            if s.restarts > self._seen_restarts:
                self.restarts.inc(s.restarts - self._seen_restarts)
                self._seen_restarts = s.restarts

    def arrived(self) -> None:
        self.in_flight.inc()

    def finished(self, seconds: float, *, ok: bool) -> None:
        self.in_flight.dec()
        (self.completed if ok else self.failed).inc()
        self.duration.observe(seconds)

    def model(self, rate: float, service: float, target: float | None, workers: int, p99: float) -> None:
        self._rate.set(rate)
        self._service.set(service)
        self._target.set(workers)
        self._p99.set(p99)
        if target is not None:
            self._goal.set(target)

    def resized(self, record: Resize) -> None:
        self._resizes.labels(self.unit, "up" if record.after > record.before else "down").inc()

    def close(self) -> None:
        self._sync()
        for unregister in self._unregister:
            unregister()
