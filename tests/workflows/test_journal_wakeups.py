"""The journal wakes waiters in other processes — SQLite through the doorbell, PostgreSQL
through ``NOTIFY`` in the commit and a ``LISTEN`` thread: a worker with a long poll picks
up a workflow enqueued elsewhere at once, a signal sent from another process resumes a
parked workflow at once, and a caller waiting for a result sees another process's finish
at once. Without the wake-ups the polls still get there.

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
from typing import Any

import pytest

import foundry.deliver.workflow.runtime as workflow_runtime
from foundry import Foundry
from foundry.backends import _doorbell
from foundry.backends.journal import JournalBackend, NewWorkflow, WorkflowStatus, open_journal
from foundry.deliver.workflow import Worker, WorkflowRuntime, configure
from tests.workflows._wake_app import make_app

ROOT = Path(__file__).resolve().parents[2]
POLL = 5.0
WOKEN = 2.0


@pytest.fixture
def url(engine: str, journal_url: str) -> str:
    """The test's journal: a fresh SQLite file, or a private PostgreSQL schema (dropped
    afterwards by ``journal_url``)."""
    if engine == "sqlite" and not _doorbell.supported():
        pytest.skip("the doorbell uses Linux abstract sockets")
    return journal_url


def listening(url: str, journal: JournalBackend) -> bool:
    """Whether some process listens for this journal's commits."""
    if url.startswith("sqlite:"):
        wake = Path(f"{Path(url[len('sqlite:///') :]).resolve()}-wake")
        return wake.is_dir() and bool(os.listdir(wake))
    return bool(listener_pids(url, journal))


def listener_pids(url: str, journal: Any) -> list[int]:
    """The server processes of the connections that LISTEN for a PostgreSQL journal."""
    import psycopg

    with psycopg.connect(url.split("?", 1)[0], autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE query = %s", (f'LISTEN "{journal.channel}"',)
        ).fetchall()
    return [int(r[0]) for r in rows]


@contextmanager
def worker_process(url: str, journal: JournalBackend) -> Iterator[None]:
    """A worker in another process (poll 5 s), listening before this returns."""
    assert not listening(url, journal), "something listens already: the check below would prove nothing"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.workflows._wake_app", url, str(POLL)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not listening(url, journal):
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
def caller(url: str) -> Iterator[tuple[Foundry, WorkflowRuntime]]:
    """This process: starts workflows, sends signals, waits for results."""
    app = make_app()
    rt = configure(app, journal=url, poll=POLL)
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


def test_a_worker_elsewhere_picks_up_an_enqueued_workflow_and_the_caller_sees_its_result_at_once(
    url: str, caller: tuple[Foundry, WorkflowRuntime], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workflow_runtime, "_SAFETY_POLL", POLL)  # the result wait's poll too
    app, rt = caller
    assert rt.journal.changes.cross_process
    with worker_process(url, rt.journal):
        # When this process enqueues a workflow for the workers
        started = time.monotonic()
        handle = app.workflows["bump"].enqueue(41)
        # Then the idle worker runs it at once, and the result wakes this caller at once
        assert handle.result(timeout=30) == 42
        assert time.monotonic() - started < WOKEN


def test_a_signal_from_another_process_resumes_a_parked_workflow_at_once(
    url: str, caller: tuple[Foundry, WorkflowRuntime], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workflow_runtime, "_SAFETY_POLL", POLL)
    app, rt = caller
    with worker_process(url, rt.journal):
        # Given a workflow the worker parked waiting for a signal
        handle = app.workflows["await_go"].enqueue()
        wait_for(lambda: rt.journal.get(handle.id).status == WorkflowStatus.WAITING)  # type: ignore[union-attr]
        # When this process sends it
        started = time.monotonic()
        rt.signal(handle.id, "go", "now")
        # Then the worker resumes it at once
        assert handle.result(timeout=30) == "now"
        assert time.monotonic() - started < WOKEN


