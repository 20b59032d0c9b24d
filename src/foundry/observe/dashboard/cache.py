"""A small time-to-live cache with single flight: however many tabs poll, one engine
query per key per ``ttl`` seconds.

Concurrent callers of a missing key wait for the first one's answer instead of asking
the engine themselves; an error is cached too (for the same ``ttl``), so a down engine
is not hammered by every open page.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["TTLCache"]


class _Slot:
    __slots__ = ("at", "done", "error", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.at = 0.0


class TTLCache:
    """``get(key, ttl, compute)``: the cached value when younger than ``ttl``, else
    ``compute()`` run once for every concurrent caller. At most ``size`` keys."""

    def __init__(self, size: int = 256, clock: Callable[[], float] = time.monotonic) -> None:
        self.size = size
        self.clock = clock
        self.misses = 0  # computations run (what the engines saw)
        self.hits = 0
        self._slots: OrderedDict[Hashable, _Slot] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, ttl: float, compute: Callable[[], Any], wait: float = 30.0) -> Any:
        with self._lock:
            slot = self._slots.get(key)
            fresh = slot is not None and (not slot.done.is_set() or self.clock() - slot.at < ttl)
            if slot is not None and fresh:
                self._slots.move_to_end(key)
                self.hits += 1
                mine = False
            else:
                slot = _Slot()
                self._slots[key] = slot
                self._slots.move_to_end(key)
                while len(self._slots) > self.size:
                    self._slots.popitem(last=False)
                self.misses += 1
                mine = True
        if mine:
            try:
                slot.value = compute()
            except BaseException as exc:
                slot.error = exc
            finally:
                slot.at = self.clock()
                slot.done.set()
        elif not slot.done.wait(wait):
            raise TimeoutError(f"dashboard: {key!r} is still being computed after {wait:g}s")
        if slot.error is not None:
            raise slot.error
        return slot.value

    def invalidate(self, prefix: str | None = None) -> None:
        """Forget every key (or those whose first element / string starts with ``prefix``)."""
        with self._lock:
            if prefix is None:
                self._slots.clear()
                return
            for key in list(self._slots):
                head = key[0] if isinstance(key, tuple) and key else key
                if isinstance(head, str) and head.startswith(prefix):
                    del self._slots[key]
