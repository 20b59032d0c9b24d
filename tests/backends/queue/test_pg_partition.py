"""A PostgreSQL queue or journal worker cut off mid-transaction must not pin the rows it
was touching: every session of both engines asks the server to end a transaction left
idle and to probe a silent client (``foundry.backends._sql_common.SESSION_SETTINGS``);
a workflow's transactional step (user code inside the journal's transaction) lifts the
idle timeout and keeps the keepalives. The behaviour itself — a host cut off, its jobs
and runs finished by another — is ``tests/multihost``."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from foundry.backends._sql_common import SESSION_SETTINGS
from foundry.backends.journal.base import Entry, EntryStatus, NewWorkflow
from foundry.backends.journal.postgres import PostgresJournal
from foundry.backends.queue.postgres import PostgresQueue
from tests.backends.queue.engines import close, drop_schema, engine_url
from tests.services import require


def _settings(conn: Any) -> dict[str, str]:
    return {name: str(conn.execute(f"SHOW {name}").fetchone()[0]) for name in SESSION_SETTINGS}


def test_every_queue_session_ends_a_transaction_its_client_abandoned(tmp_path: Path) -> None:
    url = engine_url("postgres", tmp_path)
    backend = PostgresQueue(url)
    try:
        with backend._pool.connection() as conn:
            assert _settings(conn) == {**SESSION_SETTINGS, "idle_in_transaction_session_timeout": "10s"}
            path = conn.execute("SHOW search_path").fetchone()[0]
        assert backend.schema in path
    finally:
        close(backend, url)


def test_every_journal_session_does_too_except_inside_a_transactional_step() -> None:
    base = require("postgres")
    url = f"{base}{'&' if '?' in base else '?'}schema=fpj_{uuid.uuid4().hex[:10]}"
    journal = PostgresJournal(url)
    try:
        with journal._pool.connection() as conn:
            assert _settings(conn) == SESSION_SETTINGS
        claim = journal.start(NewWorkflow("wf-1", "flow", b"{}"), owner="w", lease=30.0).claim
        assert claim is not None
        seen: dict[str, str] = {}

        def work(tx: Any) -> Entry:
            seen.update(_settings(tx.raw))
            return Entry(0, "step", "s", EntryStatus.OK, result=b"1", attempts=1)

        assert journal.record_transactional("wf-1", claim.token, 0, work).written
        assert seen == {**SESSION_SETTINGS, "idle_in_transaction_session_timeout": "0"}
        with journal._pool.connection() as conn:  # the step's SET LOCAL ended with its transaction
            assert _settings(conn) == SESSION_SETTINGS
    finally:
        journal.close()
        drop_schema(url)
