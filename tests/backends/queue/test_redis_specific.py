"""What only the Redis engine does: key layout and expiry, prefixes, the bounded
reconnect, stopping a claimer blocked in ``BLPOP``, and a Redis restart under a running
worker (the contract itself is checked by ``test_conformance.py``)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from foundry.backends.queue import open_queue_backend
from foundry.backends.queue.base import JobStatus
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


def _previous_format(backend: RedisQueue, queue: str, job_id: str, key: str) -> None:
    """Plant a job as the enqueue script before the sparse record wrote it: every one of the
    21 fields, the defaults included (a queue with jobs in it during an upgrade)."""
    c, p = backend.client, backend.prefix
    seq = c.incr(p + "seq")
    now = time.time()
    m = f"{now * 1e6:017.0f}{seq:012d}{job_id}"
    c.hset(
        f"{p}j:{job_id}",
        mapping={
            "id": job_id, "queue": queue, "unit": "u", "payload": b"{}", "codec": "json", "key": key,
            "priority": "0", "eta": repr(now), "status": "queued", "token": "", "worker": "",
            "lease_until": "0", "deliveries": "0", "attempts": "0", "max_retries": "3",
            "max_deliveries": "5", "timeout": "", "result_ttl": "30.0", "enqueued_at": repr(now), "m": m,
            "trace": "",
        },
    )  # fmt: skip
    c.set(f"{p}k:{key}", job_id)
    c.zadd(f"{p}q:{queue}:ready", {m: 0})
    c.sadd(p + "queues", queue)


def test_a_job_recorded_in_the_previous_format_runs_retries_and_finishes(backend: RedisQueue) -> None:
    # Given a job written as the previous enqueue wrote it, and one written now beside it
    queue, job_id, key = f"q{uuid.uuid4().hex[:6]}", uuid.uuid4().hex, f"k-{uuid.uuid4().hex}"
    _previous_format(backend, queue, job_id, key)
    fresh = job(queue)
    backend.enqueue(fresh)
    assert not backend.client.hexists(f"{backend.prefix}j:{fresh.id}", "token")  # the sparse one
    # When both are claimed, the old one fails once, is retried and succeeds
    got = {c.id: c for c in backend.claim(queue, "w", lease=LONG, limit=5, timeout=1)}
    assert set(got) == {job_id, fresh.id}
    assert got[job_id].deliveries == 1
    assert got[job_id].max_deliveries == 5
    assert got[job_id].timeout is None
    assert backend.fail(job_id, got[job_id].token, b'"boom"', retry_at=time.time())
    again = backend.claim(queue, "w", lease=LONG, limit=5, timeout=1)
    assert [c.id for c in again] == [job_id]
    assert again[0].deliveries == 2
    assert again[0].attempts == 1
    assert backend.complete_many([(job_id, again[0].token, b"1"), (fresh.id, got[fresh.id].token, b"2")]) == [
        True,
        True,
    ]
    # Then each has one completion record, its result, its key, and its own expiry
    old = backend.get(job_id)
    assert old is not None
    assert old.status is JobStatus.SUCCEEDED
    assert old.result == b"1"
    assert old.error is None
    assert old.key == key
    assert backend.find(key) == old
    assert 0 < backend.client.pttl(f"{backend.prefix}j:{job_id}") <= 30_000  # its own result_ttl
    new_state = backend.get(fresh.id)
    assert new_state is not None
    assert new_state.result == b"2"
    assert new_state.key is None
    assert 0 < backend.client.pttl(f"{backend.prefix}j:{fresh.id}") <= 7 * 86400 * 1000  # the default
    assert not backend.complete(job_id, again[0].token, b"3")  # done once
    assert backend.stats(queue).running == 0
    assert backend.stats(queue).depth == 0


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
