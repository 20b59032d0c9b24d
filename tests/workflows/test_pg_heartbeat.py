"""PostgreSQL locks a workflow's row for the whole of a transactional step (the fence).
A heartbeat must not wait for that lock: the keeper beats every run of the process one
after another, so one long step would hold up the others' leases until they lapse and
their workflows are taken over (their plain steps then run twice)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from foundry.backends.journal import JournalBackend, open_journal
from foundry.backends.journal.base import Entry, NewWorkflow
from tests.workflows.conftest import drop_schema, make_url

LEASE = 30.0


@pytest.fixture
def pg_journal(tmp_path: Path) -> Iterator[JournalBackend]:
    url, schema = make_url("postgres", tmp_path)
    journal = open_journal(url)
    try:
        yield journal
    finally:
        journal.close()
        assert schema is not None
        drop_schema(url.split("?", 1)[0], schema)


def _start(journal: JournalBackend, wid: str) -> int:
    started = journal.start(NewWorkflow(wid, "wf", b"{}"), owner="w1", lease=LEASE)
    assert started.claim is not None
    return started.claim.token


def test_a_heartbeat_does_not_wait_for_the_runs_own_transactional_step(pg_journal: JournalBackend) -> None:
    held = _start(pg_journal, "held")
    other = _start(pg_journal, "other")
    inside, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def step(tx: object) -> Entry:
        inside.set()
        assert release.wait(30), "the test never released the step"
        return Entry(0, "step", "s", "ok", result=b"1", attempts=1, started_at=1.0, finished_at=2.0)

    def run() -> None:
        try:
            pg_journal.record_transactional("held", held, 0, step)
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert inside.wait(10), "the transactional step did not start"
        beat = pg_journal.heartbeat("held", held, lease=LEASE, current_step="s")
        assert not release.is_set()  # it answered while the step still held the row
        assert beat.alive
        assert pg_journal.heartbeat("other", other, lease=LEASE).alive
        assert not pg_journal.heartbeat("held", held + 1, lease=LEASE).alive  # stale stays stale
    finally:
        release.set()
        thread.join(30)
    assert not errors, errors
    assert pg_journal.heartbeat("held", held, lease=LEASE).alive
