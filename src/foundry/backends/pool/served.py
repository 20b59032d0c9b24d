"""The embedded pool served by ``foundry pool serve``: one machine, workers outside the app.

``foundry pool serve app:app`` on an app whose pool URL is ``local://`` (the default)
starts each pool unit's workers behind the embedded pool's exact dispatcher
(:class:`~foundry.backends.pool._dispatch.LocalPool`) and serves it on a Unix domain socket
under the app's home (:func:`socket_path`, mode ``0600``: only this user). An app whose
pool URL is ``local://served`` (``Foundry(pool="local://served")`` or
``FOUNDRY_POOL=local://served``) sends its pool units' requests there
(:class:`ServedPool`) instead of starting workers of its own. The choice is explicit:
``local://`` never looks for a served pool, so which processes run a request never
depends on what happens to be running.

Wire (``multiprocessing.connection`` frames over the socket)::

    server -> client   b"H" + JSON {"pid", "unit", "codec"}            once, on connect
    client -> server   b"R" + u64 token + request frame                  an attempt
                       b"C" + u64 token                                  cancel it
    server -> client   b"A" + u64 token + reply frame                    its answer
                       b"K" + u64 token + b"1" | b"0"                    cancelled or not

The same semantics as the embedded pool: the first free worker takes an attempt, the
server answers ``DEADLINE`` when none was free within its wait and kills a worker past
its timeout (``LOST``); a worker that dies is answered ``LOST`` at once. A server that
dies closes the socket: every attempt it held is answered ``LOST`` at once (the work may
or may not have happened), and with no server a submit is ``NO_WORKER`` at once. A
server that hangs is caught by the client's own timer (the attempt's wait + timeout +
0.25 s).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import multiprocessing.connection as mpc
import os
import socket
import struct
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from foundry.backends.pool._common import (
    attempt_from_frame,
    decode_reply,
    encode_reply,
    encode_request,
    refusal,
)
from foundry.backends.pool._dispatch import LocalFront, LocalPool
from foundry.backends.pool.base import (
    CANCELLED,
    ERROR,
    LOST,
    NO_WORKER,
    OK,
    Attempt,
    Done,
    EngineSpec,
    EngineStats,
    Reply,
    answer_once,
    check_subject_part,
)
from foundry.errors import BackendUnavailableError

__all__ = ["ServedHost", "ServedPool", "socket_path"]

log = logging.getLogger("foundry.pool")

_TOKEN = struct.Struct("!Q")
GRACE = 0.25  # beyond an attempt's wait + timeout, for the server's own answer
HELLO_TIMEOUT = 1.0
CANCEL_TIMEOUT = 1.0
MAX_WAITING = 10_000
_PATH_MAX = 100  # sun_path is 108 bytes on Linux, less elsewhere


def socket_path(home: str, app: str, unit: str) -> str:
    """Where the served pool of ``app``'s ``unit`` listens: ``<home>/pool/<app>.<unit>.sock``,
    or, when that path is too long for a socket, a hashed name in a private directory of
    this user under the system's temporary directory."""
    check_subject_part("app name", app)
    check_subject_part("unit name", unit)
    path = Path(home or ".foundry").resolve() / "pool" / f"{app}.{unit}.sock"
    if len(os.fsencode(path)) <= _PATH_MAX:
        return str(path)
    digest = hashlib.sha256(os.fsencode(path)).hexdigest()[:24]
    return os.path.join(tempfile.gettempdir(), f"foundry-{os.getuid()}", f"{digest}.sock")


def _private_dir(path: str) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    info = os.stat(directory)
    if info.st_uid != os.getuid():
        raise BackendUnavailableError(
            f"the served pool's directory {directory} belongs to another user (uid {info.st_uid}). "
            "Fix: set FOUNDRY_HOME to a directory of your own"
        )


# -- the client ---------------------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class _Pending:
    attempt: Attempt
    done: Done
    until: float
    cancel_ack: threading.Event | None = None
    cancelled: bool = False


