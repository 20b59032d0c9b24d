"""The PostgreSQL journal (psycopg 3): many machines, one database.

URL: ``postgresql://user:password@host:5432/dbname`` with query options ``schema=``
(default ``public``; created if missing — a private schema per application or per test
keeps journals apart), ``prefix=`` (table name prefix, default ``foundry_``), ``pool=N``
(connections per process, default 8) and any libpq option (``connect_timeout``,
``sslmode`` …), passed through.

Claims use ``FOR UPDATE SKIP LOCKED`` (workers never wait on each other's claims); a
step's record is one statement that checks the lease token and writes the entry, so
it costs one round trip and one commit. A transactional step holds a lock on its
workflow's row only, so other workflows proceed while it runs.

A commit that may end another process's wait (a workflow enqueued for the workers, a
signal, a cancellation request, a hand-back, a finish) sends one ``NOTIFY`` on the
journal's channel (named after its schema and prefix) inside that commit — with the
``COMMIT`` in one round trip, or returned by the autocommit statement itself — so it is
delivered only if the commit happens. A process that waits (a worker, a caller's
``handle.result()``, a parked signal wait) listens on one connection, opened by a thread
when it first waits and closed after 2 s without a waiter; the notifications wake its
waiters at once, so ``changes.cross_process`` is true here. A server restart breaks that
connection: the thread reconnects with back-off and wakes everyone to look again. The
polls stay as safety nets (a worker's ``poll``, a result waiter's look once a second).
"""

from __future__ import annotations

import logging
import secrets
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import psycopg

from foundry.backends._doorbell import Wakeups
from foundry.backends._records import Fields
from foundry.backends._sql_common import SESSION_SETTINGS, PgListener, Postgres
from foundry.backends.journal._sql import ENTRY_COLS, ON_CONFLICT, Cursor, SqlJournal, entry_params, parse_url
from foundry.backends.journal.base import Clock, Entry, Recorded
from foundry.config import safe_url
from foundry.errors import ConfigError

__all__ = ["PostgresJournal"]

log = logging.getLogger("foundry.journal.postgres")


_OWN_OPTIONS = ("schema", "prefix", "pool")

# One statement: check the lease token (locking the workflow's row), write the entry
# unless a final one is there, and say which happened.
_RECORD = (
    "WITH w AS (SELECT cancel_requested FROM {wf} WHERE id = %s AND token = %s FOR NO KEY UPDATE), "
    f"ins AS (INSERT INTO {{en}} (workflow_id, {ENTRY_COLS}) "
    "SELECT %s::text, %s::integer, %s::text, %s::text, %s::text, %s::bytea, %s::bytea, %s::integer, "
    "%s::double precision, %s::double precision, %s::double precision, %s::integer, %s::text FROM w "
    f"{ON_CONFLICT} RETURNING 1) "
    "SELECT (SELECT cancel_requested FROM w), (SELECT count(*) FROM ins)"
)


class _Listening(Wakeups):
    """This process's commits wake its waiters at once; the other processes' reach them
    through ``LISTEN``, on a connection held while somebody waits (see the module
    docstring). ``token`` marks this journal's own notifications, which are no news."""

    def __init__(self, pg: Postgres, channel: str, token: str, wake: Callable[[], None]) -> None:
        super().__init__(None)
        self._token = token
        self._wake = wake
        self._listener = PgListener(
            pg,
            channel,
            heard=self._heard,
            missed=self.notify,
            keep=lambda: not self.idle(),
            name="foundry-journal-listen",
            log=log,
        )

    @property
    def cross_process(self) -> bool:
        return not self._listener.stopped

    def mark(self) -> int:
        mark = super().mark()
        self._listener.start()  # its first LISTEN wakes this waiter to look again
        return mark

    def _heard(self, payload: str) -> None:
        if payload != self._token:
            self.notify()

    def close(self, *, remove: bool = False) -> None:
        super().close(remove=remove)
        self._listener.stop(wake=self._wake)


