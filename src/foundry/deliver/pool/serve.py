"""``foundry pool serve``: this host's workers for an app's ``pool`` units.

One worker host per unit (:func:`foundry.backends.pool.open_worker_host`: on NATS, a
dispatcher that subscribes to the unit's subject while a worker is free; on ``local://``,
the embedded dispatcher served on a Unix socket under the app's home), each with its own
elastic controller between ``min`` and ``max`` workers. The server sees units as
:class:`~foundry.runtime.UnitSpec` only, never the app.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from foundry.backends.pool import EngineSpec, Sizable, open_worker_host
from foundry.deliver.pool.controller import Controller
from foundry.deliver.pool.metrics import PoolMetrics
from foundry.deliver.pool.runner import check_importable, worker_bounds
from foundry.runtime import RuntimeContext, UnitSpec

__all__ = ["PoolServer", "Served"]

log = logging.getLogger("foundry.pool")

READY_TIMEOUT = 60.0


@dataclass
class Served:
    """One unit served on this host."""

    spec: UnitSpec
    host: Sizable
    metrics: PoolMetrics
    controller: Controller | None = None
    bounds: tuple[int, int] = field(default=(1, 1))


class PoolServer:
    """Workers for ``specs`` on this host, behind the pool engine at ``url``."""

    def __init__(
        self,
        url: str,
        specs: list[UnitSpec],
        ctx: RuntimeContext,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> None:
        self.url = url
        self.ctx = ctx
        self.served: dict[str, Served] = {}
        try:
            for spec in specs:
                self._serve(spec, minimum, maximum)
        except BaseException:
            self.close(timeout=2.0)
            raise

    def _serve(self, spec: UnitSpec, minimum: int | None, maximum: int | None) -> None:
        check_importable(spec, self.url)
        low, high = worker_bounds(spec)
        low = minimum if minimum is not None else low
        high = max(low, maximum if maximum is not None else high)
        engine_spec = EngineSpec(
            app=self.ctx.app_name,
            unit=spec.name,
            codec=spec.traits.codec,
            module=spec.module,
            qualname=spec.qualname,
            workers=low,
            home=str(self.ctx.settings.home),
        )
        host = open_worker_host(self.url, engine_spec)
        served_ready = getattr(host, "wait_ready", None)
        try:
            if served_ready is not None:
                served_ready(READY_TIMEOUT)
        except BaseException:
            getattr(host, "close", lambda timeout: None)(1.0)
            raise
        metrics = PoolMetrics(self.ctx.metrics, spec.name, host.stats, lambda: 0)
        served = Served(spec, host, metrics, bounds=(low, high))
        if high > low:
            served.controller = Controller(
                spec.name,
                host,
                minimum=low,
                maximum=high,
                target=spec.traits.latency,
                est=spec.traits.est,
                metrics=metrics,
            )
            served.controller.start()
        self.served[spec.name] = served

    def status(self) -> list[dict[str, Any]]:
        rows = []
        for name, served in self.served.items():
            stats = served.host.stats()
            rows.append(
                {
                    "unit": name,
                    "workers": served.host.size(),
                    "live": stats.live,
                    "busy": stats.busy,
                    "served": stats.served,
                    "restarts": stats.restarts,
                    "bounds": served.bounds,
                    "where": getattr(served.host, "path", "") or self.url,
                }
            )
        return rows

    def close(self, timeout: float = 30.0) -> None:
        """Each worker finishes the request it is running (within ``timeout``) and exits."""
        for served in self.served.values():
            if served.controller is not None:
                served.controller.stop()
        closing = [
            threading.Thread(target=close, args=(timeout,), name="foundry-pool-close")
            for close in (getattr(s.host, "close", None) for s in self.served.values())
            if close is not None
        ]
        for thread in closing:  # every unit stops taking requests at once, then drains
            thread.start()
        for thread in closing:
            thread.join()
        for served in self.served.values():
            served.metrics.close()
