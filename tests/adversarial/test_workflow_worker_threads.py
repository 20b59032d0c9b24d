"""A workflow worker never lives on as a zombie (issue 12, item 5, for workflows): when
its claim loop or its keeper thread (heartbeats, wake-ups) fails on something that is not
an outage of the journal, the whole worker stops — handing back what it can — and
``run()`` raises :class:`WorkerFailedError` saying which thread and why;
``foundry workflows worker`` prints it and exits 1. Before, the claim loop's thread died
alone (the process looked healthy and claimed nothing), and the keeper logged the same
error on every tick while no lease was extended."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from foundry import Foundry
from foundry.backends.journal._sql import SqlJournal
from foundry.cli import main as cli
from foundry.deliver.workflow import Worker
from foundry.errors import BackendUnavailableError
from tests.adversarial._running import run_until_it_fails


@pytest.fixture
def make_worker(workflow_app: Foundry) -> Iterator[Callable[..., Worker]]:
    made: list[Worker] = []

    def make(**options: Any) -> Worker:
        made.append(Worker(workflow_app, poll=0.05, **options))
        return made[-1]

    try:
        yield make
    finally:
        for worker in made:
            worker.stop(5)


def test_a_claim_loop_that_fails_stops_the_worker(
    workflow_app: Foundry, make_worker: Callable[..., Worker]
) -> None:
    worker = make_worker(lease=5.0)
    real = worker.runtime.journal.claim
    calls = {"n": 0}

    def claim(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise BackendUnavailableError("an outage: the loop backs off and claims again")
        if calls["n"] == 4:
            raise RuntimeError("a bug in the claim path")
        return real(*args, **kwargs)

    worker.runtime.journal.claim = claim  # type: ignore[method-assign]
    handle = workflow_app.workflows["doubling"].enqueue(4)
    error = run_until_it_fails(worker)
    assert "claim thread" in str(error)
    assert "RuntimeError: a bug in the claim path" in str(error)
    assert worker.failure is error
    assert calls["n"] == 4  # the outage did not stop it, the bug did
    assert handle.result(timeout=10) == 8  # claimed and run before the bug


def test_a_keeper_that_fails_stops_the_worker(
    workflow_app: Foundry, make_worker: Callable[..., Worker]
) -> None:
    # Given a worker whose heartbeats fail with an error that is not an outage
    worker = make_worker(lease=0.3)

    def heartbeat(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("a bug in the heartbeat")

    worker.runtime.journal.heartbeat = heartbeat  # type: ignore[method-assign]
    workflow_app.workflows["slow"].enqueue(1)
    # Then the worker stops by itself, saying why, rather than run on with no leases kept
    error = run_until_it_fails(worker)
    assert "keeper thread" in str(error)
    assert "ValueError: a bug in the heartbeat" in str(error)


def test_foundry_workflows_worker_exits_1_saying_which_thread_failed(
    journal_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FOUNDRY_HOME", str(tmp_path / "home"))

    def claim(self: SqlJournal, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in the claim path")

    monkeypatch.setattr(SqlJournal, "claim", claim)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli(["workflows", "worker", "tests.adversarial._workflow_app:app", "--journal", journal_url])
    assert code == 1
    assert "its claim thread failed (RuntimeError: a bug in the claim path)" in err.getvalue()
