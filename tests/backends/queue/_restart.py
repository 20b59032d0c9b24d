"""A broker restarted under a running worker: the engine-specific restart tests of Redis
and RabbitMQ share this. The worker runs in this process (threads) with the real
``Worker``; the restart is a real server process going down and a new one coming back
on the same port and data directory — a private instance (``tests.private_servers``),
never the machine's shared server."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

from foundry.backends.queue import JobStatus, open_queue_backend
from foundry.deliver.worker import JobEvent, Worker
from tests.deliver.queue_app import make_app


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def run_through_restart(url: str, restart: Callable[[], object], after: int = 50, cap: int = 3000) -> None:
    """Submit jobs steadily while a worker runs them, restart the server mid-run, and go
    on submitting until ``after`` more jobs went in after the restart; then every job —
    before, during and after — completed once, with its result. The jobs submitted after
    the restart can only be done by a worker and a submitter that reconnected: their old
    connections died with the server process."""
    app = make_app(url, name="restart")
    add = app.units["add"]
    events: list[JobEvent] = []
    lock = threading.Lock()

    def on_event(event: JobEvent) -> None:
        with lock:
            events.append(event)

    def succeeded() -> int:
        with lock:
            return sum(1 for e in events if e.kind == "succeeded")

    worker = Worker(app, concurrency=4, prefetch=8, lease=3.0, poll=0.2, grace=5.0, on_event=on_event)
    handles: list[Any] = []
    failures: list[BaseException] = []
    restarted = threading.Event()
    at_restart: list[int] = []  # jobs submitted when the restart was over

    def produce() -> None:
        try:
            while len(handles) < cap and not (at_restart and len(handles) >= at_restart[0] + after):
                i = len(handles)
                handles.append(add.submit(i, i))  # blocks (bounded) while the server is down
                if restarted.is_set() and not at_restart:
                    at_restart.append(len(handles))
                time.sleep(0.01)
        except BaseException as exc:
            failures.append(exc)

    worker.start()
    producer = threading.Thread(target=produce)
    producer.start()
    try:
        wait_for(lambda: succeeded() >= 30, 60, "the first completions")
        # When the server restarts while jobs are being submitted and run
        restart()
        restarted.set()
        producer.join(120)
        # Then every job, before, during and after, completes once
        assert not failures, failures
        assert at_restart, f"the producer stopped at {cap} jobs before the restart was over"
        results = [h.result(timeout=90) for h in handles]
    finally:
        restarted.set()
        producer.join(120)
        worker.stop()
    backend = open_queue_backend(url)
    try:
        states = [backend.get(h.id) for h in handles]
        destroy = getattr(backend, "destroy", None)
        if callable(destroy):
            destroy()
    finally:
        backend.close()
        app.close()
    assert results == [2 * i for i in range(len(handles))]
    assert all(s is not None and s.status is JobStatus.SUCCEEDED for s in states)
    written = collections.Counter(e.job_id for e in events if e.kind == "succeeded")
    assert set(written) <= {h.id for h in handles}
    assert max(written.values()) == 1, "a job's completion was recorded twice"
    assert len(handles) >= at_restart[0] + after, "too few jobs submitted after the restart"
