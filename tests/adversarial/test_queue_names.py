"""Queue names every engine can carry (issue 12, item 6): one rule — AMQP's queue-name
characters (letters, digits, ``- _ . :``), at most 100 — checked where a name first
appears (``@app.work(queue=...)``, ``Worker(queues=...)``, ``foundry worker --queue``,
and each engine's ``enqueue``/``claim``), with a clear error. Before, RabbitMQ accepted
such a job at submit and its publisher then retried the declaration for ever, holding
back other queues' jobs of the same batch: now a queue RabbitMQ refuses holds back only
its own messages."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from pathlib import Path

import aiormq
import pytest

from foundry import Foundry
from foundry.backends.queue import NewJob, open_queue_backend
from foundry.backends.queue._amqp_client import AmqpClient
from foundry.deliver.worker import Worker
from foundry.errors import DeclarationError, SubmitError
from tests.adversarial._queue_helpers import ROOT, queue_url
from tests.services import URLS, require

__all__ = ["queue_url"]

BAD = ["with space", "é-accent", "slash/ed", "new\nline", "", "x" * 101, "nul\0"]
GOOD = ["emails", "emails.high", "v2:resize-images_x", "x" * 100]


@pytest.mark.parametrize("name", BAD)
def test_a_bad_queue_name_is_a_declaration_error(name: str) -> None:
    app = Foundry(f"names-{uuid.uuid4().hex[:6]}", queue="memory://")
    try:
        with pytest.raises(DeclarationError, match="queue=") as info:
            app.work(durable=True, queue=name)(lambda: None)
        assert "A-Z, a-z, 0-9 and - _ . :" in str(info.value)
        assert "Fix:" in str(info.value)
    finally:
        app.close()


@pytest.mark.parametrize("name", GOOD)
def test_good_queue_names_are_accepted(name: str) -> None:
    app = Foundry(f"names-{uuid.uuid4().hex[:6]}", queue="memory://")
    try:
        app.work(durable=True, queue=name)(lambda: None)
    finally:
        app.close()


def test_every_engine_refuses_a_bad_queue_name_and_stores_nothing(queue_url: str) -> None:
    backend = open_queue_backend(queue_url)
    try:
        for name in BAD:
            job = NewJob(id=uuid.uuid4().hex, queue=name, unit="u", payload=b"{}")
            with pytest.raises(SubmitError, match="queue="):
                backend.enqueue(job)
            with pytest.raises(SubmitError, match="queue="):
                backend.enqueue_many([job])
            assert backend.get(job.id) is None
            with pytest.raises(SubmitError, match="queue="):
                backend.claim(name, "w", lease=5, limit=1, timeout=0)
    finally:
        backend.close()


def test_a_worker_refuses_a_bad_queue_name() -> None:
    app = Foundry(f"names-{uuid.uuid4().hex[:6]}", queue="memory://")
    try:
        with pytest.raises(SubmitError, match="with space"):
            Worker(app, queues=["with space"])
    finally:
        app.close()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "foundry.cli",
            "worker",
            "tests.adversarial._queue_app:app",
            "--queue",
            "a b=2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "--queue 'a b=2'" in done.stderr
    assert "Fix:" in done.stderr


def test_a_queue_rabbitmq_refuses_holds_back_only_its_own_messages(tmp_path: Path) -> None:
    require("rabbitmq")
    tag = uuid.uuid4().hex[:10]
    good = f"fqt{tag}.good"
    refused = f"amq.fqt{tag}"  # RabbitMQ reserves amq.*: its declaration is refused for ever
    client = AmqpClient(URLS["rabbitmq"], shown="amqp://guest:***@127.0.0.1:5672/", reconnect=5, linger=1)
    try:
        # When one batch carries messages for both queues
        client.publish(refused, b"job-a 0 -", 0)
        client.publish(good, b"job-b 0 -", 0)
        client.publish(refused, b"job-c 0 -", 0)
        # Then the good queue's message is delivered, though the other queue is refused
        deadline = time.monotonic() + 20
        while client.message_count(good) < 1:
            assert time.monotonic() < deadline, "a refused queue held back another queue's message"
            time.sleep(0.1)
    finally:
        client.close(flush=0.5)
        asyncio.run(_delete(good))


async def _delete(queue: str) -> None:
    conn = await aiormq.connect(URLS["rabbitmq"])
    try:
        ch = await conn.channel()
        await ch.queue_delete(queue)
    finally:
        await conn.close()
