"""The SQLite limits engine: the queue's own file (``sqlite:///path``), tables
``<prefix>limit_buckets`` and ``<prefix>limit_slots``. One host, every process on it:
each call is one ``BEGIN IMMEDIATE`` transaction, so no two processes interleave."""

from __future__ import annotations

import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

from foundry.backends._sql_common import sqlite_connect, sqlite_error, sqlite_file
from foundry.backends.limits._sql import DDL, SqlLimits, table_prefix
from foundry.config import safe_url
from foundry.errors import BackendError

__all__ = ["SqliteLimits"]

T = TypeVar("T")


class SqliteLimits(SqlLimits):
    """Limits in a SQLite file (``memory://``: a private temporary file, removed at close)."""

    def __init__(self, url: str) -> None:
        query = dict(parse_qsl(urlsplit(url).query))
        super().__init__(url, table_prefix(url, query))
        self._temporary: Path | None = None
        if url.startswith("memory://"):
            handle, name = tempfile.mkstemp(prefix="foundry-limits-", suffix=".db")
            os.close(handle)  # an empty file is an empty database
            self.path = name
            self._temporary = Path(name)
        else:
            self.path = sqlite_file(url, "queue")
        self._lock = threading.Lock()
        self._what = f"limits {safe_url(url)}"
        try:
            self._conn = sqlite_connect(self.path, timeout=30.0, synchronous="FULL")
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        try:
            for statement in DDL:
                self._conn.execute(self._sql(statement))
        except sqlite3.Error as exc:
            self._conn.close()
            raise self._error(exc) from exc

    def _error(self, exc: Exception) -> Exception:
        return sqlite_error(
            exc, self._what, busy=True, fix="retry; a long transaction held the file", path=self.path
        ) or BackendError(f"{self._what}: {exc}")

    def _transaction(self, body: Callable[[Any, float], T]) -> T:
        with self._lock:
            cur = self._conn.cursor()
            try:
                cur.execute("BEGIN IMMEDIATE")
                try:
                    out = body(cur, time.time())
                except BaseException:
                    cur.execute("ROLLBACK")
                    raise
                cur.execute("COMMIT")
                return out
            except sqlite3.Error as exc:
                raise self._error(exc) from exc
            finally:
                cur.close()

    def close(self) -> None:
        with self._lock:
            self._conn.close()
        if self._temporary is not None:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self._temporary}{suffix}").unlink(missing_ok=True)
