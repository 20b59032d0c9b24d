"""Riding out an engine outage: one engine call retried, with bounded back-off, while the
engine reports itself unavailable.

Every runtime calls its engine through this one helper — the queue's submit and its
handles' waits, the workflow runtime's journal calls, the stream consumer's reads,
commits and dead-letters, and the stream publisher — so "what does Foundry do while
Redis restarts" has one answer, bounded three ways, whichever the caller needs:

``tries``
    at most this many calls (a workflow run's journal call: 8, about 5 s in all);
``within``
    seconds from the first call; a pause that would end past them is not taken (a
    submit: 10 s; a handle's wait: what is left of its timeout);
``stop``
    an event that ends the riding at once (a consumer being stopped); the pauses wait
    on it, so a stop is not held up by a back-off.

Only :class:`~foundry.errors.BackendUnavailableError` is ridden out: any other error (a
malformed record, a refused request, a bug) is raised at once, because retrying it
would give the same answer. When the bound is reached, the last unavailable error is
raised, naming the engine and the fix as its backend wrote it.

The pauses are :data:`foundry.retry.OUTAGE` (50 ms doubling to 2 s, no jitter, so the
documented totals hold) unless the caller passes its own :class:`~foundry.retry.Backoff`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

from foundry.errors import BackendUnavailableError
from foundry.retry import OUTAGE, Backoff

__all__ = ["aride_outage", "ride_outage"]

T = TypeVar("T")


def ride_outage(
    call: Callable[[], T],
    *,
    tries: int | None = None,
    within: float | None = None,
    stop: threading.Event | None = None,
    policy: Backoff = OUTAGE,
    sleep: Callable[[float], object] | None = None,
) -> T:
    """``call()``, retried while it raises :class:`~foundry.errors.BackendUnavailableError`,
    until ``tries`` calls, ``within`` seconds or ``stop`` (whichever comes first; none of
    them: for as long as the outage lasts). ``sleep`` waits a pause (default: ``stop.wait``
    when there is a ``stop``, else ``time.sleep``)."""
    pause = sleep if sleep is not None else (stop.wait if stop is not None else time.sleep)
    if tries is not None and tries < 1:
        raise ValueError(f"ride_outage: tries={tries} is below 1. Fix: give tries=1 or more, or None")
    started = time.monotonic()
    riding = None  # made at the first outage (most calls meet none)
    while True:
        try:
            return call()
        except BackendUnavailableError:
            riding = riding or _Riding(tries, within, stop, policy, started)
            wait = riding.next_pause()
            if wait is None:
                raise
            pause(wait)
            if stop is not None and stop.is_set():  # stopped during the pause: no further call
                raise


async def aride_outage(
    call: Callable[[], Awaitable[T]],
    *,
    tries: int | None = None,
    within: float | None = None,
    policy: Backoff = OUTAGE,
) -> T:
    """:func:`ride_outage` for a coroutine: ``await call()``, the pauses awaited on the
    running loop (``asyncio.sleep``), bounded by ``tries`` and ``within`` alike."""
    if tries is not None and tries < 1:
        raise ValueError(f"aride_outage: tries={tries} is below 1. Fix: give tries=1 or more, or None")
    started = time.monotonic()
    riding = None
    while True:
        try:
            return await call()
        except BackendUnavailableError:
            riding = riding or _Riding(tries, within, None, policy, started)
            wait = riding.next_pause()
            if wait is None:
                raise
            await asyncio.sleep(wait)


class _Riding:
    """The bounds of one ride: :meth:`next_pause` after each unavailable call."""

    def __init__(
        self,
        tries: int | None,
        within: float | None,
        stop: threading.Event | None,
        policy: Backoff,
        started: float,
    ) -> None:
        self.tries, self.stop = tries, stop
        self.deadline = None if within is None else started + within
        self.done = 0
        self.pauses: Iterator[float] = policy.pauses()

    def next_pause(self) -> float | None:
        """Seconds to wait before the next call, or ``None``: a bound is reached, give up."""
        self.done += 1
        if self.stop is not None and self.stop.is_set():
            return None
        if self.tries is not None and self.done >= self.tries:
            return None
        wait = next(self.pauses)
        if self.deadline is not None and time.monotonic() + wait > self.deadline:
            return None
        return wait