class ServedPool:
    """Sends a unit's attempts to the pool ``foundry pool serve`` runs on this machine."""

    def __init__(self, url: str, spec: EngineSpec) -> None:
        self.url = url
        self.unit = spec.unit
        self.codec = spec.codec
        self.path = socket_path(spec.home, spec.app, spec.unit)
        self._lock = threading.Lock()
        self._write = threading.Lock()
        self._conn: mpc.Connection | None = None
        self._server = ""  # "pid N", for messages
        self._pending: dict[int, _Pending] = {}
        self._tokens = itertools.count(1)
        self._arrivals = 0
        self._served = 0
        self._service = 0.0
        self._closed = False
        self._reader: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"<ServedPool {self.unit} {self.path}>"

    def _connect(self) -> mpc.Connection:
        """The connection (lock held), made on first use and after the server went away."""
        if self._conn is not None:
            return self._conn
        try:
            conn = mpc.Client(self.path, family="AF_UNIX")
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise BackendUnavailableError(
                f"no pool is served at {self.path} ({type(exc).__name__}). Fix: start `foundry pool serve "
                "MODULE:app` with the same FOUNDRY_HOME, or use pool=local:// to start workers in the app"
            ) from exc
        except OSError as exc:
            raise BackendUnavailableError(f"cannot reach the served pool at {self.path} ({exc})") from exc
        try:
            if not conn.poll(HELLO_TIMEOUT):
                raise BackendUnavailableError(f"the served pool at {self.path} did not say hello")
            hello = json.loads(conn.recv_bytes()[1:])
            if hello.get("unit") != self.unit or hello.get("codec") != self.codec:
                raise BackendUnavailableError(
                    f"the pool served at {self.path} runs unit {hello.get('unit')!r} with codec "
                    f"{hello.get('codec')!r}, not {self.unit!r} with {self.codec!r}. Fix: restart "
                    "`foundry pool serve` with this version of the app"
                )
        except (OSError, EOFError, ValueError) as exc:
            conn.close()
            raise BackendUnavailableError(f"the served pool at {self.path} broke off ({exc})") from exc
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._server = f"pid {hello.get('pid')}"
        self._reader = threading.Thread(
            target=self._read, args=(conn,), name=f"foundry-served-{self.unit}", daemon=True
        )
        self._reader.start()
        return conn

    def send(self, attempt: Attempt, done: Done) -> None:
        done = answer_once(done, attempt)
        frame = encode_request(attempt)
        with self._lock:
            self._arrivals += 1
            if self._closed:
                refused = "the pool client is closed"
            else:
                try:
                    conn = self._connect()
                    refused = ""
                except BackendUnavailableError as exc:
                    refused = str(exc)
            if not refused:
                token = next(self._tokens)
                self._pending[token] = _Pending(
                    attempt, done, time.monotonic() + attempt.wait + attempt.timeout + GRACE
                )
        if refused:
            done(Reply(NO_WORKER, detail=refused))
            return
        try:
            with self._write:
                conn.send_bytes(b"R" + _TOKEN.pack(token) + frame)
        except (OSError, ValueError):
            with self._lock:
                pending = self._pending.pop(token, None)
            if pending is not None:  # it never reached the server: nothing ran
                done(Reply(NO_WORKER, detail=f"the served pool at {self.path} went away"))

    def cancel(self, request: str) -> bool:
        """Ask the server to take back ``request`` while it waits for a free worker."""
        with self._lock:
            found = [(t, p) for t, p in self._pending.items() if p.attempt.request == request]
            conn = self._conn
            if not found or conn is None:
                return False
            token, pending = found[0]
            pending.cancel_ack = ack = threading.Event()
        try:
            with self._write:
                conn.send_bytes(b"C" + _TOKEN.pack(token))
        except (OSError, ValueError):
            return False
        ack.wait(CANCEL_TIMEOUT)
        return pending.cancelled

    def _read(self, conn: mpc.Connection) -> None:
        while True:
            try:
                ready = conn.poll(0.1)
                message = conn.recv_bytes() if ready else b""
            except (EOFError, OSError):
                self._lost_server(conn)
                return
            if message:
                self._receive(message)
            self._expire()
            with self._lock:
                if self._closed and not self._pending:
                    return

    def _receive(self, message: bytes) -> None:
        head = message[:1]
        if len(message) < 9:
            return
        (token,) = _TOKEN.unpack_from(message, 1)
        if head == b"K":
            with self._lock:
                pending = self._pending.get(token)
            if pending is not None and pending.cancel_ack is not None:
                if message[9:] == b"1":
                    with self._lock:
                        self._pending.pop(token, None)
                    pending.cancelled = True
                    pending.done(Reply(CANCELLED, detail="cancelled before a worker took it"))
                pending.cancel_ack.set()
            return
        if head != b"A":
            return
        with self._lock:
            pending = self._pending.pop(token, None)
        if pending is None:
            return
        reply = decode_reply(message[9:])
        if reply.kind in (OK, ERROR):
            with self._lock:
                self._served += 1
                self._service += reply.seconds
        else:
            reply = Reply(reply.kind, detail=reply.body.decode(errors="replace"))
        pending.done(reply)
        if pending.cancel_ack is not None:
            pending.cancel_ack.set()

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            late = [(t, p) for t, p in self._pending.items() if p.until <= now]
            for token, _ in late:
                del self._pending[token]
        for _, pending in late:
            pending.done(
                Reply(
                    LOST,
                    detail=f"the served pool at {self.path} ({self._server}) did not answer within the "
                    "attempt's wait and timeout: it may be hung; the work may or may not have happened",
                )
            )

    def _lost_server(self, conn: mpc.Connection) -> None:
        with self._lock:
            if self._conn is conn:
                self._conn = None
            pending, self._pending = list(self._pending.values()), {}
        with contextlib.suppress(OSError):
            conn.close()
        for p in pending:
            p.done(
                Reply(
                    LOST,
                    detail=f"the served pool at {self.path} ({self._server}) went away while it held the "
                    "request",
                )
            )
            if p.cancel_ack is not None:
                p.cancel_ack.set()

    def stats(self) -> EngineStats:
        with self._lock:
            return EngineStats(-1, -1, -1, -1, self._arrivals, self._served, self._service)

    def close(self, timeout: float = 10.0) -> None:
        end = time.monotonic() + timeout
        with self._lock:
            self._closed = True
        while time.monotonic() < end:
            with self._lock:
                if not self._pending:
                    break
            time.sleep(0.02)
        with self._lock:
            conn, self._conn = self._conn, None
            left, self._pending = list(self._pending.values()), {}
        for p in left:
            p.done(Reply(LOST, detail="the pool client closed before the answer came"))
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.close()
        if self._reader is not None:
            self._reader.join(2.0)


