"""SQLite: the idempotency records in a table of one file (by default the stream's own
``sqlite:///`` file), every process of the host sharing it.

URL: ``sqlite:///relative.db`` or ``sqlite:////absolute.db``; ``memory://`` is a private
temporary file removed at close. WAL mode, one connection per thread, ``BEGIN IMMEDIATE``
transactions: a claim is one serialized transaction, so two processes claiming the same
key cannot both win. The only engine that is ``transactional``: ``once_in_transaction``
hands the caller the transaction that writes the record, so an effect written to the same
file commits with it or not at all (what ``foundry.deliver.stream.Idempotency`` does).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import ClassVar

from foundry.backends._sql_common import sqlite_connect, sqlite_error, sqlite_file
from foundry.backends.idempotency._sql import COLUMNS, SqlIdempotencyStore
from foundry.backends.idempotency.base import DEFAULT_MAX_AGE, DEFAULT_MAX_RECORDS, check_scope_key

__all__ = ["SqliteIdempotencyStore"]

_TABLE = (
    "CREATE TABLE IF NOT EXISTS foundry_handled (grp TEXT NOT NULL, id TEXT NOT NULL, at REAL NOT NULL, "
    "state TEXT NOT NULL DEFAULT 'done', owner TEXT NOT NULL DEFAULT '', until REAL NOT NULL DEFAULT 0, "
    "PRIMARY KEY (grp, id)) WITHOUT ROWID"
)


class SqliteIdempotencyStore(SqlIdempotencyStore):
    """Idempotency records in a SQLite file (see the module docstring)."""

    transactional: ClassVar[bool] = True
    engine: ClassVar[str] = "SQLite"

    def __init__(
        self, url: str, *, max_age: float = DEFAULT_MAX_AGE, max_records: int = DEFAULT_MAX_RECORDS
    ) -> None:
        super().__init__(url, max_age=max_age, max_records=max_records)
        self._temp: str | None = None
        if url.split("://", 1)[0].lower() == "memory":
            fd, self._temp = tempfile.mkstemp(prefix="foundry-idem-", suffix=".db")
            os.close(fd)
            self.path = self._temp
        else:
            self.path = sqlite_file(url.split("?", 1)[0], "idempotency")
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        with self._tx() as cur:
            cur.execute(_TABLE)
            present = {row[1] for row in cur.execute("PRAGMA table_info(foundry_handled)").fetchall()}
            for name, kind in COLUMNS:  # a table of the older Idempotency helper: its rows are done
                if name not in present:
                    cur.execute(f"ALTER TABLE foundry_handled ADD COLUMN {name} {kind}")

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite_connect(self.path, timeout=30.0, synchronous="NORMAL")
            self._local.conn = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Cursor]:
        what = f"idempotency store {self.url}"
        try:
            conn = self._conn()
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise (
                sqlite_error(exc, what, busy=True, fix="retry; another process holds the file") or exc
            ) from exc
        try:
            yield conn.cursor()
        except BaseException as exc:
            conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise sqlite_error(exc, what, busy=True, fix="retry", path=self.path) or exc from exc
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise sqlite_error(exc, what, busy=True, fix="retry", path=self.path) or exc from exc

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A plain write transaction on the store's file (set-up, reports, resets)."""
        with self._tx() as cur:
            yield cur.connection

    @contextlib.contextmanager
    def once_in_transaction(self, scope: str, key: str) -> Iterator[sqlite3.Connection | None]:
        """Record ``key`` as done in one transaction and hand its connection over (``None``
        when a live record was there): the caller's writes commit with the record."""
        check_scope_key(scope, key)
        now = time.time()
        with self._tx() as cur:
            cur.execute(
                "DELETE FROM foundry_handled WHERE grp=? AND id=? AND state='done' AND at < ?",
                (scope, key, now - self.max_age),
            )
            cur.execute(
                "INSERT OR IGNORE INTO foundry_handled (grp, id, at) VALUES (?,?,?)", (scope, key, now)
            )
            yield cur.connection if cur.rowcount == 1 else None

    def close(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()
        self._local = threading.local()
        if self._temp is not None:
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(OSError):
                    os.unlink(self._temp + suffix)
