"""What the worker hosts of the multi-host tests run. Every execution is recorded as one
line ``<what> <host> <pid>`` appended (O_APPEND: one whole line per write, whichever
process) to ``MH_RUNS`` — the namespaces share this machine's filesystem, so the test
counts every run on every host in one file.

``make_app(queue=…, journal=…)`` declares the units on a fresh app (the test's side);
the module-level ``app`` is the workers' (URLs from ``--url`` / ``--journal``).
"""

from __future__ import annotations

import os
import time
from typing import Any

from foundry import Foundry

HOST = os.environ.get("MH_HOST", "test")
WORK_SECONDS = 0.05
PARTITIONS = 2  # the stream test's (tests/multihost/_stream_app.py)
BATCH = 5


def record(what: str) -> None:
    fd = os.open(os.environ["MH_RUNS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{what} {HOST} {os.getpid()} {time.time():.3f}\n".encode())
    finally:
        os.close(fd)


def wait_for_gate() -> None:
    """Wait for the test to open the gate (the file ``MH_GATE`` exists; at most 60 s)."""
    gate = os.environ["MH_GATE"]
    deadline = time.monotonic() + 60.0
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)


def job(i: int, gated: bool = False) -> str:
    """A queued job: recorded when it starts, then ~50 ms of work. A gated one then waits
    for the gate, so the test knows a host holds it, unfinished, when it cuts that host off."""
    record(f"job{i}")
    time.sleep(WORK_SECONDS)
    if gated:
        wait_for_gate()
    return HOST


def leg(n: int, part: str, gated: bool = False) -> str:
    record(f"trip{n}-{part}")
    time.sleep(WORK_SECONDS)
    if gated:
        wait_for_gate()
    return HOST


def trip(wf: Any, n: int, gated: bool = False) -> list[str]:
    """A workflow of two plain steps, each recorded when it runs; a gated trip's first
    step waits for the gate (the host running it holds the run, mid-step)."""
    out = wf.step(leg, n, "out", gated)
    back = wf.step(leg, n, "back")
    return [out, back]


def make_app(queue: str | None = None, journal: str | None = None) -> Foundry:
    app = Foundry("multihost", queue=queue, journal=journal)
    app.work(durable=True, name="job")(job)
    app.workflow(name="trip")(trip)
    return app


app = make_app()
