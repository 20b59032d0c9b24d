"""Units for the queue runtime and fault tests. Module-level functions (a worker in
another process, or an isolated child, imports them by name); :func:`make_app`
declares them on a fresh app bound to one queue URL."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from foundry import Foundry
from foundry.execute import checkpoint

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


def spin(marker: str) -> None:
    """Runs until cancelled, calling ``checkpoint()`` (a cooperative thread job); first
    writes its pid to ``marker``, so a test knows it runs (and where)."""
    Path(marker).write_text(str(os.getpid()))
    while True:
        checkpoint()
        time.sleep(0.002)


def spin_noting(marker: str) -> None:
    """Like :func:`spin`, and writes into ``marker`` the name of what stopped it."""
    Path(marker).write_text("running")
    try:
        while True:
            checkpoint()
            time.sleep(0.002)
    except BaseException as exc:
        Path(marker).write_text(type(exc).__name__)
        raise


def spin_blind(marker: str) -> None:
    """Runs for ever without a checkpoint (only a child's death stops it): ``isolate=True``."""
    Path(marker).write_text(str(os.getpid()))
    while True:
        pass


async def async_spin(marker: str) -> None:
    """Awaits until its task is cancelled; says in ``marker`` that it started, then that
    the cancellation reached it."""
    _say(marker, "started")
    try:
        await asyncio.Event().wait()  # nobody sets it: only a cancellation ends this
    except asyncio.CancelledError:
        _say(marker, "cancelled")
        raise


async def async_sleepy(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


async def async_blocking(seconds: float) -> float:
    time.sleep(seconds)  # noqa: ASYNC251 - blocks its event loop on purpose: it cannot cancel it
    return seconds


def steps(marker: str, total: int) -> int:
    """Reports ``total`` steps of progress, waiting at the middle one until ``marker``
    says "go" (a plain function, an isolated one: the same body)."""
    import foundry

    for done in range(1, total + 1):
        foundry.progress(done, total, "steps")
        if done == total // 2:
            _say(marker, "halfway")
            deadline = time.monotonic() + 20
            while Path(marker).read_text() != "go" and time.monotonic() < deadline:
                time.sleep(0.01)
    return total


def steps_then_crash(total: int) -> None:
    """Reports progress up to the middle, then dies (``isolate=True``: only its child)."""
    import foundry

    for done in range(1, total // 2 + 1):
        foundry.progress(done, total, "steps")
    time.sleep(0.3)  # working on the next step (records older than 50 ms have reached the parent)
    os._exit(3)


async def async_steps(total: int) -> int:
    import foundry

    for done in range(1, total + 1):
        foundry.progress(done, total, "awaits")
        await asyncio.sleep(0)
    return total


def _say(marker: str, text: str) -> None:
    Path(marker).write_text(text)


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
    app.work(durable=True, retries=3, backoff="10ms")(spin)
    app.work(durable=True, timeout="300ms", name="spin_timed")(spin_noting)
    app.work(durable=True, isolate=True, retries=3, backoff="10ms")(spin_blind)
    app.work(durable=True, retries=3, backoff="10ms")(async_spin)
    app.work(durable=True, timeout="200ms")(async_sleepy)
    app.work(durable=True, timeout="200ms")(async_blocking)
    app.work(durable=True)(steps)
    app.work(durable=True, isolate=True, name="steps_isolated")(steps_copy)
    app.work(durable=True, isolate=True)(steps_then_crash)
    app.work(durable=True)(async_steps)
    return app


def steps_copy(marker: str, total: int) -> int:
    return steps(marker, total)


def add_copy(a: int, b: int) -> int:
    return a + b


def echo(value: Any) -> Any:
    return value


app = make_app()  # for `foundry worker tests.deliver.queue_app:app` (queue from FOUNDRY_QUEUE)
