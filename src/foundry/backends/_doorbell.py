"""Cross-process wake-ups for a file that has no notification of its own (SQLite).

A process that waits for other processes' commits *listens*: it binds a datagram
socket in Linux's abstract namespace (no file, nothing to clean up when it dies) and
leaves a marker file named after it in ``<db>-wake/``. A process that commits *rings*:
it sends one byte to every listener whose marker it sees. The directory is re-listed
only when its mtime changes, so a commit with nobody listening costs one ``stat``.

A listener that died (even by SIGKILL) is noticed by the ring itself (its address
refuses the datagram) and its marker is removed. A full socket buffer means the
listener has wake-ups pending anyway, so the ring is dropped. The bell only makes a
waiter look *sooner*: the caller still polls the database (``PRAGMA data_version``) as
the source of truth, and on other systems it is all there is.

:class:`Wakeups` is what a backend with waiters uses: one counter and condition per
process and file, bumped by this process's own commits (at once) and by the other
processes' rings (through a listener thread that runs while somebody waits). The queue
keeps its own watcher, which also looks at ``PRAGMA data_version``. The PostgreSQL
journal hears the other processes through ``LISTEN`` instead of the bell (its
``_Listening`` subclass).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import select
import socket
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["Doorbell", "Wakeups", "supported"]


def supported() -> bool:
    """Abstract-namespace Unix sockets are Linux's."""
    return sys.platform.startswith("linux") and hasattr(socket, "AF_UNIX")


class Doorbell:
    """Ring the other processes listening on one database file, or listen for them."""

    def __init__(self, path: str) -> None:
        self.dir = path + "-wake"
        self._key = hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:20]
        self._sender: socket.socket | None = None
        self._listener: socket.socket | None = None
        self._marker: str | None = None
        self._peers: list[str] = []
        self._seen: int | None = None  # the directory's mtime when _peers was read

    def _address(self, marker: str) -> bytes:
        return b"\0foundry-wake-" + self._key.encode() + b"-" + marker.encode()

    # -- listening -------------------------------------------------------------------

    def listen(self) -> socket.socket | None:
        """Start listening; the socket to wait on (``None`` when the bell cannot work
        here: the caller then only polls)."""
        if self._listener is not None:
            return self._listener
        marker = f"{os.getpid()}-{secrets.token_hex(4)}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(self._address(marker))
            sock.setblocking(False)
            os.makedirs(self.dir, exist_ok=True)
            with open(os.path.join(self.dir, marker), "x"):
                pass
        except OSError:
            sock.close()
            return None
        self._listener, self._marker = sock, marker
        return sock

    def drain(self) -> None:
        """Swallow the rings received so far."""
        sock = self._listener
        if sock is None:
            return
        with contextlib.suppress(OSError):
            while sock.recv(64):
                pass

    def nudge(self) -> None:
        """Wake this process's own listener (to make its waiting thread look at a flag)."""
        sock, marker = self._listener, self._marker
        if sock is None or marker is None:
            return
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(b"!", self._address(marker))

    def stop_listening(self) -> None:
        sock, marker = self._listener, self._marker
        self._listener = self._marker = None
        if marker is not None:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.dir, marker))
        if sock is not None:
            sock.close()

    # -- ringing ---------------------------------------------------------------------

    def ring(self) -> None:
        """Wake every other listener (never raises; one ``stat`` when nobody listens)."""
        try:
            mtime = os.stat(self.dir).st_mtime_ns
        except OSError:
            return
        if mtime != self._seen:
            try:
                self._peers = [m for m in os.listdir(self.dir) if m != self._marker]
            except OSError:
                return
            self._seen = mtime
        if not self._peers:
            return
        if self._sender is None:
            self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sender.setblocking(False)
        gone = []
        for marker in self._peers:
            try:
                self._sender.sendto(b"!", self._address(marker))
            except BlockingIOError:
                continue  # its buffer is full: it has rings to read already
            except OSError:  # refused or not there: the listener is dead
                gone.append(marker)
        for marker in gone:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.dir, marker))
            self._peers.remove(marker)

    def close(self) -> None:
        self.stop_listening()
        if self._sender is not None:
            self._sender.close()
            self._sender = None

    def remove(self) -> None:
        """Delete the marker directory (a temporary database going away)."""
        self.close()
        with contextlib.suppress(OSError):
            for marker in os.listdir(self.dir):
                os.unlink(os.path.join(self.dir, marker))
            os.rmdir(self.dir)


