"""Structured scopes: no unit of work outlives the block that started it.

::

    from foundry.execute import scope

    async with scope():                      # or `with scope():` in sync code
        a = await fetch.asubmit(url_a)
        b = await fetch.asubmit(url_b)
    # here a and b are finished. If one failed, the other was cancelled and the
    # failure is raised (an ExceptionGroup, like asyncio.TaskGroup); if the block
    # raised or was cancelled, every unit still running was cancelled first.

Every handle submitted through a unit (``unit.submit``/``asubmit``/``options(...)``)
while a scope is active — in this task or thread, through ``contextvars`` — belongs to
the innermost scope. Scopes work for every model: an ``async`` unit's task is
cancelled on its loop; a queued pool unit never starts; a running process unit's child
is killed. Exactly as with ``asyncio.TaskGroup``, a scope waits for its units to be
*finished* (their handles resolved) before the block is left; a thread that cannot be
interrupted may run on after its handle was cancelled (see ``checkpoint()``).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Literal

from foundry.errors import CancelledError
from foundry.handle import Handle

__all__ = ["Scope", "current_scope", "wait_first"]

_current: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("foundry_scope", default=None)


def current_scope() -> Scope | None:
    """The innermost active scope of this task or thread, if any."""
    return _current.get()


def _failed(handle: Handle) -> BaseException | None:
    error = handle._source.outcome().error if handle.done() else None
    return None if isinstance(error, CancelledError) else error


def wait_first(handles: Iterable[Handle], timeout: float | None) -> bool:
    """Block until at least one of ``handles`` is finished (``False`` on timeout)."""
    items = list(handles)
    if not items or any(h.done() for h in items):
        return True
    event = threading.Event()
    hooked: list[tuple[Any, Callable[[], None]]] = []
    for handle in items:
        add = getattr(handle._source, "add_done_callback", None)
        if add is None:  # a source without callbacks: poll it
            return items[0]._source.wait(0.01 if timeout is None else min(timeout, 0.01))
        add(event.set)
        hooked.append((handle._source, event.set))
    try:
        return event.wait(timeout)
    finally:
        for source, callback in hooked:
            source.remove_done_callback(callback)


class Scope:
    """See the module docstring. Reusable only once."""

    def __init__(self) -> None:
        self._handles: list[Handle] = []
        self._lock = threading.Lock()
        self._token: contextvars.Token[Scope | None] | None = None
        self._failed_fast = False

    def track(self, handle: Handle) -> None:
        with self._lock:
            self._handles.append(handle)

    @property
    def handles(self) -> list[Handle]:
        with self._lock:
            return list(self._handles)

    def cancel(self) -> None:
        """Cancel every unit of this scope that is not finished."""
        for handle in self.handles:
            if not handle.done():
                handle.cancel()

    def _pending(self) -> list[Handle]:
        """The unfinished handles; the first time a failure is seen, the rest are cancelled."""
        pending = [h for h in self.handles if not h.done()]
        if pending and not self._failed_fast and any(_failed(h) is not None for h in self.handles):
            self._failed_fast = True
            self.cancel()
            pending = [h for h in self.handles if not h.done()]
        return pending

    def _leave(self, error: BaseException | None) -> None:
        """Leaving the block: this scope is no longer current; a failed body cancels all."""
        if self._token is not None:
            _current.reset(self._token)
        if error is not None:
            self.cancel()

    def _outcome(self, body_error: BaseException | None) -> BaseException | None:
        errors = [e for e in (_failed(h) for h in self.handles) if e is not None]
        if not errors:
            return None
        if body_error is not None and isinstance(body_error, Exception):
            errors.insert(0, body_error)
        return ExceptionGroup(f"{len(errors)} unit(s) of a scope failed", errors)  # type: ignore[type-var]

    # -- sync --------------------------------------------------------------------

    def __enter__(self) -> Scope:
        self._token = _current.set(self)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        self._leave(error)
        try:
            self._join()
        except BaseException:
            self.cancel()
            self._join()
            raise
        group = self._outcome(error)
        if group is not None:
            raise group from None
        return False

    def _join(self) -> None:
        while pending := self._pending():
            wait_first(pending, None)

    # -- async -------------------------------------------------------------------

    async def __aenter__(self) -> Scope:
        return self.__enter__()

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        self._leave(error)
        try:
            await self._ajoin()
        except BaseException:  # the host task was cancelled: cancellation propagates down
            self.cancel()
            await asyncio.shield(self._ajoin())
            raise
        group = self._outcome(error)
        if group is not None:
            raise group from None
        return False

    async def _ajoin(self) -> None:
        waiters: dict[Handle, asyncio.Future[bool]] = {}
        try:
            while pending := self._pending():
                for handle in pending:
                    if handle not in waiters:
                        waiters[handle] = asyncio.ensure_future(handle._source.wait_async(None))
                await asyncio.wait([waiters[h] for h in pending], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters.values():
                waiter.cancel()
