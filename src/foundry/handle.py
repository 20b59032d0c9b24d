"""``Handle``: one type for the result of work on every model.

A model (sequential, a thread pool, a child process, a durable queue, a workflow)
supplies a :class:`Source`; the :class:`Handle` turns it into the same API for
everyone: ``id``, ``status``, ``result(timeout)``, ``exception(timeout)``,
``cancel()``, ``done()``, and ``await handle`` from async code.

Contract of a failure: ``result()`` raises the *original* exception object (same
type, its ``__traceback__`` intact when it was raised in this process; a
:class:`~foundry.errors.RemoteError` carrying the remote traceback text when its
type cannot be rebuilt). A failure of one handle never touches another.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, runtime_checkable

from foundry.errors import CancelledError, FoundryError, ResultTimeoutError

__all__ = ["FutureSource", "Handle", "Outcome", "Source", "Status", "completed_handle"]

if TYPE_CHECKING:  # a bare ``Handle`` is ``Handle[Any]`` (PEP 696; the runtime needs no default)
    from typing_extensions import TypeVar as _TypeVar

    T_co = _TypeVar("T_co", covariant=True, default=Any)
else:
    T_co = TypeVar("T_co", covariant=True)


class Status(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a unit of work ended: a value, or the exception it raised."""

    value: Any = None
    error: BaseException | None = None


@runtime_checkable
class Source(Protocol):
    """What a model supplies behind a :class:`Handle`.

    ``wait`` and ``wait_async`` return ``True`` once the outcome is final and
    ``False`` when ``timeout`` (seconds; ``None`` = forever) passed first; they never
    raise for the *work's* failure. ``outcome`` is only called after a ``True``.
    ``cancel`` returns ``True`` when the work will not run (or was stopped) and its
    outcome is now a :class:`~foundry.errors.CancelledError` — or, for a durable job that
    runs on a worker somewhere, will be once that worker has stopped it.
    """

    def status(self) -> Status: ...

    def wait(self, timeout: float | None) -> bool: ...

    async def wait_async(self, timeout: float | None) -> bool: ...

    def outcome(self) -> Outcome: ...

    def cancel(self) -> bool: ...


