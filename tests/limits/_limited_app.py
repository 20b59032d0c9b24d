"""Limited units for the limits tests, and a worker process that serves them:
``python -m tests.limits._limited_app URL EFFECTS LEASE``. Every run writes its start and
end (wall clock) into the EFFECTS SQLite file, shared by every worker process, so a test
can replay what ran at once and how fast."""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

from foundry import Foundry

RATE = "10/s"  # the bucket of `rated`: 10 tokens, refilled at 10 per second
CAP = 2  # max_concurrency of `capped`
RATE_PER = "5/s"  # the bucket of `rated_per`, one per customer


def _note(unit: str, i: int, key: str, start: float) -> None:
    conn = sqlite3.connect(os.environ["FOUNDRY_TEST_EFFECTS"], timeout=60, isolation_level=None)
    try:
        conn.execute(
            "INSERT INTO runs (unit, i, key, start, end, pid) VALUES (?, ?, ?, ?, ?, ?)",
            (unit, i, key, start, time.time(), os.getpid()),
        )
    finally:
        conn.close()


def capped(i: int) -> int:
    start = time.time()
    time.sleep(0.08)
    _note("capped", i, "", start)
    return i


def per_customer(customer_id: str, i: int) -> int:
    start = time.time()
    time.sleep(0.06)
    _note("per_customer", i, customer_id, start)
    return i


def rated(i: int) -> int:
    _note("rated", i, "", time.time())
    return i


def rated_per(customer_id: str, i: int) -> int:
    _note("rated_per", i, customer_id, time.time())
    return i


def free(i: int) -> int:
    _note("free", i, "", time.time())
    return i


def hog(i: int, marker: str) -> int:
    """Holds its slot until killed on the first delivery of job 0; quick otherwise."""
    start = time.time()
    if i == 0 and not Path(marker).exists():
        Path(marker).write_text(str(os.getpid()))
        time.sleep(120)
    _note("hog", i, "", start)
    return i


def make_app(url: str) -> Foundry:
    app = Foundry("limits-tests", queue=url)
    app.work(durable=True, max_concurrency=CAP)(capped)
    app.work(durable=True, max_concurrency=1, per="customer_id")(per_customer)
    app.work(durable=True, rate_limit=RATE)(rated)
    app.work(durable=True, rate_limit=RATE_PER, per="customer_id")(rated_per)
    app.work(durable=True)(free)
    app.work(durable=True, max_concurrency=1)(hog)
    return app


def create_effects(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE runs (unit TEXT, i INTEGER, key TEXT, start REAL, end REAL, pid INTEGER)")
    conn.close()


def main() -> None:
    url, effects, lease = sys.argv[1], sys.argv[2], float(sys.argv[3])
    os.environ["FOUNDRY_TEST_EFFECTS"] = effects
    from foundry.deliver.worker import Worker

    app = make_app(url)
    stop = threading.Event()

    def on_term(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    worker = Worker(app, concurrency=4, prefetch=8, lease=lease, grace=10.0, poll=0.2)
    worker.start()
    print("ready", flush=True)
    try:
        worker.run(until=stop)
    finally:
        worker.stop()
        app.close()


if __name__ == "__main__":
    main()
