"""Importable functions for the execution-model tests (child processes import them by
name, so they live in a module, not in the test files' closures)."""

from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Any


class Boom(Exception):
    """The workload's own exception type: it must come back as itself."""


def square(x: int) -> int:
    return x * x


def fail_on(x: int, bad: int = 3) -> int:
    if x == bad:
        raise Boom(f"bad item {x}")
    return x


def sleep_then(seconds: float, value: Any = None) -> Any:
    time.sleep(seconds)
    return value


def wait_for(event: threading.Event, value: Any = None) -> Any:
    if not event.wait(10):
        raise TimeoutError("the test never released the event")
    return value


def pid(_: Any = None) -> int:
    return os.getpid()


def segfault(_: Any = None) -> None:
    ctypes.string_at(0)


def crash_or_pid(x: Any) -> int:
    if x == "segv":
        ctypes.string_at(0)
    if x == "sleep":
        time.sleep(30)
    return os.getpid()


def unpicklable_result(_: Any = None) -> Any:
    return threading.Lock()


async def async_square(x: int) -> int:
    import asyncio

    await asyncio.sleep(0)
    return x * x


async def async_fail_on(x: int, bad: int = 3) -> int:
    import asyncio

    await asyncio.sleep(0)
    if x == bad:
        raise Boom(f"bad item {x}")
    return x


async def async_sleep_then(seconds: float, value: Any = None) -> Any:
    import asyncio

    await asyncio.sleep(seconds)
    return value


def append_line(path: str, line: str) -> str:
    time.sleep(0.05)
    with open(path, "a") as out:
        out.write(line + "\n")
    return line


def ignore_sigterm_and_sleep(seconds: float) -> None:
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(seconds)


def keyed_step(item: dict[str, Any]) -> tuple[str, int, float, float]:
    """One unit of a keyed stream: sleep ``item["sleep"]`` and say when it ran, on the
    system-wide monotonic clock (child processes share it). ``fail`` raises instead."""
    start = time.monotonic()
    time.sleep(item.get("sleep", 0.01))
    if item.get("fail"):
        raise Boom(f"item {item['k']}{item['seq']} failed")
    return (item["k"], item["seq"], start, time.monotonic())


async def async_keyed_step(item: dict[str, Any]) -> tuple[str, int, float, float]:
    """:func:`keyed_step` for the event loop: awaits instead of sleeping a thread."""
    import asyncio

    start = time.monotonic()
    await asyncio.sleep(item.get("sleep", 0.01))
    if item.get("fail"):
        raise Boom(f"item {item['k']}{item['seq']} failed")
    return (item["k"], item["seq"], start, time.monotonic())


def wait_tagged(event: threading.Event, value: Any = None, tag: str = "") -> Any:
    """:func:`wait_for` with a ``tag`` argument to key it by."""
    return wait_for(event, value)


def spin_sign(body: str, seconds: float) -> str:
    """A pure-Python CPU step standing in for a signature: it computes (holding the GIL)
    for ``seconds`` of wall time, then returns a digest of ``body``. Bounded by the clock,
    not by a count, so the step lasts as long on a busy machine as on a quiet one."""
    import hashlib

    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x = (x * 31 + 7) % 1_000_003
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def log_and_wait_for(n: int, log: str, gate: str) -> tuple[int, int]:
    """Write ``"n pid"`` to ``log`` (one whole line per call, whichever child), then wait
    (10 s at most) until the file ``gate`` exists; returns ``(n, pid)``."""
    with open(log, "a") as out:
        out.write(f"{n} {os.getpid()}\n")
    deadline = time.monotonic() + 10
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError("the test never opened the gate")
        time.sleep(0.005)
    return n, os.getpid()