class Handle(Generic[T_co]):
    """The caller's view of one submitted unit of work, whatever model runs it.

    ``Handle[T]``: ``T`` is the unit's declared return type (``def resize(...) -> bytes``
    gives ``Handle[bytes]`` from ``resize.submit(...)``), so ``result()`` and ``await
    handle`` are typed for a type checker; at run time it is the same class for every ``T``.
    """

    __slots__ = ("_source", "id", "unit")

    def __init__(self, id: str, unit: str, source: Source) -> None:
        self.id = id
        self.unit = unit
        self._source = source

    @property
    def status(self) -> Status:
        return self._source.status()

    def done(self) -> bool:
        return self._source.status().finished

    def result(self, timeout: float | None = None) -> T_co:
        """The work's return value; re-raises its exception. Waits up to ``timeout`` s."""
        if not self._source.wait(timeout):
            raise ResultTimeoutError(
                f"unit {self.unit!r}: no result for {self.id} within {timeout}s "
                f"({self._status_now()}); the work may still finish. "
                "Fix: wait longer, or check `handle.status`"
            )
        value: T_co = self._unwrap(self._source.outcome())  # (a Source carries values untyped)
        return value

    def _status_now(self) -> str:
        """The status for a timeout's message. The wait may have timed out *because* the
        store is down (a database restart): then the timeout is still what is raised, and
        the message says the status could not be read."""
        try:
            return f"status {self.status.value}"
        except FoundryError as exc:
            return f"status unknown: {type(exc).__name__} reading it"

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The exception the work raised, or ``None`` if it succeeded."""
        if not self._source.wait(timeout):
            raise ResultTimeoutError(f"unit {self.unit!r}: {self.id} not finished within {timeout}s")
        return self._source.outcome().error

    def cancel(self) -> bool:
        """Stop the work if it can still be stopped; ``True`` when it will not complete."""
        return self._source.cancel()

    async def aresult(self, timeout: float | None = None) -> T_co:
        if not await self._source.wait_async(timeout):
            raise ResultTimeoutError(
                f"unit {self.unit!r}: no result for {self.id} within {timeout}s ({self._status_now()})"
            )
        value: T_co = self._unwrap(self._source.outcome())  # (a Source carries values untyped)
        return value

    def __await__(self) -> Generator[Any, None, T_co]:
        return self.aresult().__await__()

    @staticmethod
    def _unwrap(outcome: Outcome) -> Any:
        if outcome.error is not None:
            raise outcome.error
        return outcome.value

    def __repr__(self) -> str:
        return f"<Handle {self.unit}:{self.id} {self.status.value}>"


class FutureSource:
    """A :class:`Source` over a :class:`concurrent.futures.Future`.

    In-process models hand back one of these. ``running`` is flipped by the model
    when the work starts (a Future alone cannot tell queued from running once it is
    inside a custom pool). ``on_cancel`` lets the model stop work that already
    started (kill a child process, cancel an asyncio task).
    """

    __slots__ = ("_on_cancel", "future", "running")

    def __init__(
        self,
        future: cf.Future[Any] | None = None,
        on_cancel: Callable[[], bool] | None = None,
    ) -> None:
        self.future: cf.Future[Any] = future if future is not None else cf.Future()
        self.running = False
        self._on_cancel = on_cancel

    def status(self) -> Status:
        fut = self.future
        if fut.done():
            if fut.cancelled():
                return Status.CANCELLED
            error = fut.exception()
            if isinstance(error, CancelledError):
                return Status.CANCELLED
            return Status.FAILED if error is not None else Status.SUCCEEDED
        return Status.RUNNING if (self.running or fut.running()) else Status.QUEUED

    def wait(self, timeout: float | None) -> bool:
        # Future.exception() waits on the future's own condition, which cancel() notifies
        # (cf.wait() would miss a cancel that no executor acknowledged).
        try:
            self.future.exception(timeout)
        except cf.TimeoutError:
            return False
        except cf.CancelledError:
            return True
        return True

    async def wait_async(self, timeout: float | None) -> bool:
        if self.future.done():
            return True
        wrapped = asyncio.wrap_future(self.future)
        try:
            await asyncio.wait_for(asyncio.shield(wrapped), timeout)
        except TimeoutError:
            return False
        except BaseException:
            if self.future.done():
                return True
            raise
        return True

    def outcome(self) -> Outcome:
        fut = self.future
        if fut.cancelled():
            return Outcome(error=CancelledError("the work was cancelled before it ran"))
        error = fut.exception()
        if error is not None:
            return Outcome(error=error)
        return Outcome(value=fut.result())

    def cancel(self) -> bool:
        if self.future.cancel():
            return True
        if self.future.done():
            return False
        if self._on_cancel is not None and self._on_cancel():
            if not self.future.done():
                try:
                    self.future.set_exception(CancelledError("the work was cancelled while running"))
                except cf.InvalidStateError:
                    pass
            return True
        return False


class _Done:
    __slots__ = ("_outcome",)

    def __init__(self, outcome: Outcome) -> None:
        self._outcome = outcome

    def status(self) -> Status:
        if self._outcome.error is None:
            return Status.SUCCEEDED
        if isinstance(self._outcome.error, CancelledError):
            return Status.CANCELLED
        return Status.FAILED

    def wait(self, timeout: float | None) -> bool:
        return True

    async def wait_async(self, timeout: float | None) -> bool:
        return True

    def outcome(self) -> Outcome:
        return self._outcome

    def cancel(self) -> bool:
        return False


_counter = 0
_counter_lock = threading.Lock()


def new_id(prefix: str = "h") -> str:
    """A process-unique, time-ordered id (durable backends use their own)."""
    global _counter
    with _counter_lock:
        _counter += 1
        n = _counter
    return f"{prefix}-{time.time_ns():x}-{n}"


def completed_handle(unit: str, outcome: Outcome, id: str | None = None) -> Handle:
    """A handle that is already finished (the sequential model's result)."""
    return Handle(id or new_id(), unit, _Done(outcome))
