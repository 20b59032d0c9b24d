"""Cross-process wake-ups for a file that has no notification of its own (SQLite).

A process that waits for other processes' commits *listens*: it binds a datagram
socket in Linux's abstract namespace (no file, nothing to clean up when it dies) and
leaves a marker file named after it in ``<db>-wake/``. A process that commits *rings*:
it sends one byte to every listener whose marker it sees. The directory is re-listed
only when its mtime changes, so a commit with nobody listening costs one ``stat``.

**What changed.** A ring may say what it is about: a *kind* picks the listeners it goes
to (a listener of one kind has a marker named ``<kind>.<name>``; an unkinded marker
hears every ring), and its datagram may carry the topics that moved (``\\0``-separated),
so a listener wakes only the waiters of those topics. ``b"!"`` — what every older ring
sends — means "something changed: look at everything". A ring nobody needs (a commit
that makes nothing claimable and ends nothing) is simply not sent: a process is woken
only by what it waits for. A ring for *one* listener of a kind is not sent again while
that listener has not read the last one (it will look after both commits), for
``UNREAD_GRACE`` at most.

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
import bisect
import contextlib
import hashlib
import math
import os
import secrets
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Collection

if sys.platform.startswith("linux"):  # the bell's own (supported())
    import fcntl
    import termios

__all__ = ["EVERYTHING", "QUEUE_LIMIT", "Doorbell", "Wakeups", "supported"]

EVERYTHING = b"!"  # a ring that says "look at everything" (the only one older versions send)


def _queue_limit() -> int:
    """How many rings a listener's socket holds before the next is dropped."""
    try:
        with open("/proc/sys/net/unix/max_dgram_qlen") as f:
            return max(1, int(f.read()))
    except (OSError, ValueError):
        return 10


QUEUE_LIMIT = _queue_limit()  # a listener that reads this many at once may have missed some


# A ring for one that its listener has not read yet makes the next ring for one of that
# kind needless — that listener will look after both commits — for this long at most
# (a listener that stops reading gets rings again: they fill its queue and go on to the next).
UNREAD_GRACE = 0.01


def _unread(sock: socket.socket) -> bool:
    """Whether a datagram sent from ``sock`` still waits in a listener's queue (Linux
    counts it against its sender until it is read: ``SIOCOUTQ``)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0])
    except OSError:
        return False


def supported() -> bool:
    """Abstract-namespace Unix sockets are Linux's."""
    return sys.platform.startswith("linux") and hasattr(socket, "AF_UNIX")