class PostgresJournal(SqlJournal):
    dialect: ClassVar[str] = "postgres"
    begin_sql: ClassVar[str] = "BEGIN"
    types: ClassVar[dict[str, str]] = {
        "blob": "BYTEA",
        "real": "DOUBLE PRECISION",
        "bigint": "BIGINT",
        "serial": "BIGSERIAL PRIMARY KEY",
        "without_rowid": "",
    }
    skip_locked: ClassVar[str] = " FOR UPDATE SKIP LOCKED"
    placeholder: ClassVar[str] = "%s"
    # The row lock holds off a concurrent claim until the record (and a transactional
    # step's own writes) commit.
    fence_sql: ClassVar[str] = (
        "SELECT cancel_requested FROM {wf} WHERE id = ? AND token = ? FOR NO KEY UPDATE"
    )

    def __init__(self, url: str, *, clock: Clock | None = None) -> None:
        self._psycopg = psycopg
        parts, query, prefix, size = parse_url(url)
        super().__init__(url, prefix=prefix, clock=clock)
        self.schema = query.get("schema", "public")
        if not self.schema.replace("_", "").isalnum():
            raise ConfigError(
                f"journal URL {safe_url(url)!r}: schema={self.schema!r} must be letters, digits and _"
            )
        rest = {k: v for k, v in query.items() if k not in _OWN_OPTIONS}
        # A worker cut off mid-transaction must not pin the runs it was touching (see
        # SESSION_SETTINGS; a transactional step lifts the idle timeout: _user_view).
        self._pg = Postgres(psycopg, f"journal {safe_url(url)}", parts, rest, self.schema, SESSION_SETTINGS)
        self._pool = self._pg.pool(size)
        self.channel = f"foundry_j_{zlib.crc32(f'{self.schema}.{self.wf}'.encode()):08x}"
        token = secrets.token_hex(6)  # names this journal's own notifications
        self.commit_told = f"NOTIFY \"{self.channel}\", '{token}'; COMMIT"
        self.tell_sql = f"pg_notify('{self.channel}', '{token}')"
        self.changes = _Listening(self._pg, self.channel, token, self._wake_listener)
        self._create_schema()

    def _prepare_schema(self, c: Cursor) -> None:
        # Concurrent CREATE ... IF NOT EXISTS can still collide: serialise the migration.
        c.conn.execute(
            "SELECT pg_advisory_xact_lock(%s)", (zlib.crc32(f"foundry-journal:{self.schema}".encode()),)
        )
        c.conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')

    def _columns(self, c: Cursor) -> set[str]:
        rows = c.conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
            (self.schema, self.wf.lower()),
        )
        return {str(row[0]) for row in rows}

    def _translate(self, exc: Exception) -> Exception | None:
        return self._pg.translate(exc)

    @contextmanager
    def _user_view(self, conn: Any) -> Iterator[None]:
        # A transactional step is the user's code inside the journal's transaction: it may
        # compute between its statements for longer than the idle timeout. Only the TCP
        # keepalives guard that transaction against a client that vanished.
        conn.execute("SET LOCAL idle_in_transaction_session_timeout = 0")
        yield

    def _in_transaction(self, conn: Any) -> bool:
        return bool(conn.info.transaction_status == self._psycopg.pq.TransactionStatus.INTRANS)

    def _connection_lost(self, conn: Any) -> bool:
        return bool(conn.closed or conn.broken)

    def record(self, workflow_id: str, token: int, entry: Entry) -> Recorded:
        pos = entry.position
        with self._auto() as c:
            row = c.conn.execute(
                self._sql(_RECORD),
                (workflow_id, token, *entry_params(workflow_id, entry)),
            ).fetchone()
            if row[0] is None:
                raise self._fenced(c, workflow_id, token, f"{entry.kind} {entry.name!r}")
            cancel = Fields(workflow_id).flag("cancel_requested", row[0])
            if row[1]:
                return Recorded(entry, written=True, cancel_requested=cancel)
            existing = self._entry_at(c, workflow_id, pos)
        assert existing is not None
        return Recorded(existing, written=False, cancel_requested=cancel)

    def _wake_listener(self) -> None:
        """Cut the listener's wait short on close, rather than at its next tick."""
        with self._auto() as c:
            c.conn.execute("SELECT pg_notify(%s, '')", (self.channel,))

    def close(self) -> None:
        self.changes.close()
        self._pool.close()
