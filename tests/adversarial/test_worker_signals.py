"""A second SIGTERM (or Ctrl-C) skips the grace period (issue 12, item 12): the worker
releases what still runs for immediate redelivery, as a hard stop does, and exits at
once — not when the grace the first signal started runs out. ``Worker.hurry()`` is the
same for a worker run in-process."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

from foundry.backends.queue import JobStatus, open_queue_backend
from foundry.deliver.worker import Worker
from tests.adversarial import _queue_app
from tests.adversarial._queue_helpers import private_url, start_worker, stored
from tests.backends.queue.engines import close


def wait_started(marker: Path, timeout: float = 60.0) -> None:
    """Until the unit created ``marker``: it runs (not merely claimed)."""
    deadline = time.monotonic() + timeout
    while not marker.exists():
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.05)


def test_a_second_sigterm_stops_foundry_worker_at_once(tmp_path: Path) -> None:
    url = private_url("sqlite", tmp_path)
    app = _queue_app.make_app(url, name=f"signals-{uuid.uuid4().hex[:6]}")
    try:
        # Given a worker with a minute of grace, running a job that needs 30 s
        marker = tmp_path / "started"
        handle = app.units["sleeper"].submit(30.0, str(marker))
        proc = start_worker(url, "-c", "1", "--grace", "60s", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_started(marker)
        # When it gets SIGTERM: it waits for the job (the grace period) ...
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert proc.poll() is None, "the first SIGTERM must let the running job finish"
        # ... and a second SIGTERM: it gives the job back and exits now
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise AssertionError("a second SIGTERM did not skip the grace period") from None
        assert proc.returncode == 0, err
        assert "released 1" in out
        # Then the job is back in the queue for the next worker, its delivery not counted
        state = stored(url, handle.id)
        assert (state.status, state.deliveries) == (JobStatus.QUEUED, 0)
        assert handle.cancel()
    finally:
        app.close()
        close(open_queue_backend(url), url)


def test_hurry_ends_the_grace_of_a_stop_in_progress(tmp_path: Path) -> None:
    url = private_url("sqlite", tmp_path)
    app = _queue_app.make_app(url, name=f"hurry-{uuid.uuid4().hex[:6]}")
    worker = Worker(app, concurrency=1, grace=60.0, poll=0.2)
    try:
        marker = tmp_path / "started"
        handle = app.units["sleeper"].submit(30.0, str(marker))
        worker.start()
        wait_started(marker)
        stopping = threading.Thread(target=worker.stop, daemon=True)
        stopping.start()
        stopping.join(1.0)
        assert stopping.is_alive(), "stop() must give the running job its grace"
        worker.hurry()
        stopping.join(15)
        assert not stopping.is_alive(), "hurry() did not end the grace"
        assert stored(url, handle.id).status is JobStatus.QUEUED
        worker.stop()  # a second stop() after the first finished returns at once
    finally:
        worker.stop(0)
        app.close()
        close(open_queue_backend(url), url)
