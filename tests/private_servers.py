"""Private server instances for fault tests: never touch the machine's shared servers.

A test that stops, restarts or breaks a server starts its own private instance of it on
a free port, in a fresh temporary directory, and this module removes it afterwards
(process group killed, directory deleted), whether the test passed or not::

    with private_server("redis", appendonly=True) as redis:
        url = redis.url            # redis://127.0.0.1:<port>/0
        ...
        redis.restart()            # stop, then start on the same port and data dir

``restart()`` is a real restart: the server process exits (its clients' connections
drop, the port closes) and a new process starts on the same port and the same data
directory, so what the server keeps durably survives it and nothing else does.

Kinds: ``redis`` (``redis-server``), ``nats`` (``nats-server`` with JetStream),
``postgres`` (``initdb`` + ``postgres``; as root it runs as the ``postgres`` user; a
``test`` database, trust auth) and ``rabbitmq`` (a separately named node with its own
ports, mnesia, logs, config and Erlang cookie). A missing binary skips the test on a
laptop and fails it under ``CI=true`` (the rule of ``tests.services.require``); a
server that does not become ready in time fails the test and prints its log.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

READY_TIMEOUT = 60.0  # a loaded shared machine: RabbitMQ alone takes seconds to boot
STOP_TIMEOUT = 30.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _missing(what: str) -> None:
    message = f"{what} is not installed here: cannot start a private instance for this fault test"
    if os.environ.get("CI"):
        pytest.fail(f"{message}, and CI=true: a missing server is a failure, not a skip")
    pytest.skip(message)


def _binary(name: str, *candidates: str) -> str:
    for path in (*candidates, shutil.which(name)):
        if path and os.access(path, os.X_OK):
            return path
    _missing(name)
    raise AssertionError("unreachable")


class PrivateServerError(AssertionError):
    """The private instance did not start or stop; the message carries its log."""


class PrivateServer:
    """One private instance. Subclasses say how to start it, stop it and ask if it is
    ready; this class owns the process, the port, the directory and the teardown."""

    kind = "server"

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"foundry-private-{self.kind}-"))
        self.log_path = self.dir / f"{self.kind}.log"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    # -- what a kind defines -------------------------------------------------------

    @property
    def url(self) -> str:
        raise NotImplementedError

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def popen_options(self) -> dict[str, Any]:
        return {}

    def prepare(self) -> None:
        """Lay out the instance directory before the first start (nothing by default)."""

    def ready(self) -> bool:
        raise NotImplementedError

    def request_stop(self, proc: subprocess.Popen[bytes]) -> None:
        """Ask the server to shut down cleanly (as its service manager would)."""
        proc.terminate()

    # -- the life cycle ------------------------------------------------------------

    def start(self) -> None:
        """Start the server on ``self.port`` and wait until it answers."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        with open(self.log_path, "ab") as log:
            log.write(f"\n--- start #{self.starts + 1} on port {self.port} ---\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env(),
                cwd=self.dir,
                start_new_session=True,  # its own process group: teardown kills all of it
                **self.popen_options(),
            )
        self.starts += 1
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                self.fail(f"exited with status {self.proc.returncode} while starting")
            if self.ready():
                return
            if time.monotonic() > deadline:
                self.fail(f"not ready after {READY_TIMEOUT:.0f}s")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server cleanly; wait until its process is gone and its port closed."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        self.request_stop(proc)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._kill_group(proc)
            self.fail(f"did not stop within {STOP_TIMEOUT:.0f}s of a clean shutdown request")
        self._kill_group(proc)  # helpers it left behind, if any
        deadline = time.monotonic() + STOP_TIMEOUT
        while _port_open(self.port):
            if time.monotonic() > deadline:
                self.fail("stopped, but its port still answers")
            time.sleep(0.05)

    def restart(self, down: float = 0.0) -> float:
        """Stop, stay down ``down`` seconds, start again on the same port and data
        directory. Returns how long the server did not answer."""
        began = time.monotonic()
        self.stop()
        time.sleep(down)
        self.start()
        return time.monotonic() - began

    def close(self) -> None:
        """Kill whatever is left of the instance and delete its directory."""
        try:
            if self.proc is not None and self.proc.poll() is None:
                with contextlib.suppress(Exception):
                    self.request_stop(self.proc)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(10)
            if self.proc is not None:
                self._kill_group(self.proc)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def log(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def fail(self, why: str) -> None:
        raise PrivateServerError(
            f"private {self.kind} instance on port {self.port} ({self.dir}): {why}\n"
            f"--- its log ({self.log_path}) ---\n{self.log()}"
        )

    @staticmethod
    def _kill_group(proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)


class PrivateRedis(PrivateServer):
    """``redis-server`` on its own port and directory. ``appendonly=True`` keeps the data
    set in an append-only file (``appendfsync everysec``, Redis's default), so a clean
    restart loses nothing; with ``False`` (the shared server's setting) a restart starts
    empty. RDB snapshots are off either way (``--save ""``)."""

    kind = "redis"

    def __init__(self, appendonly: bool = True) -> None:
        self.binary = _binary("redis-server")
        self.appendonly = appendonly
        super().__init__()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--daemonize", "no",
            "--protected-mode", "yes",
        ]  # fmt: skip

    def ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")  # -LOADING while it reads the AOF
        except OSError:
            return False