# -- the server: ``foundry pool serve`` on local:// ---------------------------------------------------


class _Client:
    """One connected app: its requests in, answers out through its own writer thread (a
    slow or stuck client never blocks the dispatcher)."""

    def __init__(self, host: ServedHost, conn: mpc.Connection) -> None:
        self.host = host
        self.conn = conn
        self.out: deque[bytes] = deque()
        self.ready = threading.Condition()
        self.open = True
        self.tokens: dict[int, str] = {}  # token -> request id, while it is unanswered
        threading.Thread(target=self._write, name="foundry-served-out", daemon=True).start()
        threading.Thread(target=self._read, name="foundry-served-in", daemon=True).start()

    def put(self, message: bytes) -> None:
        with self.ready:
            self.out.append(message)
            self.ready.notify()

    def _write(self) -> None:
        while True:
            with self.ready:
                while not self.out and self.open:
                    self.ready.wait()
                if not self.out:
                    return
                message = self.out.popleft()
            try:
                self.conn.send_bytes(message)
            except (OSError, ValueError):
                self._gone()
                return

    def _read(self) -> None:
        host = self.host
        while True:
            try:
                message = self.conn.recv_bytes()
            except (EOFError, OSError):
                self._gone()
                return
            if len(message) < 9 or message[:1] not in (b"R", b"C"):
                log.warning("unit %r: the served pool dropped a malformed frame from a client", host.unit)
                continue
            (token,) = _TOKEN.unpack_from(message, 1)
            if message[:1] == b"C":
                request = self.tokens.get(token)
                ok = request is not None and host.local.cancel(request)
                self.put(b"K" + _TOKEN.pack(token) + (b"1" if ok else b"0"))
                continue
            frame = message[9:]
            try:
                attempt = attempt_from_frame(frame, host.unit, host.spec.codec)
            except ValueError as exc:
                self.put(b"A" + _TOKEN.pack(token) + refusal(host.unit, str(exc)))
                continue
            self.tokens[token] = attempt.request
            host.local.send(attempt, self._answer(token), frame=frame)

    def _answer(self, token: int) -> Done:
        def done(reply: Reply) -> None:
            self.tokens.pop(token, None)
            if reply.kind == CANCELLED:
                return  # the cancel's own acknowledgement says so
            if reply.kind in (OK, ERROR):
                frame = encode_reply(reply.kind, reply.body, reply.seconds)
            else:
                frame = encode_reply(reply.kind, reply.detail.encode())
            self.put(b"A" + _TOKEN.pack(token) + frame)

        return done

    def _gone(self) -> None:
        """The app went away: what it left waiting is taken back, nobody reads the rest."""
        with self.ready:
            if not self.open:
                return
            self.open = False
            self.ready.notify()
        for request in list(self.tokens.values()):
            self.host.local.cancel(request)
        with contextlib.suppress(OSError):
            self.conn.close()
        self.host.forget(self)

    def close(self) -> None:
        with self.ready:
            self.open = False
            self.ready.notify()


