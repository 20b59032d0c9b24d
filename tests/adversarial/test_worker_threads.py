"""A worker never lives on as a zombie (issue 12, item 5): when its claimer,
acknowledger or heartbeat thread fails, or its backend's own background task dies
(the RabbitMQ publisher), the whole worker stops and ``run()`` raises
:class:`WorkerFailedError` saying which thread and why (``foundry worker`` exits 1).
Before, the thread died alone and the worker looked healthy while doing nothing.

And a suspect runs alone: a job whose previous delivery ended with its worker's death
never runs beside another job, and the store records that it ran alone."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from foundry.backends.queue import JobStatus, open_queue_backend
from foundry.deliver.worker import JobEvent, Worker
from foundry.errors import BackendError
from tests.adversarial import _queue_app
from tests.adversarial._queue_helpers import private_url
from tests.adversarial._running import run_until_it_fails
from tests.backends.queue.engines import close


@pytest.fixture
def make_worker(tmp_path: Path) -> Iterator[Callable[..., tuple[Any, Worker]]]:
    made: list[tuple[Any, Worker, str]] = []

    def make(engine: str = "sqlite", **options: Any) -> tuple[Any, Worker]:
        url = private_url(engine, tmp_path)
        app = _queue_app.make_app(url, name=f"threads-{uuid.uuid4().hex[:6]}")
        settings: dict[str, Any] = {"concurrency": 2, "lease": 5.0, "poll": 0.2, "grace": 2.0}
        settings.update(options)
        worker = Worker(app, **settings)
        made.append((app, worker, url))
        return app, worker

    try:
        yield make
    finally:
        for app, worker, url in made:
            worker.stop(0.5)
            app.close()
            close(open_queue_backend(url), url)


def test_a_claimer_that_fails_stops_the_worker(make_worker: Callable[..., tuple[Any, Worker]]) -> None:
    _, worker = make_worker()
    real = worker.backend.claim
    calls = {"n": 0}

    def claim(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("a bug in the claim path")
        return real(*args, **kwargs)

    worker.backend.claim = claim  # type: ignore[method-assign]
    error = run_until_it_fails(worker)
    assert "claimer" in str(error)
    assert "RuntimeError: a bug in the claim path" in str(error)
    assert worker.failure is error


def test_an_acknowledger_that_fails_stops_the_worker(make_worker: Callable[..., tuple[Any, Worker]]) -> None:
    app, worker = make_worker()

    def complete_many(items: Any) -> Any:
        raise TypeError("a bug in the ack path")

    worker.backend.complete_many = complete_many  # type: ignore[attr-defined]
    handle = app.units["healthy"].submit(1)
    error = run_until_it_fails(worker)
    assert "acknowledger" in str(error)
    assert "TypeError: a bug in the ack path" in str(error)
    # The job's completion was never written: it is not lost, it is delivered again
    assert handle.status.value in ("queued", "running")


def test_a_heartbeat_that_fails_stops_the_worker(make_worker: Callable[..., tuple[Any, Worker]]) -> None:
    app, worker = make_worker(lease=0.3)

    def heartbeat(*args: Any, **kwargs: Any) -> bool:
        raise ValueError("a bug in the heartbeat")

    worker.backend.heartbeat = heartbeat  # type: ignore[method-assign]
    app.units["sleeper"].submit(2.0)
    error = run_until_it_fails(worker)
    assert "heartbeat" in str(error)
    assert "ValueError: a bug in the heartbeat" in str(error)


def test_a_cancel_watcher_that_fails_stops_the_worker(make_worker: Callable[..., tuple[Any, Worker]]) -> None:
    app, worker = make_worker()

    def cancel_requests(*args: Any, **kwargs: Any) -> list[str]:
        raise KeyError("a bug in the cancel watcher")

    worker.backend.cancel_requests = cancel_requests  # type: ignore[method-assign]
    app.units["sleeper"].submit(2.0)
    error = run_until_it_fails(worker)
    assert "cancel watcher" in str(error)
    assert "a bug in the cancel watcher" in str(error)


def test_a_dead_rabbitmq_publisher_stops_the_worker(
    make_worker: Callable[..., tuple[Any, Worker]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from foundry.backends.queue import _amqp_client

    _, worker = make_worker("amqp")
    # Given a worker whose RabbitMQ publisher task dies on its next batch
    original = _amqp_client._pack

    def pack(items: Any) -> Any:
        if any(b"poison-the-pump" in body for _, body, _, _ in items):
            raise RuntimeError("a bug in the publisher")
        return original(items)

    monkeypatch.setattr(_amqp_client, "_pack", pack)
    worker.start()
    client = worker.backend.client  # type: ignore[attr-defined]
    client.publish("foundry-test-nowhere", b"poison-the-pump 0 -", 0)
    # Then the worker stops by itself, saying why, and publishing is refused, not swallowed
    error = run_until_it_fails(worker)
    assert "publisher" in str(error) or "pump" in str(error)
    assert "RuntimeError: a bug in the publisher" in str(error)
    with pytest.raises(BackendError, match="pump task failed"):
        client.publish("foundry-test-nowhere", b"a-job 0 -", 0)


def test_a_suspect_runs_alone_and_is_marked_so(make_worker: Callable[..., tuple[Any, Worker]]) -> None:
    # Given a job whose worker died while holding it (its lease lapsed), and ordinary jobs
    events: list[JobEvent] = []
    app, worker = make_worker(concurrency=4, on_event=events.append)
    backend = worker.backend
    suspect = app.units["sleeper"].submit(0.3)
    [held] = backend.claim("default", "a-worker-that-dies", lease=0.2, limit=1, timeout=5)
    assert held.id == suspect.id
    ordinary = [app.units["sleeper"].submit(0.1) for _ in range(12)]
    time.sleep(0.3)  # its lease lapses
    # When a worker with 4 runners takes them all
    worker.start()
    assert suspect.result(timeout=60) == 0.3
    assert [h.result(timeout=60) for h in ordinary] == [0.1] * 12
    # Then the suspect ran with nothing else running in that worker
    spans: dict[str, list[float]] = {}
    for e in events:
        if e.kind in ("started", "succeeded"):
            spans.setdefault(e.job_id, []).append(e.at)
    alone = spans[suspect.id]
    assert len(alone) == 2
    for job_id, (start, end) in ((j, s) for j, s in spans.items() if j != suspect.id and len(s) == 2):
        assert end <= alone[0] or start >= alone[1], f"{job_id} ran beside the suspect"
    assert [e.kind for e in events if e.job_id == suspect.id] == ["alone", "started", "succeeded"]
    state = backend.get(suspect.id)
    assert state is not None
    assert state.status is JobStatus.SUCCEEDED


def test_a_suspect_does_not_wait_for_ever_behind_a_job_that_hangs(
    make_worker: Callable[..., tuple[Any, Worker]], tmp_path: Path
) -> None:
    # Given a worker running a job that takes far longer than the worker's patience (10 s)
    events: list[JobEvent] = []
    app, worker = make_worker(concurrency=2, lease=1.0, on_event=events.append)
    backend = worker.backend
    suspect = app.units["sleeper"].submit(0.1)
    [held] = backend.claim("default", "a-worker-that-dies", lease=60.0, limit=1, timeout=5)
    assert held.id == suspect.id
    marker = tmp_path / "hung-started"
    hung = app.units["sleeper"].submit(25.0, str(marker))
    worker.start()
    deadline = time.monotonic() + 30
    while not marker.exists():
        assert time.monotonic() < deadline, "the long job never started"
        time.sleep(0.05)
    # When the suspect's lease lapses now (its worker died) and this worker takes it
    assert backend.heartbeat(held.id, held.token, lease=0.01)
    # Then after its patience it runs beside the long job rather than wait for it
    assert suspect.result(timeout=30) == 0.1
    assert hung.status.value == "running"
    assert "alone" not in [e.kind for e in events if e.job_id == suspect.id]
