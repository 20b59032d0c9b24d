"""Journals for the adversarial suite: a SQLite file or a private PostgreSQL schema
(dropped afterwards), and what a store writer does to them: write any value (text that
is not UTF-8 included) into a column of one workflow's row, one entry or one signal."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from foundry.backends.journal.base import WorkflowState, WorkflowStatus
from foundry.errors import MalformedRecordError
from tests.services import require

ENGINES = ["sqlite", "postgres"]


class NotUtf8:
    """A TEXT value that is not UTF-8 (SQLite only: ``CAST(bytes AS TEXT)``)."""

    def __init__(self, raw: bytes = b"\xff\xfejs\xc3") -> None:
        self.raw = raw

    def __repr__(self) -> str:
        return f"NotUtf8({self.raw!r})"


@contextmanager
def journal_url(engine: str, tmp_path: Path) -> Iterator[str]:
    """A fresh journal URL of ``engine`` (a PostgreSQL schema is dropped afterwards)."""
    if engine == "sqlite":
        yield f"sqlite:///{tmp_path / f'journal-{uuid.uuid4().hex[:6]}.db'}"
        return
    base = require("postgres")
    schema = f"fadv_{uuid.uuid4().hex[:10]}"
    try:
        yield f"{base}?schema={schema}"
    finally:
        import psycopg

        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _set(columns: dict[str, Any]) -> tuple[str, list[Any]]:
    parts, params = [], []
    for name, value in columns.items():
        if isinstance(value, NotUtf8):
            parts.append(f"{name} = CAST(? AS TEXT)")
            params.append(value.raw)
        else:
            parts.append(f"{name} = ?")
            params.append(value)
    return ", ".join(parts), params


def write_workflow(journal: Any, workflow_id: str, **columns: Any) -> None:
    """Set ``columns`` of one workflow's row, as someone with the database's credentials."""
    sets, params = _set(columns)
    with journal._tx() as c:
        assert c.run(f"UPDATE {{wf}} SET {sets} WHERE id = ?", [*params, workflow_id]) == 1


def write_entry(journal: Any, workflow_id: str, position: int, **columns: Any) -> None:
    sets, params = _set(columns)
    with journal._tx() as c:
        changed = c.run(
            f"UPDATE {{en}} SET {sets} WHERE workflow_id = ? AND pos = ?", [*params, workflow_id, position]
        )
        assert changed == 1, f"no entry {position} of {workflow_id}"


def insert_signal(journal: Any, workflow_id: str, name: str, payload: Any) -> None:
    with journal._tx() as c:
        c.run(
            "INSERT INTO {sg} (workflow_id, name, payload, sent_at) VALUES (?, ?, ?, ?)",
            (workflow_id, name, payload, time.time()),
        )


def wait_status(journal: Any, workflow_id: str, *statuses: WorkflowStatus, timeout: float = 30.0) -> None:
    """Wait until the workflow is in one of ``statuses`` (a row that does not decode reads as
    the malformed-record error until it is set aside: not yet)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            state = journal.get(workflow_id)
        except MalformedRecordError as exc:
            state = exc
        if isinstance(state, WorkflowState) and state.status in statuses:
            return
        assert time.monotonic() < deadline, f"{workflow_id} never became {statuses}: {state}"
        time.sleep(0.02)
