"""A broker restarted under a running worker: the engine-specific restart tests of Redis
and RabbitMQ share this. The worker runs in this process (threads) with the real
``Worker``; the restart is the real server going down and coming back."""

from __future__ import annotations

import collections
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from foundry.backends.queue import JobStatus, open_queue_backend
from foundry.deliver.worker import JobEvent, Worker
from tests.deliver.queue_app import make_app
from tests.services import reachable


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def restart_server(stop: str, start: str, service: str, ready: Callable[[], bool], *fallbacks: str) -> None:
    """Stop the shared server and ALWAYS bring it back (other tests use it too): the
    start command is retried, then each fallback, until the server answers again."""
    try:
        subprocess.run(stop, shell=True, check=False, timeout=120, capture_output=True)
        wait_for(lambda: not reachable(service, 0.2), 30, f"{service} to stop")
    finally:
        deadline = time.monotonic() + 180
        commands = [start, start, *fallbacks, start]
        attempt = 0
        while True:
            command = commands[min(attempt, len(commands) - 1)]
            subprocess.run(command, shell=True, check=False, timeout=120, capture_output=True)
            attempt += 1
            try:
                wait_for(lambda: reachable(service, 0.5) and ready(), 30, f"{service} to come back")
                break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise


def run_through_restart(url: str, restart: Callable[[], None], jobs: int = 200) -> None:
    """Submit ``jobs`` steadily while a worker runs them, restart the server mid-run;
    then every job completed once, with its result."""
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

    def produce() -> None:
        try:
            for i in range(jobs):
                handles.append(add.submit(i, i))  # blocks (bounded) while the server is down
                time.sleep(0.005)
        except BaseException as exc:
            failures.append(exc)

    worker.start()
    producer = threading.Thread(target=produce)
    producer.start()
    try:
        wait_for(lambda: succeeded() >= 30, 60, "the first completions")
        # When the server restarts while jobs are being submitted and run
        restart()
        producer.join(120)
        # Then every job, before, during and after, completes once
        assert not failures, failures
        assert len(handles) == jobs
        results = [h.result(timeout=90) for h in handles]
    finally:
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
    assert results == [2 * i for i in range(jobs)]
    assert all(s is not None and s.status is JobStatus.SUCCEEDED for s in states)
    written = collections.Counter(e.job_id for e in events if e.kind == "succeeded")
    assert set(written) <= {h.id for h in handles}
    assert max(written.values()) == 1, "a job's completion was recorded twice"
