"""The SQLite journal wakes waiters in other processes (the doorbell): a worker with a
long poll picks up a workflow enqueued elsewhere at once, a signal sent from another
process resumes a parked workflow at once, and a caller waiting for a result sees
another process's finish at once. Without the doorbell the polls still get there.

Every poll here is 5 s and every wait has a 30 s timeout: an outcome within 2 s was
woken, not polled for.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import foundry.deliver.workflow.runtime as workflow_runtime
from foundry import Foundry
from foundry.backends import _doorbell
from foundry.backends.journal import WorkflowStatus
from foundry.deliver.workflow import Worker, WorkflowRuntime, configure
from tests.workflows._wake_app import make_app

ROOT = Path(__file__).resolve().parents[2]
POLL = 5.0
WOKEN = 2.0
needs_bell = pytest.mark.skipif(not _doorbell.supported(), reason="the doorbell uses Linux abstract sockets")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "journal.db"


@contextmanager
def worker_process(db: Path) -> Iterator[None]:
    """A worker in another process (poll 5 s), listening before this returns."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.workflows._wake_app", f"sqlite:///{db}", str(POLL)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    try:
        wake = Path(f"{db.resolve()}-wake")
        deadline = time.monotonic() + 60
        while not (wake.is_dir() and os.listdir(wake)):
            assert proc.poll() is None, "the worker process exited"
            assert time.monotonic() < deadline, "the worker never started listening"
            time.sleep(0.01)
        time.sleep(0.3)  # its first look found nothing: it waits now
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


@pytest.fixture
def caller(db: Path) -> Iterator[tuple[Foundry, WorkflowRuntime]]:
    """This process: starts workflows, sends signals, waits for results."""
    app = make_app()
    rt = configure(app, journal=f"sqlite:///{db}", poll=POLL)
    try:
        yield app, rt
    finally:
        app.close(5)
        rt.close(5)


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


@needs_bell
def test_a_worker_elsewhere_picks_up_an_enqueued_workflow_and_the_caller_sees_its_result_at_once(
    db: Path, caller: tuple[Foundry, WorkflowRuntime], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workflow_runtime, "_SAFETY_POLL", POLL)  # the result wait's poll too
    app, _ = caller
    with worker_process(db):
        # When this process enqueues a workflow for the workers
        started = time.monotonic()
        handle = app.workflows["bump"].enqueue(41)
        # Then the idle worker runs it at once, and the result wakes this caller at once
        assert handle.result(timeout=30) == 42
        assert time.monotonic() - started < WOKEN


@needs_bell
def test_a_signal_from_another_process_resumes_a_parked_workflow_at_once(
    db: Path, caller: tuple[Foundry, WorkflowRuntime], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workflow_runtime, "_SAFETY_POLL", POLL)
    app, rt = caller
    with worker_process(db):
        # Given a workflow the worker parked waiting for a signal
        handle = app.workflows["await_go"].enqueue()
        wait_for(lambda: rt.journal.get(handle.id).status == WorkflowStatus.WAITING)  # type: ignore[union-attr]
        # When this process sends it
        started = time.monotonic()
        rt.signal(handle.id, "go", "now")
        # Then the worker resumes it at once
        assert handle.result(timeout=30) == "now"
        assert time.monotonic() - started < WOKEN


def test_without_the_doorbell_the_polls_still_complete_every_wait(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given no doorbell, and a worker on its own journal connection (no wake-ups shared)
    monkeypatch.setattr(_doorbell, "supported", lambda: False)
    app = make_app()
    rt = configure(app, journal=f"sqlite:///{db}", poll=0.05)
    worker = Worker(app, journal=f"sqlite:///{db}", poll=0.05, inline_wait=0.1).start()
    try:
        assert not rt.journal.changes.cross_process
        assert not worker.runtime.journal.changes.cross_process
        # When workflows are enqueued and signalled, Then the polls find every change
        assert app.workflows["bump"].enqueue(1).result(timeout=30) == 2
        handle = app.workflows["await_go"].enqueue()
        wait_for(lambda: rt.journal.get(handle.id).status == WorkflowStatus.WAITING)  # type: ignore[union-attr]
        rt.signal(handle.id, "go", "late")
        assert handle.result(timeout=30) == "late"
        assert not Path(f"{db.resolve()}-wake").exists()
    finally:
        worker.stop(5)
        app.close(5)
        rt.close(5)
