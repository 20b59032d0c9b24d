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
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import socket
import sys

__all__ = ["Doorbell", "supported"]


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
