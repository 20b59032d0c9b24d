"""What only the RabbitMQ engine does: the state store on each of Foundry's stores, the
delays held in the broker, jobs that lost their message, prefetched messages given
back to other workers, option errors, and a RabbitMQ restart under a running worker
(the contract itself is checked by ``test_conformance.py``)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from foundry.backends.queue import JobStatus, open_queue_backend
from foundry.backends.queue.amqp import AmqpQueue
from foundry.errors import BackendUnavailableError, ConfigError
from tests.backends.queue._helpers import (
    LONG,
    Namespace,
    assert_a_stop_wakes_a_waiting_claimer,
    expect,
    job,
)
from tests.backends.queue._restart import run_through_restart
from tests.backends.queue.engines import drop_schema
from tests.private_servers import PrivateServer, private_server
from tests.services import require


@pytest.fixture
def namespace(tmp_path: Path) -> Iterator[Namespace[AmqpQueue]]:
    """A private prefix, its state in a SQLite file; its queues and state are deleted
    after the test."""
    state = quote(f"sqlite:///{tmp_path / 'state.db'}", safe="")
    url = f"{require('rabbitmq')}?prefix=fqa{uuid.uuid4().hex[:10]}&state={state}"
    with Namespace(url, AmqpQueue) as ns:
        yield ns


@pytest.fixture
def url(namespace: Namespace[AmqpQueue]) -> str:
    return namespace.url


@pytest.fixture
def backend(namespace: Namespace[AmqpQueue]) -> AmqpQueue:
    return namespace.open()


def round_trip(b: AmqpQueue) -> None:
    new = job("q", key=f"k-{uuid.uuid4().hex}")
    assert b.enqueue(new).created
    c = b.claim("q", "w", lease=LONG, limit=1, timeout=10)[0]
    assert c.id == new.id
    assert b.complete(c.id, c.token, b'"ok"')
    state = expect(b.wait(new.id, timeout=10), JobStatus.SUCCEEDED)
    assert state.result == b'"ok"'


@pytest.mark.parametrize("store", ["redis", "postgres"])
def test_the_state_store_can_be_redis_or_postgresql(store: str) -> None:
    tag = uuid.uuid4().hex[:10]
    state = require(store)
    if store == "postgres":
        state = f"{state}?schema=fq_amqp_{tag}"
    url = f"{require('rabbitmq')}?prefix=fqa{tag}&state={quote(state, safe='')}"
    try:
        with Namespace(url, AmqpQueue) as ns:
            b = ns.open()
            round_trip(b)
            assert type(b.state).__name__ == ("RedisQueue" if store == "redis" else "PostgresQueue")
    finally:
        drop_schema(state)


def test_a_delay_waits_in_a_broker_ttl_queue(backend: AmqpQueue) -> None:
    new = job("q", eta=time.time() + 0.6)
    backend.enqueue(new)
    assert backend.client.flush(10)
    # 600 ms ahead -> the 512 ms delay queue holds the message; no worker memory involved
    assert backend.client.message_count(f"{backend.prefix}.q.delay.512") == 1
    assert backend.claim("q", "w", lease=LONG, limit=1, timeout=0) == []
    got = backend.claim("q", "w", lease=LONG, limit=1, timeout=20)
    assert [c.id for c in got] == [new.id]
    assert time.time() >= new.eta  # type: ignore[operator]


def test_a_job_that_lost_its_message_is_published_again(namespace: Namespace[AmqpQueue]) -> None:
    b = namespace.open("&orphan_after=0.05")
    # Given a job in the state store whose message never reached the broker
    # (its submitter died between the commit and the publish)
    lost = job("q")
    b.state.enqueue(lost)
    time.sleep(0.1)
    # Then a claimer that finds the broker queue empty publishes it again
    got = b.claim("q", "w", lease=LONG, limit=1, timeout=10)
    assert [c.id for c in got] == [lost.id]


def test_a_message_no_queue_takes_is_published_again_not_dropped(namespace: Namespace[AmqpQueue]) -> None:
    """RabbitMQ confirms a message that no queue took with an ordinary ack. Foundry
    publishes every message mandatory: a returned one declares its queue again and goes
    again — never left to the ``orphan_after`` sweep."""
    b = namespace.open("&orphan_after=3600")
    first = job("q")
    b.enqueue(first)
    assert b.client.flush(10)  # the queue is declared on this connection now
    # Given the broker's queue is deleted under the publisher (an operator, a policy)
    main = f"{b.prefix}.q"

    async def delete() -> None:
        ch = await b.client._conn.channel(publisher_confirms=False)
        await ch.queue_delete(main)
        await ch.close()

    b.client.run(delete(), 10)
    # When the next job is published
    second = job("q")
    b.enqueue(second)
    assert b.client.flush(10)
    # Then its message is in the (declared again) queue, and a claimer gets it
    assert b.client.message_count(main) == 1
    got = b.claim("q", "w", lease=LONG, limit=5, timeout=10)
    assert [c.id for c in got] == [second.id]


def test_prefetched_messages_go_back_to_other_workers_after_linger(namespace: Namespace[AmqpQueue]) -> None:
    a, other = namespace.open("&linger=0.3"), namespace.open("&linger=0.3")
    first, second = job("q"), job("q")
    a.enqueue(first)
    a.enqueue(second)
    # a claims one; the broker pushes the next into a's prefetch buffer
    assert [c.id for c in a.claim("q", "w", lease=LONG, limit=1, timeout=10)] == [first.id]
    # a stops claiming (busy): after its linger the message goes to the other worker
    assert [c.id for c in other.claim("q", "w2", lease=LONG, limit=1, timeout=20)] == [second.id]


def test_a_duplicate_message_is_dropped(backend: AmqpQueue) -> None:
    new = job("q")
    backend.enqueue(new)
    backend._announce("q", new.id, 0)  # a second message for the same job
    got = backend.claim("q", "w", lease=LONG, limit=5, timeout=10)
    assert [c.id for c in got] == [new.id]
    assert backend.claim("q", "w", lease=LONG, limit=5, timeout=0.5) == []
    state = backend.get(new.id)
    assert state is not None
    assert state.deliveries == 1


def test_another_max_priority_on_the_same_queue_is_a_config_error(
    namespace: Namespace[AmqpQueue], backend: AmqpQueue
) -> None:
    backend.enqueue(job("q"))
    assert backend.claim("q", "w", lease=LONG, limit=1, timeout=10)
    other = namespace.open("&max_priority=3")
    with pytest.raises(ConfigError, match="max_priority"):
        other.claim("q", "w", lease=LONG, limit=1, timeout=1)


def test_stopping_wakes_a_waiting_claimer(backend: AmqpQueue) -> None:
    def waiting() -> bool:
        return backend.client.consumer(f"{backend.prefix}.idle").channel is not None

    assert_a_stop_wakes_a_waiting_claimer(backend, waiting)


@pytest.mark.parametrize(
    ("query", "match"),
    [("prefix=a.b", "prefix"), ("prefx=x", "unknown option"), ("max_priority=0", "max_priority")],
)
def test_bad_urls_are_config_errors(query: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        open_queue_backend(f"amqp://guest:guest@127.0.0.1:5672/?{query}")


def test_a_bad_state_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="state"):
        open_queue_backend("amqp://guest:guest@127.0.0.1:5672/?state=mongodb://x")


def test_an_unreachable_broker_is_a_bounded_backend_unavailable_error(tmp_path: Path) -> None:
    state = quote(f"sqlite:///{tmp_path / 's.db'}", safe="")
    with pytest.raises(BackendUnavailableError, match="RabbitMQ"):
        open_queue_backend(f"amqp://guest:guest@127.0.0.1:1/?reconnect=0.5&state={state}")


@pytest.fixture
def private_rabbitmq() -> Iterator[PrivateServer]:
    """A private RabbitMQ node (its own name, ports and mnesia; never the shared one)."""
    with private_server("rabbitmq") as server:
        yield server


@pytest.mark.slow
def test_a_rabbitmq_restart_mid_run_loses_nothing(private_rabbitmq: PrivateServer, tmp_path: Path) -> None:
    """The whole node stops (``rabbitmqctl -n <private node> stop``) and boots again from
    the same mnesia directory: durable queues and persistent messages come back from disk.
    No sweep for jobs without a message (``orphan_after``) helps: every job must get its
    message through the restart (a consumer subscribed twice after the reconnect once
    held 128 of them unseen)."""
    state = quote(f"sqlite:///{tmp_path / 'state.db'}", safe="")
    url = f"{private_rabbitmq.url}?prefix=fqa{uuid.uuid4().hex[:10]}&state={state}&orphan_after=3600"
    run_through_restart(url, private_rabbitmq.restart)
