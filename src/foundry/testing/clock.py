"""``ManualClock``: time that moves only when a test says so.

It is a :class:`~foundry.backends.journal.Clock` (``time()``, ``sleep()``), so workflow
runtimes read it (``wf.sleep``, ``wf.wait_for(timeout=)``, retry back-offs, ``wf.now()``),
and its ``time`` is what a :class:`~foundry.deliver.scheduler.Scheduler` is given as its
clock. :meth:`ManualClock.advance` moves it forward *through* every instant something is
due on the way — each schedule tick, each workflow timer, each delayed eager job — and
at each one lets the sandboxes that use it run what became due, in this thread, before
it goes on. So ``clock.advance(60)`` on a 10-second schedule runs six ticks, each at its
own time, and returns when they (and the workflows they woke) have run.

``sleep`` (a runtime napping on this clock) only moves the time: nothing fires inside
another run's nap.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Protocol

from foundry.backends.journal.base import Clock, SystemClock
from foundry.backends.journal.base import ManualClock as _JournalClock
from foundry.errors import SubmitError

__all__ = ["Clock", "Due", "ManualClock", "SystemClock"]


class Due(Protocol):
    """What a clock moves through: something that can say when it is next due and run
    what is due now (a :class:`~foundry.testing.Sandbox`)."""

    def next_due(self) -> float | None: ...

    def fire(self) -> None: ...


class ManualClock(_JournalClock):
    """A clock that starts at ``start`` (default: the real time now, so ``eta=`` and
    time-zone arithmetic read naturally) and moves only by :meth:`advance`."""

    def __init__(self, start: float | None = None) -> None:
        super().__init__(time.time() if start is None else float(start))
        self._users: list[Due] = []
        self._advancing = threading.RLock()  # a job that advances it goes further, in order

    def attach(self, user: Due) -> None:
        """Have ``advance`` stop at ``user``'s due times and fire it (a sandbox does this)."""
        self._users.append(user)

    def detach(self, user: Due) -> None:
        if user in self._users:
            self._users.remove(user)

    def sleep(self, seconds: float) -> None:
        """A runtime's nap: the time moves on at once, nothing else runs."""
        super().advance(max(0.0, seconds))

    def advance(self, seconds: float) -> None:
        """Move ``seconds`` forward, stopping at every instant something is due on the way
        and running it (in this thread) before going on; returns when all of it has run.
        First it lets what is running now reach its next timer (a workflow just started
        parks on its ``wf.sleep``), so the timer is set before the time moves."""
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
            raise SubmitError(f"clock.advance({seconds!r}): give a finite number of seconds, e.g. 60")
        if seconds < 0:
            raise SubmitError(f"clock.advance({seconds!r}): time only moves forward. Fix: a number >= 0")
        with self._advancing:
            target = self.time() + seconds
            for user in list(self._users):  # what runs now first sets its timers (a workflow just started)
                user.fire()
            while True:
                now = self.time()
                due = [t for u in list(self._users) if (t := u.next_due()) is not None and now < t <= target]
                stop = min(due, default=target)
                super().advance(stop - now)
                for user in list(self._users):
                    user.fire()
                if stop >= target:
                    return

    def __repr__(self) -> str:
        return f"ManualClock(time={self.time():.3f})"
