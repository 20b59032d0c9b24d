"""The PostgreSQL queue (psycopg 3): many machines, one database.

URL: ``postgresql://user:password@host:5432/dbname`` with query options ``schema=``
(default ``public``; created on first use — a private schema per application or per
test keeps queues apart), ``prefix=`` (table name prefix, default ``foundry_``),
``pool=N`` (connections per process, default 16) and any libpq option
(``connect_timeout``, ``sslmode`` …), passed through.

Claims take ``FOR UPDATE SKIP LOCKED`` on the candidate rows, so workers never wait on
each other. Every write that makes work claimable or finishes a job sends
``pg_notify`` in its own transaction (delivered only if it commits); one listener
connection per process (``LISTEN``) wakes the local waiters of that queue or job, so
claims and ``wait`` sleep without polling (``capabilities.notify = True``); they still
look again every second in case a notification was lost to a reconnect.

A worker cut off from the database in the middle of a transaction (its machine
unplugged: the connection hangs, it does not close) would hold that transaction's row
locks for as long as the server keeps the session; every session therefore sets
``idle_in_transaction_session_timeout`` and server-side TCP keepalives
(:data:`foundry.backends._sql_common.SESSION_SETTINGS`), and the jobs it held go to other
workers once that and their lease have passed (``tests/multihost``).

A restart of the server breaks every connection: the calls that were using one raise
:class:`~foundry.errors.BackendUnavailableError` (callers retry), an idle connection
found dead is replaced before anything is sent, and the listener reconnects with
back-off and then wakes everyone to look again.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar, TypeVar

import psycopg

from foundry.backends._sql_common import SESSION_SETTINGS, PgListener, Postgres, parse_sql_url
from foundry.backends._urls import seconds_option
from foundry.backends.queue._sql import (
    ADDED_COLUMNS,
    INSERT_COLS,
    SqlQueue,
    insert_params,
)
from foundry.backends.queue.base import Capabilities, Enqueued, NewJob
from foundry.config import safe_url
from foundry.errors import BackendError, BackendUnavailableError, ConfigError

__all__ = ["PostgresQueue"]

log = logging.getLogger("foundry.queue.postgres")

T = TypeVar("T")


_DDL = """
CREATE TABLE IF NOT EXISTS {jobs} (
    seq BIGSERIAL PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    queue TEXT NOT NULL,
    unit TEXT NOT NULL,
    payload BYTEA NOT NULL,
    codec TEXT NOT NULL,
    key TEXT,
    priority INTEGER NOT NULL,
    eta DOUBLE PRECISION NOT NULL,
    status TEXT NOT NULL,
    token TEXT,
    worker TEXT,
    lease_until DOUBLE PRECISION NOT NULL,
    deliveries INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    max_retries INTEGER NOT NULL,
    max_deliveries INTEGER NOT NULL,
    timeout DOUBLE PRECISION,
    result BYTEA,
    error BYTEA,
    dead_reason TEXT,
    result_ttl DOUBLE PRECISION NOT NULL,
    enqueued_at DOUBLE PRECISION NOT NULL,
    started_at DOUBLE PRECISION,
    finished_at DOUBLE PRECISION,
    expires_at DOUBLE PRECISION,
    crashes INTEGER NOT NULL DEFAULT 0, -- lapses charged to the job: it ran alone (see base.py)
    alone TEXT, -- the token of the delivery its worker marked as running alone
    cancel_at DOUBLE PRECISION, -- a cancel was requested while it ran: every end of it is 'cancelled'
    progress TEXT, -- the last JobProgress its deliveries recorded (JSON)
    trace TEXT -- the W3C trace context it was submitted in (foundry.tracecontext)
);
CREATE UNIQUE INDEX IF NOT EXISTS {jobs}_key ON {jobs} (key) WHERE key IS NOT NULL;
CREATE INDEX IF NOT EXISTS {jobs}_ready ON {jobs} (queue, priority DESC, eta, seq) WHERE status = 'queued';
CREATE INDEX IF NOT EXISTS {jobs}_leased ON {jobs} (queue, lease_until) WHERE status = 'running';
CREATE INDEX IF NOT EXISTS {jobs}_dead ON {jobs} (queue, finished_at) WHERE status = 'dead';
CREATE INDEX IF NOT EXISTS {jobs}_expires ON {jobs} (expires_at) WHERE expires_at IS NOT NULL
"""

_OWN_OPTIONS = ("schema", "prefix", "pool")
_HEAVY = 8 << 20  # bytes in one value that make a connection worth closing after use


class PostgresQueue(SqlQueue):
    """The PostgreSQL queue backend (see the module docstring)."""

    capabilities: ClassVar[Capabilities] = Capabilities(
        notify=True, priority=True, cross_process_results=True
    )
    skip_locked: ClassVar[str] = " FOR UPDATE SKIP LOCKED"
    placeholder: ClassVar[str] = "%s"

    def __init__(self, url: str) -> None:
        self._psycopg = psycopg
        parts, query, prefix = parse_sql_url("queue", url, _OWN_OPTIONS)
        super().__init__(url, prefix=prefix)
        self.schema = query.get("schema", "public")
        if not self.schema.replace("_", "").isalnum():
            raise ConfigError(
                f"queue URL {safe_url(url)!r}: schema={self.schema!r} must be letters, digits and _. "
                "Fix: e.g. ?schema=myapp"
            )
        rest = {k: v for k, v in query.items() if k not in _OWN_OPTIONS}
        self._pg = Postgres(
            psycopg,
            f"queue {safe_url(url)}",
            parts,
            rest,
            self.schema,
            SESSION_SETTINGS,
        )
        self.channel = f"foundry_q_{zlib.crc32(f'{self.schema}.{self.table}'.encode()):08x}"
        self._pool = self._pg.pool(int(seconds_option("queue", url, query, "pool", 16)))
        self._listener = PgListener(
            self._pg,
            self.channel,
            heard=self.signals.bump,
            missed=self.signals.bump_all,
            name="foundry-queue-listen",
            log=log,
        )
        try:
            self._create_schema()
        except BaseException:
            self._pool.close()
            raise

    # Rows come back in binary: a bytea column (a payload, a result) arrives as its bytes;
    # the text format sends it as hex, twice the size, decoded in a third copy. libpq keeps
    # its buffers at the largest size they ever held, so a connection that carried a large
    # payload or result is closed after use instead of keeping that much memory in the pool.
    def fetch_one(self, conn: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        self._weigh(conn, params)
        row = conn.execute(self._sql(sql), params, binary=True).fetchone()
        if row is not None:
            self._weigh(conn, row)
        return row

    def fetch_all(self, conn: Any, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        self._weigh(conn, params)
        rows = list(conn.execute(self._sql(sql), params, binary=True).fetchall())
        for row in rows:
            self._weigh(conn, row)
        return rows

    def execute(self, conn: Any, sql: str, params: Sequence[Any] = ()) -> int:
        self._weigh(conn, params)
        return int(conn.execute(self._sql(sql), params).rowcount)

    def _weigh(self, conn: Any, values: Sequence[Any]) -> None:
        if any(isinstance(v, bytes | bytearray | memoryview) and len(v) >= _HEAVY for v in values):
            conn._foundry_heavy = True

    @staticmethod
    def _shed(conn: Any) -> None:
        """Close ``conn`` if it carried a large value (the pool then drops it)."""
        if getattr(conn, "_foundry_heavy", False):
            conn.close()

    # -- connections -----------------------------------------------------------------

    def _create_schema(self) -> None:
        ddl = _DDL.replace("{jobs}", self.table)
        lock_key = zlib.crc32(f"foundry-queue:{self.schema}".encode())

        def create(conn: Any) -> None:
            # Concurrent CREATE ... IF NOT EXISTS can still collide: serialise the migration.
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key,))
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
            for statement in ddl.split(";"):
                if statement.strip():
                    conn.execute(statement)
            have = {
                row[0]
                for row in conn.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
                    "AND table_name = %s",
                    (self.schema, self.table),
                )
            }
            for (
                name,
                kind,
            ) in ADDED_COLUMNS:  # to a table made by an older Foundry (ALTER locks it: only then)
                if name not in have:
                    conn.execute(f"ALTER TABLE {self.table} ADD COLUMN IF NOT EXISTS {name} {kind}")

        with self._errors():
            self._write(create)

    def _read(self) -> AbstractContextManager[Any]:
        return self._pool.connection()

    def query(self, fn: Callable[[Any], T]) -> T:
        # Reads are idempotent: one retry on a fresh connection hides a dead idle one.
        for attempt in range(2):
            try:
                with self._errors(), self._pool.connection() as conn:
                    try:
                        return fn(conn)
                    finally:
                        self._shed(conn)
            except BackendUnavailableError:
                if attempt:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _write(self, fn: Callable[[Any], T]) -> T:
        if self._closed:
            raise BackendError(f"queue {self.shown} is closed. Fix: do not use a queue backend after close()")
        for attempt in range(2):
            with self._pool.connection() as conn:
                try:
                    conn.execute("BEGIN")
                except self._psycopg.OperationalError:
                    if attempt:
                        raise
                    continue  # a dead idle connection: nothing was sent, take another
                try:
                    value = fn(conn)
                except BaseException:
                    try:
                        conn.execute("ROLLBACK")
                    except self._psycopg.Error:
                        pass
                    raise
                conn.execute("COMMIT")
                self._shed(conn)
                return value
        raise AssertionError("unreachable")  # pragma: no cover

    def _translate(self, exc: Exception) -> Exception | None:
        return self._pg.translate(exc)

    # -- batched enqueue ---------------------------------------------------------------

    def _insert_many(self, conn: Any, jobs: list[NewJob], now: float) -> list[Enqueued]:
        marks = ", ".join(["%s"] * len(INSERT_COLS.split(",")))
        created: list[bool] = []
        for job in jobs:
            self._weigh(conn, (job.payload,))
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {self.table} ({INSERT_COLS}) VALUES ({marks}) "
                "ON CONFLICT DO NOTHING RETURNING id",
                [insert_params(job, now) for job in jobs],
                returning=True,
            )
            while True:
                created.append(cur.fetchone() is not None)
                if not cur.nextset():
                    break
        out: list[Enqueued] = []
        for job, made in zip(jobs, created, strict=True):
            out.append(Enqueued(job.id, True) if made else self._insert(conn, job, now))
        return out

    # -- notifications -------------------------------------------------------------------

    def _notify(self, conn: Any, topics: Sequence[str]) -> None:
        for topic in topics:
            conn.execute("SELECT pg_notify(%s, %s)", (self.channel, topic))

    @contextmanager
    def _watch(self, topic: str | None = None) -> Iterator[None]:
        self._listener.start()
        yield

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.signals.bump_all()
        self._listener.stop(wake=self._wake_listener)
        self._pool.close()

    def _wake_listener(self) -> None:
        """Cut the listener's wait short, rather than at its next tick."""
        with self._pool.connection() as conn:
            conn.execute("SELECT pg_notify(%s, %s)", (self.channel, "stop"))
