"""Helpers every queue engine shares (SQL, Redis and AMQP alike): the in-process
wake-up generations (:class:`Signals`) and their topics, the ``cancel_requests`` loop,
and reading a stored number that must not stop anything. Nothing here imports a driver
or knows how an engine stores a job.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = [
    "CANCELS",
    "CANCEL_LOOK",
    "RECHECK",
    "Signals",
    "finite",
    "job_topic",
    "queue_topic",
    "watch_cancels",
]

CANCELS = "cancels"  # the signal topic of a new cancel request (``cancel_requests`` waits on it)
CANCEL_LOOK = 0.02  # fewest seconds between two looks of ``cancel_requests`` (a busy store wakes it often)
RECHECK = 1.0  # longest a waiter sleeps without re-reading the store (a lost wake-up costs this)

F = TypeVar("F", float, float | None)


def finite(value: Any, default: F) -> float | F:
    """A stored number read where a bad one must not stop anything (``default`` then)."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return number if math.isfinite(number) else default


class Signals:
    """Wake-ups inside one process: a generation per topic (a queue, or a job id)
    plus one for "something changed, look again". Waiters read a generation, look at
    the store, and sleep only if the generation has not moved since — so a change
    between the look and the sleep is never missed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._gens: dict[str, int] = {}
        self._all = 0
        self._waiting: dict[str, int] = {}  # topic -> threads waiting on it now

    def gen(self, topic: str) -> tuple[int, int]:
        return (self._all, self._gens.get(topic, 0))

    def bump(self, *topics: str) -> None:
        with self._cond:
            for topic in topics:
                self._gens[topic] = self._gens.get(topic, 0) + 1
                if len(self._gens) > 100_000:  # job topics of finished jobs: forget them
                    self._gens.clear()
                    self._all += 1
            self._cond.notify_all()

    def bump_all(self) -> None:
        with self._cond:
            self._all += 1
            self._cond.notify_all()

    def wait(self, topic: str, since: tuple[int, int], timeout: float) -> bool:
        """Sleep until ``topic`` (or everything) moved past ``since``; ``False`` on timeout."""
        with self._cond:
            self._waiting[topic] = self._waiting.get(topic, 0) + 1
            try:
                return self._cond.wait_for(lambda: self.gen(topic) != since, max(0.0, timeout))
            finally:
                left = self._waiting.pop(topic) - 1
                if left:
                    self._waiting[topic] = left

    def waiting(self, topic: str) -> int:
        """How many threads wait on ``topic`` now."""
        with self._cond:
            return self._waiting.get(topic, 0)


def watch_cancels(
    signals: Signals, look: Callable[[], list[str]], timeout: float, closed: Callable[[], bool]
) -> list[str]:
    """The loop of every engine's ``cancel_requests``: ``look()`` at the store, and until
    it finds something (or ``timeout``, or ``closed()``) sleep until a cancel request is
    signalled (``CANCELS``), looking again at least every ``RECHECK`` s. A wake-up that is
    not about a cancel (SQLite's "another process committed") looks again no sooner than
    ``CANCEL_LOOK`` s after the last look: a busy store must not turn this into a busy loop."""
    deadline = time.monotonic() + max(0.0, timeout)
    while True:
        since = signals.gen(CANCELS)
        looked = time.monotonic()
        found = look()
        left = deadline - time.monotonic()
        if found or left <= 0 or closed():
            return found
        signals.wait(CANCELS, since, min(left, RECHECK))
        pause = CANCEL_LOOK - (time.monotonic() - looked)
        if pause > 0 and signals.gen(CANCELS)[1] == since[1]:
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))


def job_topic(job_id: str) -> str:
    return "job:" + job_id


def queue_topic(queue: str) -> str:
    return "queue:" + queue
