"""A job that segfaults its worker every time, among healthy jobs, on every engine:
only the poison job is dead-lettered; every healthy job that shared the worker with it
completes (issue 12, item 4)."""

from __future__ import annotations

import subprocess
import time
import uuid

from foundry.backends.queue import JobStatus, open_queue_backend
from tests.adversarial import _queue_app
from tests.adversarial._queue_helpers import queue_url, start_worker

__all__ = ["queue_url"]

HEALTHY = 20


def test_a_poison_job_is_dead_lettered_alone(queue_url: str) -> None:
    if queue_url.startswith("amqp"):
        # No sweep for jobs that lost their message: a worker about to run the poison job
        # alone gives back what it holds, and those messages must reach the broker before
        # the poison job kills it — never be left to the sweep 30 s later.
        queue_url += "&orphan_after=3600"
    # Given 20 healthy jobs and one that segfaults whichever worker runs it, in one queue
    app = _queue_app.make_app(queue_url, name=f"poison-{uuid.uuid4().hex[:6]}")
    try:
        healthy = app.units["healthy"]
        handles = [healthy.submit(i) for i in range(3)]
        bad = app.units["poison"].submit()
        handles += [healthy.submit(i) for i in range(3, HEALTHY)]
        # When workers (4 threads, prefetch 8, 1 s leases) run them, each restarted when it dies
        deaths = 0
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            proc = start_worker(
                queue_url, "-c", "4", "--lease", "1s", "--burst", "-q", stderr=subprocess.DEVNULL
            )
            try:
                code = proc.wait(60)
            finally:
                if proc.poll() is None:  # a failing run leaves no worker behind
                    proc.kill()
                    proc.wait(10)
            if code == 0:
                break
            deaths += 1
        else:
            raise AssertionError("the queue never drained")
        # Then the poison job is dead-lettered, with the reason ...
        backend = open_queue_backend(queue_url)
        try:
            poisoned = backend.get(bad.id)
            states = [backend.get(h.id) for h in handles]
        finally:
            backend.close()
        assert poisoned is not None
        assert poisoned.status is JobStatus.DEAD, poisoned
        assert "killing or hanging its worker" in (poisoned.dead_reason or "")
        assert deaths == 6, f"{deaths} worker deaths: one beside others, then five alone"
        # ... and every healthy job completed, none dead-lettered beside it
        unfinished = [s for s in states if s is None or s.status is not JobStatus.SUCCEEDED]
        assert not unfinished, f"{len(unfinished)} healthy jobs did not complete: {unfinished}"
        assert [h.result(timeout=10) for h in handles] == [2 * i for i in range(HEALTHY)]
    finally:
        app.close()
