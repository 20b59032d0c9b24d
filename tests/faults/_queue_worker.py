"""A queue worker process for the fault suite: ``python -m tests.faults._queue_worker
URL EFFECTS LEASE``. It runs the units of ``tests.deliver.queue_app`` and writes one row
per *completion record it wrote* (``complete()`` answered True) into EFFECTS, so the
suite can count completion records across every process. SIGTERM stops it gracefully."""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
import threading
from typing import Any


def main() -> None:
    url, effects, lease = sys.argv[1], sys.argv[2], float(sys.argv[3])
    os.environ["FOUNDRY_TEST_EFFECTS"] = effects
    from foundry.deliver.worker import JobEvent, Worker
    from tests.deliver.queue_app import make_app

    app = make_app(url, name="fault-worker")
    conn = sqlite3.connect(effects, check_same_thread=False, isolation_level=None, timeout=60)
    lock = threading.Lock()

    def on_event(event: JobEvent) -> None:
        if event.kind == "succeeded":
            with lock:
                conn.execute("INSERT INTO completions (job, pid) VALUES (?, ?)", (event.job_id, os.getpid()))

    stop = threading.Event()

    def on_term(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    worker = Worker(
        app, concurrency=4, prefetch=8, lease=lease, grace=20.0, backoff=0.01, poll=0.2, on_event=on_event
    )
    print("ready", flush=True)
    try:
        worker.run(until=stop)
    finally:
        worker.stop()
        app.close()
        conn.close()


if __name__ == "__main__":
    main()
