"""Loop lag: how late a callback scheduled on an event loop actually ran.

:class:`LoopMonitor` schedules a callback every ``interval`` and records, in
``foundry_loop_lag_seconds{loop}``, how long after it was due it ran: the direct
measurement of "a ready task is not running". The watchdog (``foundry.observe.watchdog``)
builds on it; it is usable alone on any loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque

from foundry.observe import names
from foundry.observe.metrics import Registry

__all__ = ["LAG_HELP", "LoopMonitor", "on_loop_thread"]

LAG_HELP = "Seconds a due callback waited for the event loop"


class LoopMonitor:
    """Measures a loop's lag: a callback every ``interval`` s, its lateness recorded."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        registry: Registry | None = None,
        name: str = "main",
        interval: float = 0.05,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"loop monitor {name!r}: interval={interval!r} must be > 0 seconds")
        self.loop = loop
        self.name = name
        self.interval = interval
        self.registry = registry if registry is not None else Registry()
        self.lag = self.registry.histogram(names.LOOP_LAG, LAG_HELP, ("loop",)).labels(name)
        self.due: float | None = None  # monotonic time the next tick is due
        self.thread_id: int | None = None
        self.ticks = 0
        self.busy = 0.0  # seconds the loop spent in this monitor's callbacks (its cost)
        self.recent: deque[tuple[float, float]] = deque(maxlen=16)  # (due, lag)
        self._handle: asyncio.TimerHandle | asyncio.Handle | None = None
        self._running = False

    def start(self) -> None:
        if self._running:
            return
        self._running = True
        if on_loop_thread(self.loop):
            self._first()  # now: a block that starts right after this call is seen
        else:
            self._handle = self.loop.call_soon_threadsafe(self._first)

    def _first(self) -> None:
        self.thread_id = threading.get_ident()
        self.due = time.monotonic() + self.interval
        self._handle = self.loop.call_later(self.interval, self._tick)

    def _tick(self) -> None:
        now = time.monotonic()
        due = self.due if self.due is not None else now
        lag = now - due if now > due else 0.0
        self.lag.observe(lag)
        self.recent.append((due, lag))
        self.ticks += 1
        if self._running:
            self.due = now + self.interval
            self._handle = self.loop.call_later(self.interval, self._tick)
        self.busy += time.monotonic() - now

    def resume(self) -> None:
        """Tick again, from now (a loop its owner runs one call at a time: call this from
        that thread just before running the loop)."""
        self._running = True
        self._first()

    def pause(self) -> tuple[float, float] | None:
        """Stop ticking while the loop is not running (from its owner thread, right after
        it ran): the time it sits stopped is not lag. A tick that was overdue when the
        loop stopped is recorded now; returns its ``(due, lateness)``."""
        self._running = False
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.cancel()
        due, self.due = self.due, None
        if due is None:
            return None
        late = time.monotonic() - due
        if late <= 0:
            return None
        self.lag.observe(late)
        self.recent.append((due, late))
        self.ticks += 1
        return due, late

    def lag_for(self, due: float) -> float | None:
        for seen, lag in reversed(self.recent):
            if seen == due:
                return lag
        return None

    def stop(self) -> None:
        self._running = False
        handle, self._handle = self._handle, None
        if handle is None or self.loop.is_closed():
            return
        if on_loop_thread(self.loop):
            handle.cancel()
        else:
            try:
                self.loop.call_soon_threadsafe(handle.cancel)
            except RuntimeError:  # closed meanwhile
                pass

    def summary(self) -> dict[str, float]:
        """p50/p99/max lag in seconds, and the sample count."""
        return self.lag.summary()


def on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