class Doorbell:
    """Ring the other processes listening on one database file, or listen for them."""

    def __init__(self, path: str) -> None:
        self.dir = path + "-wake"
        self._key = hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:20]
        self._sender: socket.socket | None = None
        self._lock = threading.Lock()  # the listeners (listen/stop) against a ring's look at them
        self._listeners: dict[str, tuple[socket.socket, str]] = {}  # kind -> (socket, marker)
        self._peers: list[str] = []
        self._seen: int | None = None  # the directory's mtime when _peers was read
        self._ring_lock = threading.Lock()  # rings from two threads (a commit's, a forward)
        # kind -> the socket its rings for one go out of, and when it last sent one
        self._ones: dict[str, tuple[socket.socket, float]] = {}

    def _address(self, marker: str) -> bytes:
        return b"\0foundry-wake-" + self._key.encode() + b"-" + marker.encode()

    # -- listening -------------------------------------------------------------------

    def listen(self, kind: str = "") -> socket.socket | None:
        """Start listening to the rings of ``kind`` (``""``: every ring); the socket to
        wait on (``None`` when the bell cannot work here: the caller then only polls)."""
        with self._lock:
            got = self._listeners.get(kind)
            if got is not None:
                return got[0]
            name = f"{os.getpid()}-{secrets.token_hex(4)}"
            marker = f"{kind}.{name}" if kind else name
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
            self._listeners[kind] = (sock, marker)
            return sock

    def sockets(self) -> list[socket.socket]:
        """The sockets listening now (one per kind)."""
        with self._lock:
            return [sock for sock, _ in self._listeners.values()]

    def receive(self, sock: socket.socket) -> list[bytes]:
        """The rings received so far on ``sock`` (one of :meth:`sockets`), in order."""
        got: list[bytes] = []
        with contextlib.suppress(OSError):
            while data := sock.recv(65536):
                got.append(data)
        return got

    def drain(self) -> None:
        """Swallow the rings received so far."""
        for sock in self.sockets():
            self.receive(sock)

    def nudge(self) -> None:
        """Wake this process's own listener (to make its waiting thread look at a flag)."""
        with self._lock:
            markers = [marker for _, marker in self._listeners.values()]
        for marker in markers[:1]:
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.setblocking(False)  # a full queue wakes its listener anyway: never wait for room
                s.sendto(b"!", self._address(marker))

    def stop_listening(self) -> None:
        with self._lock:
            listeners, self._listeners = list(self._listeners.values()), {}
        for sock, marker in listeners:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.dir, marker))
            sock.close()

    # -- ringing ---------------------------------------------------------------------

    def _refresh(self) -> bool:
        """Re-read the markers if the directory changed; ``False`` if it is not there."""
        try:
            mtime = os.stat(self.dir).st_mtime_ns
        except OSError:
            return False
        if mtime != self._seen:
            with self._lock:
                own = {marker for _, marker in self._listeners.values()}
            try:
                self._peers = sorted(m for m in os.listdir(self.dir) if m not in own)
            except OSError:
                return False
            self._seen = mtime
        return True

    def ring(
        self,
        message: bytes | Callable[[int], bytes] = EVERYTHING,
        kinds: Collection[str] | None = None,
        *,
        one: str | None = None,
    ) -> None:
        """Send ``message`` to every other listener of one of ``kinds`` (``None``: to
        all) and to every unkinded one. With ``one`` (a kind this process listens to, or
        not), only the first live listener of ``kinds`` in a fixed order gets it —
        starting after this process's own listener of ``one``, so a listener that passes
        a ring on passes it to the next — and every unkinded one. Never raises; one
        ``stat`` when nobody listens. ``message`` may be made from the number of other
        listeners of ``kinds`` (a callable)."""
        with self._ring_lock:
            self._ring(message, kinds, one)

    def _sender_for(self, one: str | None) -> tuple[socket.socket | None, float]:
        """The socket that sends rings for one of kind ``one`` (its own, so that whether
        the last is unread can be asked of it) and when it last sent one."""
        if one is None:
            return None, 0.0
        got = self._ones.get(one)
        if got is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.setblocking(False)
            got = self._ones[one] = (sock, -math.inf)
        return got

    def _ring(
        self, message: bytes | Callable[[int], bytes], kinds: Collection[str] | None, one: str | None
    ) -> None:
        if not self._refresh() or not self._peers:
            return
        ones, sent_at = self._sender_for(one)
        if (
            ones is not None
            and time.monotonic() - sent_at < UNREAD_GRACE
            and all("." in m for m in self._peers)  # (an unkinded listener hears every ring)
            and _unread(ones)
        ):
            return  # the last ring for one is not read yet: its listener will look after this commit too
        if callable(message):
            message = message(sum(1 for m in self._peers if kinds is None or m.partition(".")[0] in kinds))
        if self._sender is None:
            self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sender.setblocking(False)
        gone = []
        order = self._peers
        if one is not None:
            with self._lock:
                mine = self._listeners.get(one)
            if mine is not None:
                cut = bisect.bisect_right(order, mine[1])
                order = order[cut:] + order[:cut]
        rung = False
        for marker in order:
            kind, dot, _ = marker.partition(".")
            if dot and kinds is not None and kind not in kinds:
                continue
            if dot and one is not None and rung:
                continue
            try:
                if dot and ones is not None and one is not None:
                    ones.sendto(message, self._address(marker))
                    self._ones[one] = (ones, time.monotonic())
                else:
                    self._sender.sendto(message, self._address(marker))
                rung = rung or bool(dot)
            except BlockingIOError:  # its queue is full: it has rings to read, and will look at everything
                pass  # (a ring for one goes on to the next: this one is not reading)
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
        for sock, _ in self._ones.values():
            sock.close()
        self._ones.clear()

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
