"""The private server instances the fault tests restart (``tests/private_servers.py``):
each starts on a port of its own, a restart really ends the server process (a
connection from before is dead afterwards) and keeps what the server keeps durably, and
afterwards nothing is left: no process, no directory, whether the test passed or not."""

from __future__ import annotations

import asyncio
import os
import re
import socket

import pytest

from tests.private_servers import PrivateServer, private_server
from tests.services import SERVICES


def _gone(server: PrivateServer) -> None:
    assert server.proc is not None
    assert server.proc.poll() is not None, "the process is still running"
    assert not server.dir.exists(), f"{server.dir} was not removed"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=0.5).close()


def _answer(sock: socket.socket, request: bytes) -> bytes:
    """What a connection answers now: b"" when the server closed it."""
    try:
        sock.sendall(request)
        return sock.recv(64)
    except OSError:
        return b""


def _not_shared(server: PrivateServer) -> None:
    assert server.port not in {port for _, port in SERVICES.values()}
    assert str(server.port) in server.url


def test_redis_with_aof_keeps_its_data_across_a_restart_and_drops_old_connections() -> None:
    import redis

    with private_server("redis", appendonly=True) as server:
        _not_shared(server)
        client = redis.Redis.from_url(server.url, socket_timeout=5)
        client.set("k", "v")
        old = socket.create_connection(("127.0.0.1", server.port), timeout=5)  # before the restart
        old.sendall(b"PING\r\n")
        assert old.recv(64) == b"+PONG\r\n"
        pid = server.proc.pid if server.proc else None
        server.restart()
        assert server.proc is not None
        assert server.proc.pid != pid, "no new server process"
        assert _answer(old, b"PING\r\n") == b"", "a connection from before the restart still answers"
        old.close()
        assert client.get("k") == b"v"
        client.close()
    _gone(server)


def test_redis_without_persistence_starts_empty_after_a_restart() -> None:
    import redis

    with private_server("redis", appendonly=False) as server:
        client = redis.Redis.from_url(server.url, socket_timeout=5)
        client.set("k", "v")
        client.close()
        server.restart()
        client = redis.Redis.from_url(server.url, socket_timeout=5)
        assert client.get("k") is None  # a restart of the shared, non-persistent server loses data
        client.close()
    _gone(server)


def test_postgres_keeps_committed_rows_across_a_restart_and_ends_every_session() -> None:
    import psycopg

    with private_server("postgres") as server:
        _not_shared(server)
        assert server.url.endswith("/test")
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (n int)")
            conn.execute("INSERT INTO t VALUES (1)")
        old = psycopg.connect(server.url, autocommit=True)
        server.restart()
        with pytest.raises(psycopg.OperationalError):
            old.execute("SELECT 1")
        old.close()
        with psycopg.connect(server.url, autocommit=True) as conn:
            assert conn.execute("SELECT n FROM t").fetchall() == [(1,)]
    _gone(server)


def test_nats_keeps_a_jetstream_stream_across_a_restart() -> None:
    import nats

    async def publish(url: str) -> None:
        nc = await nats.connect(url, allow_reconnect=False)
        js = nc.jetstream()
        await js.add_stream(name="S", subjects=["s"])
        await js.publish("s", b"kept")
        await nc.close()

    async def read(url: str) -> int:
        nc = await nats.connect(url, allow_reconnect=False)
        info = await nc.jetstream().stream_info("S")
        await nc.close()
        return int(info.state.messages)

    with private_server("nats") as server:
        _not_shared(server)
        asyncio.run(publish(server.url))
        server.restart()
        assert asyncio.run(read(server.url)) == 1
    _gone(server)


@pytest.mark.slow
def test_a_rabbitmq_node_of_its_own_keeps_a_durable_queue_across_a_full_restart() -> None:
    import aio_pika

    async def count(url: str, publish: bool) -> int:
        conn = await aio_pika.connect(url, timeout=30)
        async with conn:
            channel = await conn.channel()  # publisher confirms on
            queue = await channel.declare_queue("q", durable=True, passive=not publish)
            if publish:
                message = aio_pika.Message(b"kept", delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
                await channel.default_exchange.publish(message, routing_key="q")
                queue = await channel.declare_queue("q", durable=True, passive=True)
            return int(queue.declaration_result.message_count or 0)

    with private_server("rabbitmq") as server:
        _not_shared(server)
        assert getattr(server, "node", "").startswith("foundry-test-")
        assert asyncio.run(count(server.url, publish=True)) == 1
        server.restart()  # the whole node stops and boots again from its mnesia directory
        assert asyncio.run(count(server.url, publish=False)) == 1
    _gone(server)


def test_a_failing_test_still_removes_its_instance() -> None:
    seen: list[PrivateServer] = []

    def failing_test() -> None:
        with private_server("redis") as server:
            seen.append(server)
            raise RuntimeError("the test failed")

    with pytest.raises(RuntimeError):
        failing_test()
    _gone(seen[0])


def test_a_server_that_cannot_start_fails_with_its_log(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests import private_servers

    original = private_servers.PrivateRedis.command

    def broken(self: private_servers.PrivateRedis) -> list[str]:
        return [*original(self), "--no-such-option", "1"]

    monkeypatch.setattr(private_servers.PrivateRedis, "command", broken)
    with pytest.raises(private_servers.PrivateServerError, match="no-such-option") as failure:
        private_server("redis").__enter__()
    assert "its log" in str(failure.value)
    where = re.search(r"\((/[^)]*foundry-private-redis-[^)]*)\)", str(failure.value))
    assert where is not None, str(failure.value)
    assert not os.path.exists(where.group(1)), "the directory of a failed start was not removed"