def silence(engine: str, journal: JournalBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``journal``'s commits tell no other process (its own waiters still hear them)."""
    if engine == "postgres":
        monkeypatch.setattr(journal, "commit_told", "COMMIT")
        monkeypatch.setattr(journal, "tell_sql", None)


def test_without_the_wake_ups_the_polls_still_complete_every_wait(
    engine: str, journal_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given no doorbell / no NOTIFY, and a worker on its own journal (no wake-ups shared)
    monkeypatch.setattr(_doorbell, "supported", lambda: False)
    app = make_app()
    rt = configure(app, journal=journal_url, poll=0.05)
    worker = Worker(app, journal=journal_url, poll=0.05, inline_wait=0.1)
    silence(engine, rt.journal, monkeypatch)
    silence(engine, worker.runtime.journal, monkeypatch)
    worker.start()
    try:
        if engine == "sqlite":
            assert not rt.journal.changes.cross_process
            assert not worker.runtime.journal.changes.cross_process
        # When workflows are enqueued and signalled, Then the polls find every change
        assert app.workflows["bump"].enqueue(1).result(timeout=30) == 2
        handle = app.workflows["await_go"].enqueue()
        wait_for(lambda: rt.journal.get(handle.id).status == WorkflowStatus.WAITING)  # type: ignore[union-attr]
        rt.signal(handle.id, "go", "late")
        assert handle.result(timeout=30) == "late"
        if engine == "sqlite":
            assert not Path(f"{Path(journal_url[len('sqlite:///') :]).resolve()}-wake").exists()
    finally:
        worker.stop(5)
        app.close(5)
        rt.close(5)


# -- PostgreSQL's LISTEN thread ----------------------------------------------------------


def new(wf_id: str) -> NewWorkflow:
    return NewWorkflow(id=wf_id, name="n", codec="json", args=b"{}")


@pytest.fixture
def pg_pair(journal_url: str) -> Iterator[tuple[Any, Any]]:
    """Two PostgreSQL journals on one schema, as two processes would hold them."""
    waiter, writer = open_journal(journal_url), open_journal(journal_url)
    try:
        yield waiter, writer
    finally:
        waiter.close()
        writer.close()


def woken_by(waiter: Any, write: Callable[[], object]) -> bool:
    """Whether ``write`` (another journal's commit) wakes a waiter of ``waiter`` within
    ``WOKEN`` s (the wait itself allows 10 s)."""
    mark = waiter.changes.mark()
    started = time.monotonic()
    write()
    return bool(waiter.changes.wait(mark, 10.0)) and time.monotonic() - started < WOKEN


@pytest.mark.parametrize("engine", ["postgres"])
def test_pg_listener_hears_commits_comes_back_after_its_connection_drops_and_leaves_when_idle(
    journal_url: str, pg_pair: tuple[Any, Any]
) -> None:
    import psycopg

    waiter, writer = pg_pair
    # Given a waiter that listens (its first LISTEN wakes it once: take a mark after that)
    waiter.changes.mark()
    wait_for(lambda: len(listener_pids(journal_url, waiter)) == 1, timeout=10)
    time.sleep(0.1)
    # When another journal commits a new workflow, a signal, a cancellation: each wakes it
    assert woken_by(waiter, lambda: writer.start(new("a")))
    assert woken_by(waiter, lambda: writer.signal("a", "go", b"1"))
    assert woken_by(waiter, lambda: writer.request_cancel("a"))
    # and a start that creates nothing (rolled back / no row) tells nobody
    mark = waiter.changes.mark()
    assert not writer.start(new("a")).created
    assert not waiter.changes.wait(mark, 0.5)

    # When the server drops the listening connection (as a restart does)
    (pid,) = listener_pids(journal_url, waiter)
    with psycopg.connect(journal_url.split("?", 1)[0], autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone() == (True,)
    # Then it listens again on a new connection, and commits wake it again
    wait_for(lambda: listener_pids(journal_url, waiter) not in ([], [pid]), timeout=15)
    waiter.changes.mark()
    time.sleep(0.1)
    assert woken_by(waiter, lambda: writer.start(new("b")))

    # When nobody waits any more, Then the connection goes (within idle 2 s + a 1 s tick)
    wait_for(lambda: listener_pids(journal_url, waiter) == [], timeout=15)
    # and the next wait listens again
    waiter.changes.mark()
    wait_for(lambda: len(listener_pids(journal_url, waiter)) == 1, timeout=10)


@pytest.mark.parametrize("engine", ["postgres"])
def test_pg_a_journal_hears_not_its_own_notifications_and_close_stops_listening(
    journal_url: str, pg_pair: tuple[Any, Any]
) -> None:
    waiter, _ = pg_pair
    waiter.changes.mark()
    wait_for(lambda: len(listener_pids(journal_url, waiter)) == 1, timeout=10)
    time.sleep(0.1)
    # Its own commit wakes its waiters once (directly), not a second time through LISTEN
    before = waiter.changes.mark()
    waiter.start(new("own"))
    after = waiter.changes.mark()
    assert after == before + 1
    time.sleep(0.5)
    assert waiter.changes.mark() == after
    # close() ends the thread and its connection at once
    started = time.monotonic()
    waiter.close()
    assert time.monotonic() - started < WOKEN
    assert not waiter.changes.cross_process
    # the server drops the closed connection's backend a moment after the client goes
    wait_for(lambda: listener_pids(journal_url, waiter) == [], timeout=5)
