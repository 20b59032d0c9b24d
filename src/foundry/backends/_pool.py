"""A small, bounded connection pool, shared by the journal and queue engines."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from foundry.errors import BackendError

C = TypeVar("C")


class Pool(Generic[C]):
    """At most ``size`` connections, made on demand, reused last-in first-out.

    ``broken(conn)`` tells after a failure whether a connection must be thrown away
    (a dropped server connection); a waiting caller gives up after ``timeout`` seconds.
    A broken connection also flushes the idle ones: after a server restart every one of
    them is dead too, but a driver only finds out on use, so each would cost a caller
    one failed attempt; reconnecting a few that were fine costs milliseconds.
    """

    def __init__(
        self,
        connect: Callable[[], C],
        close: Callable[[C], None],
        *,
        size: int,
        timeout: float,
        broken: Callable[[C], bool],
        what: str,
    ) -> None:
        self._connect = connect
        self._close = close
        self._broken = broken
        self._size = size
        self._timeout = timeout
        self._what = what
        self._idle: list[C] = []
        self._open = 0
        self._closed = False
        self._waiting = 0  # callers inside acquire's wait (a release wakes one only then)
        # held as the plain lock (a C context manager; a Condition's own __enter__ and
        # __exit__ are Python calls, four of them per acquire and release), waited on as
        # the condition over it
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)

    @contextmanager
    def connection(self) -> Iterator[C]:
        """``with pool.connection() as conn``: acquire, and release (checked on error)."""
        conn = self.acquire()
        try:
            yield conn
        except BaseException:
            self.release(conn, check=True)
            raise
        self.release(conn, check=False)

    def acquire(self) -> C:
        """A connection for this thread's exclusive use until :meth:`release`."""
        with self._lock:
            if self._idle and not self._closed:  # the common case: an idle one, no waiting
                return self._idle.pop()
            self._waiting += 1
            try:
                ready = self._cond.wait_for(
                    lambda: self._closed or self._idle or self._open < self._size, self._timeout
                )
            finally:
                self._waiting -= 1
            if not ready:
                raise BackendError(
                    f"{self._what}: all {self._size} connections stayed busy for {self._timeout}s. "
                    "Fix: raise the pool size (?pool=N in the journal URL) or shorten transactional steps"
                )
            if self._closed:
                raise BackendError(f"{self._what} is closed. Fix: do not use a journal after close()")
            if self._idle:
                return self._idle.pop()
            self._open += 1
        try:
            return self._connect()
        except BaseException:
            with self._lock:
                self._open -= 1
                self._cond.notify()
            raise

    def release(self, conn: C, *, check: bool) -> None:
        """Return a connection; with ``check``, one that ``broken`` condemns is closed,
        and so are the idle ones (see the class docstring)."""
        broken = check and self._broken(conn)
        with self._lock:
            if not broken and not self._closed:
                self._idle.append(conn)
                if self._waiting:
                    self._cond.notify()
                return
            stale: list[C] = []
            if broken:
                stale, self._idle = self._idle, []
        self._discard(conn)
        for dead in stale:
            with contextlib.suppress(Exception):  # a dead connection may fail to close: drop it anyway
                self._discard(dead)

    def _discard(self, conn: C) -> None:
        try:
            self._close(conn)
        finally:
            with self._lock:
                self._open -= 1
                self._cond.notify()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for conn in idle:
            self._discard(conn)