class ServedHost(LocalFront):
    """This machine's workers for one unit, served on its socket (``foundry pool serve``
    on ``local://``): Sizable by the elastic controller, drained on close."""

    def __init__(self, url: str, spec: EngineSpec) -> None:
        self.url = url
        self.spec = spec
        self.unit = spec.unit
        self.path = socket_path(spec.home, spec.app, spec.unit)
        _private_dir(self.path)
        self._claim()
        self.local = LocalPool("local://", spec, max_waiting=MAX_WAITING)
        self._clients: list[_Client] = []
        self._lock = threading.Lock()
        self._closed = False
        self._listener = mpc.Listener(self.path, family="AF_UNIX")
        os.chmod(self.path, 0o600)
        self._accepting = threading.Thread(
            target=self._accept, name=f"foundry-served-{self.unit}", daemon=True
        )
        self._accepting.start()

    def __repr__(self) -> str:
        return f"<ServedHost {self.unit} {self.path}>"

    def _claim(self) -> None:
        """Refuse to serve where a live server serves; remove a dead one's socket."""
        if not os.path.exists(self.path):
            return
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(self.path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(self.path)  # left by a server that died
            return
        finally:
            probe.close()
        raise BackendUnavailableError(
            f"unit {self.unit!r} is already served at {self.path}. Fix: stop that `foundry pool serve` "
            "first, or use another FOUNDRY_HOME"
        )

    def _accept(self) -> None:
        hello = b"H" + json.dumps({"pid": os.getpid(), "unit": self.unit, "codec": self.spec.codec}).encode()
        while True:
            try:
                conn = self._listener.accept()
            except OSError:
                return
            if self._closed:
                conn.close()
                return
            try:
                conn.send_bytes(hello)
            except OSError:
                conn.close()
                continue
            with self._lock:
                self._clients.append(_Client(self, conn))

    def forget(self, client: _Client) -> None:
        with self._lock:
            if client in self._clients:
                self._clients.remove(client)

    def close(self, timeout: float = 10.0) -> None:
        """Stop accepting; what runs and waits finishes within ``timeout`` (the rest is
        answered ``LOST`` or ``DEADLINE``); then every client is disconnected."""
        self._closed = True
        with contextlib.suppress(OSError):  # wake the accepting thread, which then stops
            mpc.Client(self.path, family="AF_UNIX").close()
        self._accepting.join(2.0)
        with contextlib.suppress(OSError):
            self._listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        self.local.close(timeout)
        with self._lock:
            clients = list(self._clients)
        deadline = time.monotonic() + 2.0
        for c in clients:  # let the last answers out
            while c.out and c.open and time.monotonic() < deadline:
                time.sleep(0.01)
            c.close()
            with contextlib.suppress(OSError):
                c.conn.close()
