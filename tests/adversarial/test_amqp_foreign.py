"""Messages on Foundry's RabbitMQ queues that Foundry did not write (issue 12, item 6):
a non-UTF-8 body, lines not in Foundry's format, a body far too long. Each is set aside
in ``<prefix>.<queue>.rejected`` with the reason in its ``x-foundry-reason`` header and
acknowledged, so it frees its prefetch slot: a worker running one job at a time goes on
with the real jobs behind them. Before, each pinned a prefetch slot for ever and five of
them stopped such a worker completely."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from pathlib import Path
from typing import Any

import aiormq
from pamqp import commands as spec

from foundry.backends.queue import open_queue_backend
from foundry.backends.queue.amqp import AmqpQueue
from tests.adversarial import _queue_app
from tests.adversarial._queue_helpers import private_url, start_worker
from tests.backends.queue.engines import close
from tests.services import URLS

GARBAGE = [
    b"\xff\xfe\x00 not utf-8",
    b"hello world",  # a line not in Foundry's format
    b"job-1 high -",  # a priority that is not a number
    b"job-2 0 tomorrow",  # an eta that is not a time
    "\n".join(f"job-{i} 0 -" for i in range(40)).encode(),  # more jobs than Foundry packs
    b"x" * 100_000,
]


async def _publish(queue: str, bodies: list[bytes]) -> None:
    conn = await aiormq.connect(URLS["rabbitmq"])
    try:
        ch = await conn.channel()
        for body in bodies:
            await ch.basic_publish(body, routing_key=queue, properties=spec.Basic.Properties(delivery_mode=2))
    finally:
        await conn.close()


async def _drain(queue: str) -> list[tuple[bytes, dict[str, Any]]]:
    conn = await aiormq.connect(URLS["rabbitmq"])
    out: list[tuple[bytes, dict[str, Any]]] = []
    try:
        ch = await conn.channel()
        while True:
            msg = await ch.basic_get(queue, no_ack=True)
            if msg.delivery_tag is None:
                return out
            out.append((bytes(msg.body), dict(msg.header.properties.headers or {})))
    finally:
        await conn.close()


def test_foreign_messages_are_set_aside_with_a_reason_and_the_real_jobs_run(tmp_path: Path) -> None:
    url = private_url("amqp", tmp_path)
    app = _queue_app.make_app(url, name=f"foreign-{uuid.uuid4().hex[:6]}")
    backend = open_queue_backend(url)
    assert isinstance(backend, AmqpQueue)
    try:
        # Given garbage published straight to the queue a worker of one job at a time serves
        main = backend._main("default")
        assert backend.client.message_count(main) == 0  # declared as Foundry declares it
        asyncio.run(_publish(main, GARBAGE))
        # And real jobs behind it
        handles = [app.units["healthy"].submit(i) for i in range(3)]
        # When the worker drains the queue
        proc = start_worker(url, "-c", "1", "--prefetch", "1", "--burst", "-q", stderr=subprocess.PIPE)
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            raise AssertionError(f"foreign messages stopped the worker: {err[-2000:]}") from None
        # Then the real jobs ran
        assert proc.returncode == 0, err
        assert [h.result(timeout=10) for h in handles] == [0, 2, 4]
        # And every foreign message waits in <queue>.rejected, unchanged, with its reason
        rejected = asyncio.run(_drain(f"{main}.rejected"))
        assert sorted(body for body, _ in rejected) == sorted(GARBAGE)
        for _, headers in rejected:
            reason = headers["x-foundry-reason"]
            reason = reason.decode() if isinstance(reason, bytes) else reason
            assert "malformed record" in reason, reason
            assert "Fix:" in reason
        assert backend.client.message_count(main) == 0
    finally:
        app.close()
        with_rejected = [f"{backend.prefix}.default.rejected"]
        backend.client.delete(with_rejected)
        close(backend, url)
