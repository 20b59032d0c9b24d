"""``Task``: the :class:`~foundry.handle.Source` behind every in-process handle.

Lighter than a ``concurrent.futures.Future`` (which builds a ``Condition`` per future):
a task is a few slots, its state changes under its owner's lock, and a waiting
primitive (an ``Event`` for threads, a loop future for coroutines) is made only when
somebody waits before the outcome is known. Done-callbacks run once, outside the lock,
in the thread that finished the task (or at once, if it already finished).

The state machine. The owner (a pool, a loop runner, a process pool) drives it through
the owner API below, never by writing the fields, so the rules live in this one place::

    QUEUED ──start──▶ RUNNING ──finish──▶ SUCCEEDED | FAILED | CANCELLED
      │  ◀──requeue──┘                      ▲
      └───────────────finish────────────────┘   (cancelled or refused before it started)

- ``start`` moves QUEUED → RUNNING and says ``False`` when the task is no longer queued
  (it was cancelled first): the owner then skips it.
- ``finish`` records the outcome; the first final state wins, so a late result of work
  that was cancelled or timed out is discarded, never delivered twice. A
  :class:`~foundry.errors.CancelledError` makes it CANCELLED, any other error FAILED.
- ``requeue`` puts a task that never really ran back to QUEUED (a process pool whose
  child died holding units it had been handed ahead).

Each transition has a ``*_locked`` twin for an owner that already holds its lock (the
lock is the owner's, shared by all its tasks, so the owner can update its own books in
the same critical section); ``finish_locked`` hands back the callbacks, which the caller
runs once it has let go of the lock. Executors only read ``state`` and ``error``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, Protocol

from foundry.errors import CancelledError
from foundry.handle import Outcome, Status

__all__ = ["CANCELLED", "FAILED", "QUEUED", "RUNNING", "SUCCEEDED", "Owner", "Task"]

QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = range(5)
_STATUS = (Status.QUEUED, Status.RUNNING, Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)


class Owner(Protocol):
    """What a task asks of the model that runs it."""

    _lock: threading.Lock

    def cancel_task(self, task: Task) -> bool:
        """Stop ``task`` if it can be stopped (see :meth:`Task.cancel`)."""
        ...


class Task:
    """One unit of work accepted by an in-process model; a ``Source`` for its Handle."""

    __slots__ = (
        "__weakref__",
        "_callbacks",
        "_error",
        "_lock",
        "_state",
        "_value",
        "args",
        "enqueued",
        "fn",
        "kwargs",
        "owner",
        "started",
        "timeout",
    )

    def __init__(
        self,
        owner: Owner,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        timeout: float | None = None,
    ) -> None:
        self.owner = owner
        self._lock = owner._lock
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.timeout = timeout
        self._state = QUEUED
        self._value: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[], None]] | None = []
        self.enqueued = 0.0
        self.started = 0.0

    # -- reading (executors) -------------------------------------------------------

    @property
    def state(self) -> int:
        """One of ``QUEUED``, ``RUNNING``, ``SUCCEEDED``, ``FAILED``, ``CANCELLED``."""
        return self._state

    @property
    def error(self) -> BaseException | None:
        """The error it finished with (``None`` while unfinished, or when it succeeded)."""
        return self._error

    # -- the owner's side: transitions (see the module doc) ------------------------

    def start(self) -> bool:
        """QUEUED → RUNNING; ``False`` when it was cancelled first."""
        with self._lock:
            return self.start_locked()

    def start_locked(self) -> bool:
        """:meth:`start`, for a caller that holds the owner's lock."""
        if self._state != QUEUED:
            return False
        self._state = RUNNING
        return True

    def requeue_locked(self) -> bool:
        """Under the owner's lock: back to QUEUED, it never really ran; ``False`` (and
        nothing changes) when it is final already."""
        if self._state >= SUCCEEDED:
            return False
        self._state = QUEUED
        return True

    def finish(self, value: Any = None, error: BaseException | None = None) -> bool:
        """Record the outcome; ``False`` (and nothing changes) if one was recorded already."""
        with self._lock:
            callbacks = self.finish_locked(value, error)
        if callbacks is None:
            return False
        for callback in callbacks:
            callback()
        return True

    def finish_locked(self, value: Any, error: BaseException | None) -> list[Callable[[], None]] | None:
        """:meth:`finish`, for a caller that holds the owner's lock: the callbacks it must
        run once it lets go of the lock, or ``None`` if an outcome was recorded already."""
        if self._state >= SUCCEEDED:
            return None
        if error is None:
            self._state = SUCCEEDED
            self._value = value
        else:
            self._state = CANCELLED if isinstance(error, CancelledError) else FAILED
            self._error = error
        callbacks, self._callbacks = self._callbacks, None
        self.args = ()  # do not keep the arguments alive as long as the handle
        self.kwargs = {}
        return callbacks or []

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Run ``callback()`` once the outcome is final (now, if it already is)."""
        with self._lock:
            if self.add_done_callback_locked(callback):
                return
        callback()

    def add_done_callback_locked(self, callback: Callable[[], None]) -> bool:
        """Under the owner's lock: keep ``callback`` for when the outcome is final;
        ``False`` (kept nowhere) when it is final already."""
        if self._callbacks is None:
            return False
        self._callbacks.append(callback)
        return True

    def remove_done_callback(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self.remove_done_callback_locked(callback)

    def remove_done_callback_locked(self, callback: Callable[[], None]) -> None:
        """Under the owner's lock: forget ``callback`` if it is still waiting to run."""
        if self._callbacks is not None and callback in self._callbacks:
            self._callbacks.remove(callback)

    # -- Source ------------------------------------------------------------------

    def status(self) -> Status:
        return _STATUS[self._state]

    def done(self) -> bool:
        return self._state >= SUCCEEDED

    def wait(self, timeout: float | None) -> bool:
        if self._state >= SUCCEEDED:
            return True
        if timeout is not None and timeout <= 0:
            return False
        event = threading.Event()
        self.add_done_callback(event.set)
        if event.wait(timeout):
            return True
        self.remove_done_callback(event.set)
        return self._state >= SUCCEEDED

    async def wait_async(self, timeout: float | None) -> bool:
        if self._state >= SUCCEEDED:
            return True
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        waiter = threading.get_ident()

        def wake() -> None:
            if threading.get_ident() == waiter:  # finished on the waiting loop's own thread
                _resolve(future)
                return
            try:
                loop.call_soon_threadsafe(_resolve, future)
            except RuntimeError:  # the waiting loop is closed: nobody to wake
                pass

        self.add_done_callback(wake)
        try:
            if timeout is None:
                await future
            else:
                await asyncio.wait_for(future, timeout)
        except TimeoutError:
            self.remove_done_callback(wake)
            return self._state >= SUCCEEDED
        except BaseException:
            self.remove_done_callback(wake)
            raise
        return True

    def outcome(self) -> Outcome:
        return Outcome(self._value, self._error)

    def cancel(self) -> bool:
        return self.owner.cancel_task(self)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
