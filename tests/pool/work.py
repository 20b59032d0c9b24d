"""Units the pool tests run; workers import this module by name (``tests.pool.work``)."""

from __future__ import annotations

import os
import time

from foundry import Foundry

app = Foundry("pooltest")


def record(path: str, key: str) -> None:
    """Append ``key pid`` to ``path`` with O_APPEND: one line per run, whoever runs it."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{key} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


def square(x: int) -> int:
    return x * x


def run_and_record(path: str, key: str, seconds: float) -> int:
    record(path, key)
    time.sleep(seconds)
    return os.getpid()


def fail(message: str) -> None:
    raise ValueError(message)


def nap(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def spin(seconds: float) -> int:
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n


def pid() -> int:
    return os.getpid()


def host_and_record(path: str, key: str, seconds: float) -> str:
    """Like :func:`run_and_record`, answering the network host it ran on (``FOUNDRY_TEST_HOST``)."""
    record(path, key)
    time.sleep(seconds)
    return os.environ.get("FOUNDRY_TEST_HOST", "?")


def compute_then_wait(cpu: float, wait: float) -> int:
    """``cpu`` seconds of pure-Python CPU (this process's CPU time, so it stretches when
    the cores are shared), then ``wait`` seconds blocked, as on a downstream call."""
    end = time.process_time() + cpu
    n = 0
    while time.process_time() < end:
        n += 1
    time.sleep(wait)
    return n
