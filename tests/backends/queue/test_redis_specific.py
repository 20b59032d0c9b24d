"""What only the Redis engine does: key layout and expiry, prefixes, the bounded
reconnect, stopping a claimer blocked in ``BLPOP``, and a Redis restart under a running
worker (the contract itself is checked by ``test_conformance.py``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from foundry.backends.queue import open_queue_backend
from foundry.backends.queue.redis import RedisQueue
from foundry.errors import BackendUnavailableError, ConfigError
from tests.backends.queue._helpers import LONG, Namespace, assert_a_stop_wakes_a_waiting_claimer, job
from tests.backends.queue._restart import run_through_restart
from tests.private_servers import PrivateServer, private_server
from tests.services import require


@pytest.fixture
def namespace() -> Iterator[Namespace[RedisQueue]]:
    """A private prefix; every key under it is deleted after the test."""
    with Namespace(f"{require('redis')}?prefix=fqr{uuid.uuid4().hex[:10]}", RedisQueue) as ns:
        yield ns


@pytest.fixture
def url(namespace: Namespace[RedisQueue]) -> str:
    return namespace.url


@pytest.fixture
def backend(namespace: Namespace[RedisQueue]) -> RedisQueue:
    return namespace.open()


def test_a_finished_job_and_its_key_expire_after_result_ttl(backend: RedisQueue) -> None:
    key = f"k-{uuid.uuid4().hex}"
    new = job("q", key=key, result_ttl=30.0)
    backend.enqueue(new)
    assert backend.client.pttl(f"{backend.prefix}j:{new.id}") == -1  # queued: kept until it finishes
    c = backend.claim("q", "w", lease=LONG, limit=1, timeout=1)[0]
    assert backend.complete(c.id, c.token, b"1")
    for name in (f"j:{new.id}", f"k:{key}"):
        ttl = backend.client.pttl(backend.prefix + name)
        assert 0 < ttl <= 30_000
    # Requeueing a finished-for-good job keeps it again
    other = job("q")
    backend.enqueue(other)
    c = backend.claim("q", "w", lease=LONG, limit=1, timeout=1)[0]
    assert backend.fail(c.id, c.token, b"{}")
    assert backend.requeue(c.id)
    assert backend.client.pttl(f"{backend.prefix}j:{other.id}") == -1


def test_prefixes_keep_namespaces_apart(url: str, backend: RedisQueue) -> None:
    other = RedisQueue(f"{require('redis')}?prefix=fqr{uuid.uuid4().hex[:10]}")
    try:
        backend.enqueue(job("shared", key="same-key"))
        assert other.find("same-key") is None
        assert other.claim("shared", "w", lease=LONG, limit=1, timeout=0) == []
        assert other.enqueue(job("shared", key="same-key")).created
    finally:
        other.destroy()
        other.close()


def test_destroy_removes_every_key_of_the_prefix(url: str) -> None:
    b = RedisQueue(url)
    try:
        b.enqueue(job("q", key="k"))
        c = b.claim("q", "w", lease=LONG, limit=1, timeout=1)[0]
        b.fail(c.id, c.token, b"{}", dead_reason="test")
        assert b.client.keys(b.prefix + "*")
        b.destroy()
        assert b.client.keys(b.prefix + "*") == []
    finally:
        b.close()


def test_stopping_wakes_a_claimer_blocked_in_blpop(backend: RedisQueue) -> None:
    assert_a_stop_wakes_a_waiting_claimer(backend, lambda: bool(backend._blocked.get("idle")))


@pytest.mark.parametrize(
    ("query", "match"),
    [("prefix=a b", "prefix"), ("prefx=x", "unknown option"), ("reconnect=-1", "reconnect")],
)
def test_bad_urls_are_config_errors(query: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        open_queue_backend(f"redis://127.0.0.1:6379/0?{query}")


def test_an_unreachable_server_is_a_bounded_backend_unavailable_error() -> None:
    with pytest.raises(BackendUnavailableError, match="Redis unreachable"):
        open_queue_backend("redis://127.0.0.1:1/0?reconnect=0.3")


@pytest.fixture
def private_redis() -> Iterator[PrivateServer]:
    """A private ``redis-server`` (never the shared one) that keeps its data set in an
    append-only file, so a clean restart loses nothing it acknowledged."""
    with private_server("redis", appendonly=True) as server:
        yield server


@pytest.mark.slow
def test_a_redis_restart_mid_run_loses_nothing(private_redis: PrivateServer) -> None:
    """Redis's durability is the queue's (docs/queue-engines.md): with AOF on, a restart
    (SIGTERM: Redis fsyncs the AOF and exits; a new process loads it) loses no job."""
    run_through_restart(f"{private_redis.url}?prefix=fqr{uuid.uuid4().hex[:10]}", private_redis.restart)
