"""PostgreSQL: the idempotency records in a table of one database, shared by every host.

URL: ``postgresql://user:pass@host:5432/db`` with the option ``schema=`` (default
``public``; created if missing). A claim is one transaction: an insert-if-absent, then
the row locked (``SELECT … FOR UPDATE``) and compared before it is taken over, so two
hosts claiming the same key cannot both win. One connection per thread (psycopg 3,
autocommit outside the claim's transaction); opening connects to nothing, the first
call makes the schema and the table.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import psycopg.errors

from foundry.backends.idempotency._sql import SqlIdempotencyStore
from foundry.backends.idempotency.base import DEFAULT_MAX_AGE, DEFAULT_MAX_RECORDS
from foundry.config import safe_url
from foundry.errors import BackendError, BackendUnavailableError, ConfigError

__all__ = ["PostgresIdempotencyStore"]

_TABLE = (
    "CREATE TABLE IF NOT EXISTS foundry_handled (grp TEXT NOT NULL, id TEXT NOT NULL, "
    "at DOUBLE PRECISION NOT NULL, state TEXT NOT NULL DEFAULT 'done', owner TEXT NOT NULL DEFAULT '', "
    "until DOUBLE PRECISION NOT NULL DEFAULT 0, PRIMARY KEY (grp, id))"
)


class PostgresIdempotencyStore(SqlIdempotencyStore):
    """Idempotency records in PostgreSQL (see the module docstring)."""

    placeholder: ClassVar[str] = "%s"
    engine: ClassVar[str] = "PostgreSQL"

    def __init__(
        self, url: str, *, max_age: float = DEFAULT_MAX_AGE, max_records: int = DEFAULT_MAX_RECORDS
    ) -> None:
        super().__init__(url, max_age=max_age, max_records=max_records)
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        self.schema = query.pop("schema", "public")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", self.schema):
            raise ConfigError(
                f"idempotency URL {safe_url(url)!r}: schema={self.schema!r} is not a plain identifier. "
                "Fix: letters, digits and '_', starting with a letter"
            )
        query.setdefault("connect_timeout", "10")
        self._conninfo = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))
        self._local = threading.local()
        self._conns: list[Any] = []
        self._lock = threading.Lock()
        self._ready = False  # the schema and table are made on first use: opening never connects

    def _conn(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed or conn.broken:
            try:
                conn = psycopg.connect(
                    self._conninfo, autocommit=True, options=f"-c search_path={self.schema}"
                )
            except psycopg.Error as exc:
                raise BackendUnavailableError(
                    f"idempotency store {self.url}: cannot connect ({exc}). Fix: check that PostgreSQL "
                    "is up and the URL's host, port, user and database"
                ) from exc
            self._local.conn = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    @contextlib.contextmanager
    def _tx(self) -> Iterator[Any]:
        conn = self._conn()
        if not self._ready:
            self._create(conn)
        with self._errors(), conn.transaction(), conn.cursor() as cur:
            yield cur

    def _create(self, conn: Any) -> None:
        """Make the schema and the table; another host making them at the same moment
        (``IF NOT EXISTS`` still races in PostgreSQL's catalog) is success, not an error."""
        raced = (
            psycopg.errors.UniqueViolation,
            psycopg.errors.DuplicateSchema,
            psycopg.errors.DuplicateTable,
        )
        for attempt in range(3):
            try:
                with self._errors(), conn.transaction(), conn.cursor() as cur:
                    cur.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
                    cur.execute(_TABLE)
                break
            except BackendError as exc:
                if not isinstance(exc.__cause__, raced) or attempt == 2:
                    raise
        self._ready = True

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except psycopg.OperationalError as exc:
            raise BackendUnavailableError(f"idempotency store {self.url}: {exc}. Fix: retry") from exc
        except psycopg.Error as exc:
            raise BackendError(f"idempotency store {self.url}: PostgreSQL failed: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(psycopg.Error):
                conn.close()
        self._local = threading.local()
