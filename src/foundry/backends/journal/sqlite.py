"""The embedded journal: one SQLite file (WAL), shared by every process on the machine.

URL: ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``; query options
``synchronous=full|normal`` (default ``full``: a recorded step survives power loss;
``normal`` survives a process crash but may lose the last commits on power loss),
``pool=N`` (connections, default 8), ``prefix=`` (table name prefix, default
``foundry_``). ``memory://`` is a process-local in-memory journal for tests.

SQLite has one writer at a time: a transactional step holds the write lock while its
code runs, so keep those steps short here (PostgreSQL locks only the workflow's row).

A commit that may end another process's wait (a new workflow for the workers, a signal,
a result) rings the processes waiting on the file (:mod:`foundry.backends._doorbell`,
Linux; marker files in ``<file>-wake/``), so ``changes.cross_process`` is true there:
workers and result waiters wake at once and poll only as a safety net.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from foundry.backends._doorbell import Wakeups
from foundry.backends._sql_common import make_pool, sqlite_connect, sqlite_error, sqlite_file
from foundry.backends.journal._sql import ENTRY_COLS, ON_CONFLICT, Cursor, SqlJournal, entry_params, parse_url
from foundry.backends.journal.base import Clock, Entry, Recorded
from foundry.config import safe_url
from foundry.errors import BackendUnavailableError, ConfigError

__all__ = ["SqliteJournal"]

# How the journal's connections read TEXT: bytes that are not UTF-8 (written by something
# else) become surrogate escapes that the row's decoder refuses, instead of sqlite3's
# OperationalError, which would fail the whole read — every claim, for one bad row.
_TEXT = functools.partial(str, encoding="utf-8", errors="surrogateescape")


# One autocommit statement: a write statement takes SQLite's write lock when it starts,
# so the token it reads cannot change before it commits (the fence). It writes only while
# no cancellation is requested, so a row written says the flag is clear, and it returns
# nothing: the row count says which happened (a RETURNING clause costs SQLite a temporary
# table per statement, a sizeable share of the step). No row: the token is stale, a final
# entry is there or a cancellation was requested; the general path tells which.
_RECORD = (
    f"INSERT INTO {{en}} (workflow_id, {ENTRY_COLS}) SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? "
    "FROM {wf} WHERE id = ? AND token = ? AND cancel_requested = 0 "
    f"{ON_CONFLICT}"
)
# The same statement for the entry almost every step records — no error, timer, ref or
# detail — with those four NULLs written into the SQL: sqlite3 binds a None (and any value
# but an exact int, float or str) only after failed lookups of an adapter, whose
# AttributeErrors cost more than the rest of the statement's binding.
_RECORD_DONE = _RECORD.replace(
    "SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?", "SELECT ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, NULL, NULL, NULL"
)


class SqliteJournal(SqlJournal):
    dialect: ClassVar[str] = "sqlite"
    begin_sql: ClassVar[str] = "BEGIN IMMEDIATE"
    types: ClassVar[dict[str, str]] = {
        "blob": "BLOB",
        "real": "REAL",
        "bigint": "INTEGER",
        "serial": "INTEGER PRIMARY KEY AUTOINCREMENT",
        "without_rowid": "WITHOUT ROWID",
    }
    row_key: ClassVar[str] = "rowid"

    def __init__(self, url: str, *, clock: Clock | None = None) -> None:
        parts, query, prefix, size = parse_url(url)
        super().__init__(url, prefix=prefix, clock=clock)
        self._anchor: sqlite3.Connection | None = None
        if parts.scheme == "memory":
            self._target = f"file:foundry-journal-{uuid.uuid4().hex}?mode=memory&cache=shared"
            self._uri = True
        else:
            self._target, self._uri = sqlite_file(url, "journal"), False
            self.changes = Wakeups(os.path.realpath(self._target))
        self._synchronous = query.get("synchronous", "full").upper()
        if self._synchronous not in ("FULL", "NORMAL", "EXTRA", "OFF"):
            raise ConfigError(
                f"journal URL {safe_url(url)!r}: synchronous={self._synchronous.lower()!r} is not a SQLite "
                "setting. Fix: use synchronous=full (default) or synchronous=normal"
            )
        self._pool = make_pool(self._open, size=size, what=f"journal {safe_url(url)}")
        if self._uri:
            self._anchor = self._open()  # an in-memory database lives while one connection does
        self._create_schema()

    def _open(self) -> sqlite3.Connection:
        try:
            conn = sqlite_connect(
                self._target, timeout=60.0, synchronous=self._synchronous, wal=not self._uri, uri=self._uri
            )
        except sqlite3.Error as exc:
            raise BackendUnavailableError(
                f"journal {self.shown}: cannot open {self._target} ({exc}). Fix: check the path and its "
                "permissions"
            ) from exc
        conn.text_factory = _TEXT
        return conn

    def _translate(self, exc: Exception) -> Exception | None:
        return sqlite_error(
            exc,
            f"journal {self.shown}",
            busy=False,
            fix="a long transactional step or another process holds the write lock; keep transactional "
            "steps short",
        )

    def _in_transaction(self, conn: Any) -> bool:
        return bool(conn.in_transaction)

    def _columns(self, c: Cursor) -> set[str]:
        return {str(row[1]) for row in c.conn.execute(f"PRAGMA table_info({self.wf})")}

    @contextmanager
    def _user_view(self, conn: Any) -> Iterator[None]:
        conn.text_factory = str  # a step reads its own tables as sqlite3 does by default
        try:
            yield
        finally:
            conn.text_factory = _TEXT

    def record(self, workflow_id: str, token: int, entry: Entry) -> Recorded:
        p = entry_params(workflow_id, entry)
        if p[6] is None and p[10] is None and p[11] is None and p[12] is None:  # error, wake_at, ref, detail
            written = self._write(_RECORD_DONE, (*p[:6], *p[7:10], workflow_id, token))
        else:
            written = self._write(_RECORD, (*p, workflow_id, token))
        if written:
            return Recorded(entry, written=True, cancel_requested=False)
        return super().record(workflow_id, token, entry)

    def close(self) -> None:
        self.changes.close()
        self._pool.close()
        if self._anchor is not None:
            self._anchor.close()
            self._anchor = None
