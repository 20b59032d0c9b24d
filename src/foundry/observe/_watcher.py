"""One thread per process that looks at every started watchdog when each one asks to be
looked at next. A process with a managed loop, a queue worker's loop and four stream
consumers pays for one sleeping thread, not six: the thread wakes at the earliest
moment any watchdog wants a look (every ``threshold / 2`` while its loop keeps up, every
few milliseconds while one is blocked), and every few seconds when there is nothing to
watch.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from typing import Protocol

__all__ = ["Watched", "Watcher", "watcher"]

log = logging.getLogger("foundry.watchdog")

IDLE_WAIT = 5.0  # seconds between looks when nothing is watched (a bounded wait)


class Watched(Protocol):
    """A watchdog as the watcher sees it."""

    next_at: float  # monotonic time it wants its next look

    def step(self, now: float) -> float | None:
        """Look once; seconds until the next look, or ``None`` to be dropped."""
        ...


class Watcher:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._watched: list[Watched] = []
        self._thread: threading.Thread | None = None
        self.cpu = 0.0  # CPU seconds this thread has used so far (the watching's own cost)
        self._wake_at = math.inf  # when the sleeping thread wakes next (inf: it is looking now)
        self._added = False  # an item came in after the thread took its list for this round

    def add(self, item: Watched) -> None:
        with self._cond:
            if item not in self._watched:
                self._watched.append(item)
                self._added = True
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="foundry-watchdog", daemon=True)
                self._thread.start()
            elif item.next_at < self._wake_at:
                self._cond.notify()  # it wants a look before the thread plans to wake

    def remove(self, item: Watched) -> None:
        with self._cond:
            if item in self._watched:
                self._watched.remove(item)

    def watching(self) -> int:
        with self._cond:
            return len(self._watched)

    def _run(self) -> None:
        while True:
            with self._cond:
                watched = list(self._watched)
                self._added = False
            now = time.monotonic()
            wake = now + IDLE_WAIT
            for item in watched:
                if item.next_at <= now:
                    try:
                        wait = item.step(now)
                    except Exception:  # one broken watchdog must not blind the others
                        log.exception("watchdog: a look failed; trying again in 1 s")
                        wait = 1.0
                    if wait is None:
                        self.remove(item)
                        continue
                    # From the end of the look: taking the GIL from a loop that computes can
                    # take a switch interval (5 ms), which must not shorten the pause after it.
                    item.next_at = time.monotonic() + wait
                wake = min(wake, item.next_at)
            self.cpu = time.thread_time()
            with self._cond:
                if self._added:
                    continue  # look at the newcomer's schedule before sleeping
                self._wake_at = wake
                delay = wake - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                self._wake_at = math.inf


_watcher: Watcher | None = None
_lock = threading.Lock()


def watcher() -> Watcher:
    """The process's watcher (made on first use)."""
    global _watcher
    with _lock:
        if _watcher is None:
            _watcher = Watcher()
        return _watcher


def _forget_in_child() -> None:
    """A forked child has none of the parent's threads, and none of its loops running."""
    global _watcher, _lock
    _watcher = None
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