class PrivateNats(PrivateServer):
    """``nats-server -js`` on its own port with its own JetStream store directory."""

    kind = "nats"

    def __init__(self) -> None:
        self.binary = _binary("nats-server", "/usr/sbin/nats-server")
        super().__init__()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            self.binary,
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-js",
            "-sd",
            str(self.dir / "jetstream"),
        ]

    def ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                return sock.recv(8).startswith(b"INFO")
        except OSError:
            return False


def _postgres_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    return _binary(name, *reversed(found))


class PrivatePostgres(PrivateServer):
    """A PostgreSQL cluster of its own: ``initdb`` (trust auth, superuser ``postgres``)
    into the instance directory, ``postgres -p PORT -k DIR`` in the foreground, a
    ``test`` database. As root it runs as the ``postgres`` user (PostgreSQL refuses
    root). Stopping is a fast shutdown (SIGINT: sessions are terminated, a shutdown
    checkpoint is written), so committed data survives the restart."""

    kind = "postgres"

    def __init__(self) -> None:
        self.postgres = _postgres_bin("postgres")
        self.initdb = _postgres_bin("initdb")
        super().__init__()
        self.data = self.dir / "data"
        self.user: dict[str, Any] = {}
        if os.geteuid() == 0:
            self.user = {"user": "postgres", "group": "postgres", "extra_groups": []}

    def prepare(self) -> None:
        if self.user:
            shutil.chown(self.dir, "postgres", "postgres")
        out = subprocess.run(
            [self.initdb, "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"],
            capture_output=True,
            cwd=self.dir,
            timeout=120,
            **self.user,
        )
        if out.returncode != 0:
            self.fail(
                f"initdb failed: {out.stdout.decode(errors='replace')}{out.stderr.decode(errors='replace')}"
            )

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/test"

    def command(self) -> list[str]:
        return [
            self.postgres,
            "-D", str(self.data),
            "-p", str(self.port),
            "-k", str(self.dir),
            "-c", "listen_addresses=127.0.0.1",
        ]  # fmt: skip

    def popen_options(self) -> dict[str, Any]:
        return self.user

    def request_stop(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGINT)  # "fast" shutdown, as `pg_ctl stop -m fast`

    def ready(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(
                f"postgresql://postgres@127.0.0.1:{self.port}/postgres", connect_timeout=2, autocommit=True
            ) as conn:
                if conn.execute("SELECT 1 FROM pg_database WHERE datname = 'test'").fetchone() is None:
                    conn.execute("CREATE DATABASE test")
            return True
        except psycopg.Error:
            return False


class PrivateRabbitMQ(PrivateServer):
    """A RabbitMQ node of its own: node name ``foundry-test-<id>@localhost``, its own
    AMQP and distribution ports, mnesia, logs, config file (the listener on its port
    only), an empty plugins file and its own Erlang cookie (``HOME`` is the instance
    directory). ``rabbitmqctl -n <node>`` addresses it and nothing else. A restart is a
    full ``stop`` of the node and a fresh boot from the same mnesia directory, so durable
    queues and persistent messages come back from disk."""

    kind = "rabbitmq"

    def __init__(self) -> None:
        self.server = _binary("rabbitmq-server", "/usr/lib/rabbitmq/bin/rabbitmq-server")
        self.ctl = _binary("rabbitmqctl", "/usr/lib/rabbitmq/bin/rabbitmqctl")
        super().__init__()
        self.dist_port = free_port()
        self.node = f"foundry-test-{uuid.uuid4().hex[:10]}@localhost"

    def prepare(self) -> None:
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{self.port}\nloopback_users.guest = true\n"
        )
        (self.dir / "rabbitmq-env.conf").write_text("")
        (self.dir / "enabled_plugins").write_text("[].\n")
        cookie = self.dir / ".erlang.cookie"
        cookie.write_text(uuid.uuid4().hex.upper())
        cookie.chmod(0o400)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def command(self) -> list[str]:
        return [self.server]

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "HOME": str(self.dir),  # the cookie
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
            "RABBITMQ_CONF_ENV_FILE": str(self.dir / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_LOGS": "-",  # to stdout, i.e. the instance log
            "RABBITMQ_PID_FILE": str(self.dir / "node.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    def ctl_run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``rabbitmqctl -n <this node> ARGS`` (only ever this private instance)."""
        return subprocess.run(
            [self.ctl, "-n", self.node, *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.dir,
        )

    def ready(self) -> bool:
        # The AMQP listener opens last in the boot, once queues are recovered.
        return _port_open(self.port)

    def request_stop(self, proc: subprocess.Popen[bytes]) -> None:
        # this private instance only: `-n` names our node
        out = self.ctl_run("stop", timeout=STOP_TIMEOUT)
        if out.returncode != 0:
            proc.terminate()  # SIGTERM is a clean shutdown too


SERVERS: dict[str, type[PrivateServer]] = {
    "redis": PrivateRedis,
    "nats": PrivateNats,
    "postgres": PrivatePostgres,
    "rabbitmq": PrivateRabbitMQ,
}


@contextlib.contextmanager
def private_server(kind: str, **options: Any) -> Iterator[PrivateServer]:
    """A started private instance of ``kind`` (see :data:`SERVERS`), removed afterwards
    whatever happens. Its ``url`` is what a test connects to; ``restart()`` restarts it."""
    server = SERVERS[kind](**options)
    try:
        server.prepare()
        server.start()
        yield server
    finally:
        server.close()
