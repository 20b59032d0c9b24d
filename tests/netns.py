"""Worker "hosts" in network namespaces that a test makes itself, and a TCP forwarder
that lets them reach the shared servers (which listen on 127.0.0.1 only) without
touching those servers or the host's own network.

Layout: a ``hub`` namespace holds a bridge; each host namespace (``h1``, ``h2`` …) has
one veth pair to it. Every address lives inside those namespaces (a random
``10.x.y.0/24``); names carry a unique prefix; :meth:`Network.down` deletes every
namespace (and with them their links), in a ``finally``, even on failure.

:class:`Forwarder` runs in the test process: its listening socket is made *inside* the
hub namespace (on the bridge's address: a thread enters the namespace with
``setns(2)`` just long enough to bind it), and each connection it accepts is forwarded
to ``127.0.0.1:PORT`` from the host's own namespace. So a worker in ``h1`` connects to
``HUB:PORT`` and talks to the shared server, and nothing listens anywhere else.

:meth:`Network.cut` takes a host's link down *inside its namespace*: its packets go
nowhere, its TCP connections hang rather than close (no RST, no FIN) — a machine
unplugged, the hard case for leases. The forwarder keeps the server side of those
connections open, as a real network would until TCP keepalive gives up.

Needs root and iproute2; :func:`why_not` says why not, for a skip (locally) or a failure
(CI=true). ``tests/pool/test_netns.py`` has the first version of this class (the lead
will merge the two).
"""

from __future__ import annotations

import ctypes
import os
import random
import shutil
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

import pytest

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def ip(*args: str, ns: str | None = None) -> None:
    command = ["ip", "-n", ns, *args] if ns else ["ip", *args]
    subprocess.run(command, check=True, capture_output=True, timeout=30)


def why_not() -> str | None:
    """Why namespaces cannot be made here, or ``None`` when they can."""
    if os.geteuid() != 0:
        return "needs root for ip netns"
    if not shutil.which("ip"):
        return "needs iproute2 (ip)"
    return None


def require_namespaces() -> None:
    why = why_not()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"{why} and CI=true")
        pytest.skip(why)


class Network:
    """``hub`` (a bridge) and host namespaces, each on its own veth to the bridge."""

    def __init__(self, hosts: Iterable[str] = ("h1", "h2")) -> None:
        self.tag = "fm" + uuid.uuid4().hex[:5]
        self.subnet = f"10.{random.randint(200, 250)}.{random.randint(0, 255)}"
        self.hub = f"{self.tag}hub"
        self.hosts = {n: f"{self.tag}{n}" for n in hosts}
        self.made: list[str] = []

    def address(self, n: str) -> str:
        if n == "hub":
            return f"{self.subnet}.1"
        return f"{self.subnet}.{11 + list(self.hosts).index(n)}"

    def up(self) -> None:
        for ns in (self.hub, *self.hosts.values()):
            ip("netns", "add", ns)
            self.made.append(ns)
            ip("link", "set", "lo", "up", ns=ns)
        bridge = f"{self.tag}br"
        ip("link", "add", bridge, "type", "bridge", ns=self.hub)
        ip("addr", "add", f"{self.address('hub')}/24", "dev", bridge, ns=self.hub)
        ip("link", "set", bridge, "up", ns=self.hub)
        for n, ns in self.hosts.items():
            outer, inner = f"{self.tag}{n}a", f"{self.tag}{n}b"
            ip("link", "add", outer, "netns", self.hub, "type", "veth", "peer", "name", inner, "netns", ns)
            ip("link", "set", outer, "master", bridge, ns=self.hub)
            ip("link", "set", outer, "up", ns=self.hub)
            ip("addr", "add", f"{self.address(n)}/24", "dev", inner, ns=ns)
            ip("link", "set", inner, "up", ns=ns)

    def cut(self, n: str) -> None:
        """Take host ``n``'s link down inside its own namespace: its connections hang."""
        ip("link", "set", f"{self.tag}{n}b", "down", ns=self.hosts[n])

    def exec(self, n: str) -> list[str]:
        """The command prefix that runs a program on host ``n``."""
        return ["ip", "netns", "exec", self.hosts[n]]

    def down(self) -> None:
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False)
        self.made.clear()


def _setns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def listen_in(namespace: str, address: str) -> socket.socket:
    """A listening TCP socket on ``address`` (free port) inside ``namespace``, made by a
    thread that enters the namespace and comes back (setns affects that thread only)."""
    made: list[socket.socket | BaseException] = []

    def bind() -> None:
        home = f"/proc/self/task/{threading.get_native_id()}/ns/net"
        back = os.open(home, os.O_RDONLY)
        try:
            _setns(f"/var/run/netns/{namespace}")
            try:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((address, 0))
                sock.listen(64)
                made.append(sock)
            finally:
                if _libc.setns(back, CLONE_NEWNET) != 0:  # never leave a thread in the namespace
                    os._exit(99)
        except BaseException as exc:
            made.append(exc)
        finally:
            os.close(back)

    thread = threading.Thread(target=bind, name="netns-bind")
    thread.start()
    thread.join(30)
    result = made[0]
    if isinstance(result, BaseException):
        raise result
    return result


class Forwarder:
    """``HUB:port`` inside the hub namespace → ``127.0.0.1:target`` on the host side."""

    def __init__(self, net: Network, target: int) -> None:
        self.target = target
        self._listener = listen_in(net.hub, net.address("hub"))
        self.host, self.port = self._listener.getsockname()[:2]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name=f"forward-{target}", daemon=True).start()

    def reroute(self, url: str) -> str:
        """``url`` (which names 127.0.0.1:target) with the forwarder's address instead."""
        parts = urlsplit(url)
        netloc = parts.netloc.replace(f"127.0.0.1:{self.target}", f"{self.host}:{self.port}")
        assert netloc != parts.netloc, f"{url} does not name 127.0.0.1:{self.target}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))

    def _accept(self) -> None:
        while not self._closed:
            try:
                inside, _ = self._listener.accept()
            except OSError:
                return
            try:
                outside = socket.create_connection(("127.0.0.1", self.target), timeout=10)
                outside.settimeout(None)
            except OSError:
                inside.close()
                continue
            with self._lock:
                if self._closed:
                    inside.close()
                    outside.close()
                    return
                self._sockets += [inside, outside]
            for a, b in ((inside, outside), (outside, inside)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets, self._sockets = self._sockets, []
        self._listener.close()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
