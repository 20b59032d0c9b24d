"""Units for the queue runtime and fault tests. Module-level functions (a worker in
another process, or an isolated child, imports them by name); :func:`make_app`
declares them on a fresh app bound to one queue URL."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from typing import Any

from foundry import Foundry

TRIES: dict[str, int] = {}
_LOCK = threading.Lock()


class Flaky(ConnectionError):
    """A transient failure worth retrying."""


def add(a: int, b: int) -> int:
    return a + b


def flaky(key: str, fails: int) -> str:
    """Fails ``fails`` times (counted per key in this process), then succeeds."""
    with _LOCK:
        TRIES[key] = TRIES.get(key, 0) + 1
        n = TRIES[key]
    if n <= fails:
        raise Flaky(f"{key}: attempt {n} of a flaky upstream")
    return f"{key} after {n}"


def picky(kind: str) -> str:
    with _LOCK:
        TRIES[kind] = TRIES.get(kind, 0) + 1
    if kind == "value":
        raise ValueError("not retried: ValueError is not in retry_on")
    raise Flaky("retried: Flaky is a ConnectionError")


def sleepy(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0.001)
    return a + b


def where(_: int = 0) -> int:
    return os.getpid()


def crash(how: str) -> str:
    if how == "kill":
        os.kill(os.getpid(), 9)
    return how


def record(i: int) -> int:
    """The fault suite's unit: count one execution in the effects database."""
    path = os.environ["FOUNDRY_TEST_EFFECTS"]
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    try:
        conn.execute("INSERT INTO runs (job, pid) VALUES (?, ?)", (i, os.getpid()))
    finally:
        conn.close()
    return i * 2


def record_slow(i: int) -> int:
    time.sleep(0.05)
    return record(i)


def make_app(queue: str | None = None, name: str = "queue-tests") -> Foundry:
    app = Foundry(name, queue=queue)
    app.work(durable=True)(add)
    app.work(durable=True, retries=3, backoff="10ms")(flaky)
    app.work(durable=True, retries=2, backoff="10ms", retry_on=(ConnectionError,))(picky)
    app.work(durable=True, timeout="300ms")(sleepy)
    app.work(durable=True)(async_add)
    app.work(durable=True, isolate=True, timeout="20s")(where)
    app.work(durable=True, isolate=True)(crash)
    app.work(durable=True, idempotent=True, name="idem_add")(add_copy)
    app.work(durable=True, max_payload="1KiB", name="small")(echo)
    app.work(durable=True, retries=5, backoff="10ms", name="record")(record)
    app.work(durable=True, name="record_slow")(record_slow)
    return app


def add_copy(a: int, b: int) -> int:
    return a + b


def echo(value: Any) -> Any:
    return value


app = make_app()  # for `foundry worker tests.deliver.queue_app:app` (queue from FOUNDRY_QUEUE)