class Wakeups:
    """The waiters of one process on one database file, and the commits that wake them.

    A waiter takes a :meth:`mark` *before* it looks at the database, then calls
    :meth:`wait` with it: the wait returns at once if anything rang since the mark, so a
    commit between the look and the wait is never slept through. :meth:`ring` after a
    commit that a waiter may be waiting for wakes this process's waiters directly and
    rings the other processes (when :attr:`cross_process`). The first mark starts
    listening — the socket is bound before the mark returns — and a thread turns rings
    into wake-ups; it stops after ``idle`` seconds without a waiter. Without the doorbell
    (other systems, or no socket to bind) only this process's commits wake a waiter and
    the caller's poll finds the rest.
    """

    def __init__(self, path: str | None, *, idle: float = 2.0) -> None:
        self._bell = Doorbell(path) if path is not None and supported() else None
        self._idle = idle
        self._cond = threading.Condition()
        self._bell_lock = threading.Lock()  # the Doorbell itself is not thread-safe
        self._count = 0
        self._waiting = 0
        self._last_use = 0.0
        self._thread: threading.Thread | None = None
        self._closed = False
        # coroutines waiting (wait_async): how to wake each on its own loop
        self._async: dict[object, tuple[asyncio.AbstractEventLoop, Callable[[], None]]] = {}

    @property
    def cross_process(self) -> bool:
        """Whether another process's commit wakes a waiter here at once (else only the
        caller's poll finds it)."""
        return self._bell is not None and not self._closed

    def mark(self) -> int:
        """The wake-up count now; start listening to other processes if not yet."""
        with self._cond:
            self._last_use = time.monotonic()
            if self._bell is not None and self._thread is None and not self._closed:
                with self._bell_lock:
                    sock = self._bell.listen()
                if sock is None:
                    self._bell = None  # nothing to bind here: the caller's poll is all there is
                else:
                    self._thread = threading.Thread(
                        target=self._listen, args=(self._bell, sock), name="foundry-wake-listen", daemon=True
                    )
                    self._thread.start()
            return self._count

    def wait(self, mark: int, timeout: float) -> bool:
        """Wait until a wake-up after ``mark`` (``True``), ``timeout`` seconds (``False``)
        or :meth:`close`."""
        with self._cond:
            self._waiting += 1
            try:
                return self._cond.wait_for(lambda: self._count != mark or self._closed, max(0.0, timeout))
            finally:
                self._waiting -= 1
                self._last_use = time.monotonic()

    async def wait_async(self, mark: int, timeout: float) -> bool:
        """:meth:`wait` for a coroutine: no thread is held while it waits; a wake-up
        reaches its loop with ``call_soon_threadsafe``."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not woken.done():
                woken.set_result(None)

        key = object()
        with self._cond:
            if self._count != mark or self._closed:
                return True
            self._waiting += 1
            self._async[key] = (loop, wake)
        try:
            await asyncio.wait({woken}, timeout=max(0.0, timeout))
        finally:
            with self._cond:
                self._async.pop(key, None)
                self._waiting -= 1
                self._last_use = time.monotonic()
        with self._cond:
            return self._count != mark or self._closed

    def notify(self) -> None:
        """Wake this process's waiters."""
        with self._cond:
            self._count += 1
            self._cond.notify_all()
            waiters = list(self._async.values())
        for loop, wake in waiters:
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile
                loop.call_soon_threadsafe(wake)

    def ring(self) -> None:
        """After a commit: wake this process's waiters and ring the other processes'."""
        self.notify()
        bell = self._bell
        if bell is not None:
            with self._bell_lock:
                bell.ring()

    def idle(self) -> bool:
        """Whether nobody has waited for ``idle`` seconds, or :meth:`close` was called (a
        listener of other processes' commits may stop)."""
        with self._cond:
            return self._closed or self._idle_now()

    def _idle_now(self) -> bool:
        return self._waiting == 0 and time.monotonic() - self._last_use > self._idle

    def _listen(self, bell: Doorbell, sock: socket.socket) -> None:
        while True:
            try:
                readable = select.select([sock], [], [], 0.5)[0]
            except (OSError, ValueError):  # pragma: no cover - the socket closed under us
                readable = []
            if readable:
                with self._bell_lock:
                    bell.drain()
                self.notify()
            with self._cond:
                if self._closed or self._idle_now():
                    with self._bell_lock:
                        bell.stop_listening()
                    self._thread = None
                    return

    def close(self, *, remove: bool = False) -> None:
        """Stop listening and wake every waiter; ``remove`` deletes the marker directory
        (a temporary database going away)."""
        with self._cond:
            self._closed = True
            thread = self._thread
            self._cond.notify_all()
            waiters = list(self._async.values())
        for loop, wake in waiters:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(wake)
        bell = self._bell
        if bell is None:
            return
        with self._bell_lock:
            bell.nudge()  # the listener may sleep in select() for up to half a second
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)
        with self._bell_lock:
            if remove:
                bell.remove()
            else:
                bell.close()
