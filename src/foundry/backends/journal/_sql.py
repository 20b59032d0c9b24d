"""The journal's logic in portable SQL; ``sqlite.py`` and ``postgres.py`` supply the
connections, the DDL, the error mapping and the few statements that differ.

Statements are written with qmark placeholders (``?``) and ``{wf}``, ``{en}``, ``{sg}``
for the tables; an engine with another paramstyle gets them rewritten once (``_sql``,
from :class:`~foundry.backends._sql_common.SqlEngine`). Every write that belongs to a
run checks the run's lease token in the same transaction (the fence).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from typing import Any, ClassVar
from urllib.parse import SplitResult, parse_qs, urlsplit

from foundry.backends._doorbell import Wakeups
from foundry.backends._sql_common import SqlEngine
from foundry.backends.journal._pool import Pool
from foundry.backends.journal.base import (
    ACTIVE,
    Beat,
    Claim,
    Clock,
    Entry,
    EntryStatus,
    NewWorkflow,
    Recorded,
    SignalRecord,
    Started,
    SystemClock,
    WorkflowState,
    WorkflowStatus,
)
from foundry.config import safe_url
from foundry.errors import (
    BackendUnavailableError,
    ConfigError,
    LeaseLostError,
    NotFoundError,
    SubmitError,
    WorkflowFinishedError,
)

_HELD_WORTH_GIVING_BACK = 1.0  # seconds a transactional step held its row (see record_transactional)

WF_COLS = (
    "id, name, status, codec, args, result, error, parent_id, parent_pos, owner, token, lease_until, "
    "wake_at, cancel_requested, compensation, claims, "
    "(SELECT COALESCE(MAX(e.pos) + 1, 0) FROM {en} e WHERE e.workflow_id = {wf}.id), "
    "current_step, step_started_at, "
    "wakeups, created_at, updated_at, finished_at"
)
CLAIM_COLS = (
    "id, name, token, lease_until, status, args, codec, parent_id, parent_pos, cancel_requested, "
    "wakeups, claims"
)
ENTRY_COLS = "pos, kind, name, status, result, error, attempts, started_at, finished_at, wake_at, ref, detail"
_ACTIVE_SQL = "(" + ", ".join(f"'{s}'" for s in ACTIVE) + ")"
# A final entry is written once per position; a waiting one may be replaced or resolved.
ON_CONFLICT = (
    " ON CONFLICT (workflow_id, pos) DO UPDATE SET "
    + ", ".join(f"{col} = excluded.{col}" for col in ENTRY_COLS.split(", ")[1:])
    + " WHERE {en}.status = 'waiting'"
)

# The schema, one template for every engine; ``types`` of each engine fill the words.
DDL = """
CREATE TABLE IF NOT EXISTS {wf} (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    codec TEXT NOT NULL,
    args {blob},
    result {blob},
    error {blob},
    parent_id TEXT,
    parent_pos INTEGER,
    owner TEXT,
    token {bigint} NOT NULL,
    lease_until {real} NOT NULL,
    wake_at {real} NOT NULL,
    cancel_requested INTEGER NOT NULL,
    compensation TEXT NOT NULL,
    claims INTEGER NOT NULL,
    current_step TEXT,
    step_started_at {real},
    wakeups {bigint} NOT NULL,
    created_at {real} NOT NULL,
    updated_at {real} NOT NULL,
    finished_at {real}
);
CREATE INDEX IF NOT EXISTS {wf}_due ON {wf} (wake_at, created_at)
    WHERE status IN ('pending', 'running', 'waiting', 'compensating');
CREATE INDEX IF NOT EXISTS {wf}_parent ON {wf} (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS {wf}_created ON {wf} (created_at);
CREATE TABLE IF NOT EXISTS {en} (
    workflow_id TEXT NOT NULL,
    pos INTEGER NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    result {blob},
    error {blob},
    attempts INTEGER NOT NULL,
    started_at {real} NOT NULL,
    finished_at {real},
    wake_at {real},
    ref INTEGER,
    detail TEXT,
    PRIMARY KEY (workflow_id, pos)
) {without_rowid};
CREATE TABLE IF NOT EXISTS {sg} (
    seq {serial},
    workflow_id TEXT NOT NULL,
    name TEXT NOT NULL,
    payload {blob} NOT NULL,
    sent_at {real} NOT NULL,
    consumed_pos INTEGER
);
CREATE INDEX IF NOT EXISTS {sg}_inbox ON {sg} (workflow_id, name, seq);
"""


def state_from_row(row: Sequence[Any]) -> WorkflowState:
    return WorkflowState(
        id=row[0],
        name=row[1],
        status=WorkflowStatus(row[2]),
        codec=row[3],
        args=bytes(row[4]) if row[4] is not None else b"",
        result=None if row[5] is None else bytes(row[5]),
        error=None if row[6] is None else bytes(row[6]),
        parent_id=row[7],
        parent_position=row[8],
        owner=row[9],
        token=int(row[10]),
        lease_until=float(row[11]),
        wake_at=float(row[12]),
        cancel_requested=bool(row[13]),
        compensation=row[14] or "",
        claims=int(row[15]),
        position=int(row[16]),
        current_step=row[17],
        step_started_at=row[18],
        wakeups=int(row[19]),
        created_at=float(row[20]),
        updated_at=float(row[21]),
        finished_at=row[22],
    )


def claim_from_row(row: Sequence[Any], *, fresh: bool = False) -> Claim:
    return Claim(
        id=row[0],
        name=row[1],
        token=int(row[2]),
        lease_until=float(row[3]),
        status=WorkflowStatus(row[4]),
        args=bytes(row[5]) if row[5] is not None else b"",
        codec=row[6],
        parent_id=row[7],
        parent_position=row[8],
        cancel_requested=bool(row[9]),
        wakeups=int(row[10]),
        claims=int(row[11]),
        fresh=fresh,
    )


def entry_from_row(row: Sequence[Any]) -> Entry:
    return Entry(
        position=int(row[0]),
        kind=row[1],
        name=row[2],
        status=row[3],
        result=None if row[4] is None else bytes(row[4]),
        error=None if row[5] is None else bytes(row[5]),
        attempts=int(row[6]),
        started_at=float(row[7]),
        finished_at=row[8],
        wake_at=row[9],
        ref=row[10],
        detail=row[11],
    )


def entry_params(workflow_id: str, e: Entry) -> tuple[Any, ...]:
    return (
        workflow_id,
        e.position,
        e.kind,
        e.name,
        e.status,
        e.result,
        e.error,
        e.attempts,
        e.started_at,
        e.finished_at,
        e.wake_at,
        e.ref,
        e.detail,
    )


class Cursor:
    """One connection inside one transaction (or autocommit), qmark SQL."""

    __slots__ = ("conn", "journal", "rang")

    def __init__(self, journal: SqlJournal, conn: Any) -> None:
        self.journal = journal
        self.conn = conn
        self.rang = False

    def ring(self) -> None:
        """This session's commit may end a wait: the waiters are woken once it commits.
        In a transaction, an engine that tells other processes (PostgreSQL's ``NOTIFY``)
        does so in the commit; an autocommit statement must carry it itself
        (:meth:`SqlJournal._told`)."""
        self.rang = True

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        cur = self.conn.execute(self.journal._sql(sql), params)
        return int(cur.rowcount)

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.conn.execute(self.journal._sql(sql), params).fetchone()

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return list(self.conn.execute(self.journal._sql(sql), params).fetchall())


class UserTx:
    """The :class:`~foundry.backends.journal.base.Tx` a transactional step receives."""

    __slots__ = ("_journal", "dialect", "raw")

    def __init__(self, journal: SqlJournal, conn: Any) -> None:
        self._journal = journal
        self.dialect = journal.dialect
        self.raw = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        cur = self.raw.execute(self._journal._sql(sql), tuple(params))
        if cur.description is None:
            return []
        return [tuple(r) for r in cur.fetchall()]


class _UserFailure(Exception):
    """Carries a transactional step's own exception past the driver-error mapping."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(repr(error))
        self.error = error


class Session:
    """Check a connection out of the pool, open (and commit or roll back) a transaction,
    map driver errors — one context manager on the hot path instead of three."""

    __slots__ = ("conn", "cursor", "journal", "transaction")

    def __init__(self, journal: SqlJournal, *, transaction: bool) -> None:
        self.journal = journal
        self.transaction = transaction
        self.conn: Any = None
        self.cursor: Cursor | None = None

    def __enter__(self) -> Cursor:
        journal = self.journal
        try:
            self.conn = journal._pool.acquire()
            if self.transaction:
                self.conn.execute(journal.begin_sql)
        except Exception as exc:
            if self.conn is not None:
                journal._pool.release(self.conn, check=True)
            journal._raise_mapped(exc)
            raise
        self.cursor = Cursor(journal, self.conn)
        return self.cursor

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> None:
        journal, conn = self.journal, self.conn
        failure = error
        rang = self.cursor is not None and self.cursor.rang
        if self.transaction:
            try:
                conn.execute(("COMMIT" if not rang else journal.commit_told) if error is None else "ROLLBACK")
            except Exception as exc:
                if error is None:
                    failure = exc
                    try:
                        conn.execute("ROLLBACK")
                    except Exception:
                        pass
        journal._pool.release(conn, check=failure is not None)
        if failure is not None:
            journal._raise_mapped(failure)
            if error is None:  # the commit itself failed
                raise failure
        elif rang:
            journal.changes.ring()
        # returning None lets the body's own exception propagate unchanged


class SqlJournal(SqlEngine):
    """Shared implementation; subclasses set the engine specifics below."""

    dialect: ClassVar[str] = "sql"
    begin_sql: ClassVar[str] = "BEGIN"
    skip_locked: ClassVar[str] = ""
    _pool: Pool[Any]  # set by the engine before first use
    types: ClassVar[dict[str, str]]  # column types of the engine, for DDL
    # Check a run's token inside its write transaction, so no claim commits in between.
    fence_sql: ClassVar[str] = "SELECT cancel_requested FROM {wf} WHERE id = ? AND token = ?"

    def __init__(self, url: str, *, prefix: str, clock: Clock | None) -> None:
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.wf = f"{prefix}workflows"
        self.entries = f"{prefix}entries"
        self.sigs = f"{prefix}signals"
        super().__init__(url, {"{wf}": self.wf, "{en}": self.entries, "{sg}": self.sigs})
        self._lock = threading.Lock()
        # This process's commits wake its waiters; an engine that can reach other
        # processes' waiters (SQLite's doorbell, PostgreSQL's LISTEN) replaces it.
        self.changes: Wakeups = Wakeups(None)
        # An engine that tells other processes in the commit itself (PostgreSQL) sets
        # these: the statement that commits a transaction that rang, and an expression an
        # autocommit statement that rings returns (see ``_told``).
        self.commit_told = "COMMIT"
        self.tell_sql: str | None = None

    # -- plumbing ----------------------------------------------------------------

    def _raise_mapped(self, exc: BaseException) -> None:
        """Raise the Foundry error for a driver error (a step's own error unchanged)."""
        if isinstance(exc, _UserFailure):
            raise exc.error from None
        mapped = self._translate(exc) if isinstance(exc, Exception) else None
        if mapped is not None:
            raise mapped from exc

    def _tx(self) -> Session:
        """A pooled connection inside one transaction, committed on a clean exit."""
        return Session(self, transaction=True)

    def _auto(self) -> Session:
        """A pooled connection in autocommit: one statement, or several reads."""
        return Session(self, transaction=False)

    def _create_schema(self) -> None:
        """Create the tables and indexes if they are missing (idempotent, one transaction)."""
        text = DDL.format(wf=self.wf, en=self.entries, sg=self.sigs, **self.types)
        with self._tx() as c:
            self._prepare_schema(c)
            for statement in text.split(";"):
                if statement.strip():
                    c.conn.execute(statement)

    def _prepare_schema(self, c: Cursor) -> None:
        """Engine hook run first in the schema transaction."""

    def _told(self, returning: str = "", *, when: str | None = None) -> str:
        """The ``RETURNING`` clause of an autocommit statement that rings: ``returning``
        (columns, or empty) and, on an engine that tells other processes, its notification
        — for each row written, or only for those where ``when`` holds — so the statement's
        own commit carries it."""
        cols = [returning] if returning else []
        if self.tell_sql is not None:
            cols.append(self.tell_sql if when is None else f"CASE WHEN {when} THEN {self.tell_sql} END")
        return f" RETURNING {', '.join(cols)}" if cols else ""

    def _now(self) -> float:
        return self.clock.time()

    def _fenced(self, c: Cursor, workflow_id: str, token: int, what: str) -> LeaseLostError | NotFoundError:
        row = c.one("SELECT token FROM {wf} WHERE id = ?", (workflow_id,))
        if row is None:
            return NotFoundError(f"no workflow with id {workflow_id!r} in journal {self.shown}")
        return LeaseLostError(
            f"workflow {workflow_id!r}: lease token {token} is stale (now {row[0]}); another worker "
            f"claimed it, so this run's {what} was not recorded and the run stops. Fix: nothing to do "
            "— the new owner resumes from the journal; if it happens often, raise lease= or check "
            "that workers are not starved of CPU"
        )

    def _fence(self, c: Cursor, workflow_id: str, token: int, position: int, what: str) -> bool:
        """Check the token inside the open transaction and hold it: the engine's
        ``fence_sql`` keeps a concurrent claim out until this transaction ends. Returns
        ``cancel_requested``."""
        row = c.one(self.fence_sql, (workflow_id, token))
        if row is None:
            raise self._fenced(c, workflow_id, token, what)
        return bool(row[0])

    def _entry_at(self, c: Cursor, workflow_id: str, position: int) -> Entry | None:
        row = c.one(
            f"SELECT {ENTRY_COLS} FROM {{en}} WHERE workflow_id = ? AND pos = ?", (workflow_id, position)
        )
        return None if row is None else entry_from_row(row)

    def _upsert(self, c: Cursor, workflow_id: str, entry: Entry) -> bool:
        n = c.run(
            f"INSERT INTO {{en}} (workflow_id, {ENTRY_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            + ON_CONFLICT,
            entry_params(workflow_id, entry),
        )
        return n > 0

    # -- the contract ------------------------------------------------------------

    def start(self, wf: NewWorkflow, *, owner: str | None = None, lease: float = 30.0) -> Started:
        now = self._now()
        claimed = owner is not None
        token, lease_until, claims = (1, now + lease, 1) if claimed else (0, 0.0, 0)
        status = "running" if claimed else "pending"
        with self._auto() as c:
            created = (
                c.run(
                    "INSERT INTO {wf} (id, name, status, codec, args, parent_id, parent_pos, owner, token, "
                    "lease_until, wake_at, cancel_requested, compensation, claims, wakeups, "
                    "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, '', ?, 0, ?, ?) "
                    "ON CONFLICT (id) DO NOTHING" + ("" if claimed else self._told()),
                    (
                        wf.id,
                        wf.name,
                        status,
                        wf.codec,
                        wf.args,
                        wf.parent_id,
                        wf.parent_position,
                        owner,
                        token,
                        lease_until,
                        claims,
                        now,
                        now,
                    ),
                )
                > 0
            )
            if not created:
                row = c.one(f"SELECT {WF_COLS} FROM {{wf}} WHERE id = ?", (wf.id,))
                return Started(state_from_row(row), created=False, claim=None)
            if not claimed:
                c.ring()  # a new claimable workflow: wake the workers
        state = WorkflowState(
            id=wf.id,
            name=wf.name,
            status=WorkflowStatus(status),
            codec=wf.codec,
            args=wf.args,
            result=None,
            error=None,
            parent_id=wf.parent_id,
            parent_position=wf.parent_position,
            owner=owner,
            token=token,
            lease_until=lease_until,
            wake_at=0.0,
            cancel_requested=False,
            compensation="",
            claims=claims,
            position=0,
            current_step=None,
            step_started_at=None,
            wakeups=0,
            created_at=now,
            updated_at=now,
            finished_at=None,
        )
        claim = None
        if owner:
            claim = Claim(
                id=wf.id,
                name=wf.name,
                token=token,
                lease_until=lease_until,
                status=WorkflowStatus.RUNNING,
                args=wf.args,
                codec=wf.codec,
                parent_id=wf.parent_id,
                parent_position=wf.parent_position,
                cancel_requested=False,
                wakeups=0,
                claims=1,
                fresh=True,
            )
        return Started(state, created=True, claim=claim)

    _CLAIM_SET = (
        "SET owner = ?, token = token + 1, lease_until = ?, claims = claims + 1, wake_at = 0, "
        "status = CASE WHEN status IN ('pending', 'waiting') THEN 'running' ELSE status END, "
        "current_step = NULL, step_started_at = NULL, updated_at = ? "
    )

    def claim(
        self, owner: str, *, lease: float, limit: int = 1, names: Collection[str] | None = None
    ) -> list[Claim]:
        if limit <= 0 or (names is not None and not names):
            return []
        now = self._now()
        name_list = sorted(names) if names is not None else []
        name_sql = f" AND name IN ({', '.join('?' * len(name_list))})" if name_list else ""
        with self._tx() as c:
            ids = [
                r[0]
                for r in c.all(
                    f"SELECT id FROM {{wf}} WHERE status IN {_ACTIVE_SQL} AND lease_until <= ? "
                    f"AND wake_at <= ?{name_sql} ORDER BY wake_at, created_at LIMIT ?{self.skip_locked}",
                    (now, now, *name_list, limit),
                )
            ]
            if not ids:
                return []
            rows = c.all(
                f"UPDATE {{wf}} {self._CLAIM_SET}WHERE id IN ({', '.join('?' * len(ids))}) "
                f"RETURNING {CLAIM_COLS}",
                (owner, now + lease, now, *ids),
            )
        claims = [claim_from_row(r) for r in rows]
        claims.sort(key=lambda cl: ids.index(cl.id))
        return claims

    def claim_one(self, workflow_id: str, owner: str, *, lease: float) -> Claim | None:
        now = self._now()
        with self._auto() as c:
            row = c.one(
                f"UPDATE {{wf}} {self._CLAIM_SET}WHERE id = ? AND status IN {_ACTIVE_SQL} "
                f"AND lease_until <= ? AND wake_at <= ? RETURNING {CLAIM_COLS}",
                (owner, now + lease, now, workflow_id, now, now),
            )
        return None if row is None else claim_from_row(row)

    def heartbeat(
        self,
        workflow_id: str,
        token: int,
        *,
        lease: float,
        current_step: str | None = None,
        step_started_at: float | None = None,
    ) -> Beat:
        now = self._now()
        live = "id = ? AND token = ? AND owner IS NOT NULL AND status IN ('running', 'compensating')"
        with self._auto() as c:
            # Where rows lock (PostgreSQL), a row held by this run's own transactional step
            # (its fence locks it for the whole step) is skipped rather than waited for: one
            # long step must not hold up the heartbeats of every other run in the process.
            row = c.one(
                "UPDATE {wf} SET lease_until = ?, current_step = ?, step_started_at = ?, updated_at = ? "
                f"WHERE id = (SELECT id FROM {{wf}} WHERE {live}{self.skip_locked}) "
                "RETURNING cancel_requested",
                (now + lease, current_step, step_started_at, now, workflow_id, token),
            )
            if row is None and self.skip_locked:
                # Skipped, or stale: a plain read does not wait for the lock. A held run
                # stays leased: nobody can claim a locked row, and the step's commit gives
                # back the lease time it held the row for (record_transactional).
                row = c.one(f"SELECT cancel_requested FROM {{wf}} WHERE {live}", (workflow_id, token))
        if row is None:
            return Beat(alive=False, cancel_requested=False)
        return Beat(alive=True, cancel_requested=bool(row[0]))

    def load(self, workflow_id: str) -> tuple[WorkflowState, list[Entry]]:
        with self._tx() as c:
            row = c.one(f"SELECT {WF_COLS} FROM {{wf}} WHERE id = ?", (workflow_id,))
            if row is None:
                raise NotFoundError(
                    f"no workflow with id {workflow_id!r} in journal {self.shown}. "
                    "Fix: check the id with `foundry workflows list`"
                )
            rows = c.all(
                f"SELECT {ENTRY_COLS} FROM {{en}} WHERE workflow_id = ? ORDER BY pos", (workflow_id,)
            )
        return state_from_row(row), [entry_from_row(r) for r in rows]

    def record(self, workflow_id: str, token: int, entry: Entry) -> Recorded:
        with self._tx() as c:
            cancel = self._fence(c, workflow_id, token, entry.position, f"{entry.kind} {entry.name!r}")
            if self._upsert(c, workflow_id, entry):
                return Recorded(entry, written=True, cancel_requested=cancel)
            existing = self._entry_at(c, workflow_id, entry.position)
        assert existing is not None
        return Recorded(existing, written=False, cancel_requested=cancel)

    def record_transactional(
        self, workflow_id: str, token: int, position: int, work: Callable[[Any], Entry]
    ) -> Recorded:
        with self._tx() as c:
            cancel = self._fence(c, workflow_id, token, position, "transactional step")
            held_from = self._now()
            existing = self._entry_at(c, workflow_id, position)
            if existing is not None and existing.final:
                return Recorded(existing, written=False, cancel_requested=cancel)
            try:
                entry = work(UserTx(self, c.conn))
            except BaseException as exc:
                if isinstance(exc, Exception) and self._connection_lost(c.conn):
                    # The server dropped the journal's own connection under the step (a
                    # restart): its writes and this transaction are gone, nothing was
                    # recorded. An outage for the run to ride out, not the step's failure.
                    raise BackendUnavailableError(
                        f"journal {self.shown}: the connection was lost during a transactional step "
                        f"({exc!r}); nothing of it was committed. Fix: usually transient (a restart); "
                        "the run retries the step"
                    ) from exc
                raise _UserFailure(exc) from exc
            self._check_still_open(c)
            self._upsert(c, workflow_id, entry)
            # The run was alive all the time it held the row (a dead one never commits),
            # but no heartbeat could extend its lease meanwhile: give that time back, so
            # the run leaves the step with the lease it entered with, not a lapsed one
            # that another worker could claim before the next heartbeat. A short hold
            # costs the lease nothing worth a statement on every step.
            held = self._now() - held_from
            if held >= _HELD_WORTH_GIVING_BACK:
                c.run(
                    "UPDATE {wf} SET lease_until = lease_until + ? WHERE id = ? AND token = ?",
                    (held, workflow_id, token),
                )
        return Recorded(entry, written=True, cancel_requested=cancel)

    def _check_still_open(self, c: Cursor) -> None:
        """Raise if the step committed or rolled back the journal's transaction itself."""
        if not self._in_transaction(c.conn):
            raise SubmitError(
                f"journal {self.shown}: a transactional step committed or rolled back the journal's "
                "transaction itself, so its writes are no longer atomic with its record. Fix: never "
                "commit or roll back on tx (or tx.raw); raise an exception to roll back"
            )

    def _in_transaction(self, conn: Any) -> bool:
        raise NotImplementedError

    def _connection_lost(self, conn: Any) -> bool:
        """Did the server drop ``conn`` (so its transaction is gone)? Engine hook."""
        return False

    def consume_signal(self, workflow_id: str, token: int, position: int, name: str) -> Recorded | None:
        now = self._now()
        with self._tx() as c:
            cancel = self._fence(c, workflow_id, token, position, f"signal {name!r}")
            existing = self._entry_at(c, workflow_id, position)
            if existing is not None and existing.final:
                return Recorded(existing, written=False, cancel_requested=cancel)
            sig = c.one(
                "SELECT seq, payload FROM {sg} WHERE workflow_id = ? AND name = ? "
                f"AND consumed_pos IS NULL ORDER BY seq LIMIT 1{self.skip_locked}",
                (workflow_id, name),
            )
            if sig is None:
                return None
            c.run("UPDATE {sg} SET consumed_pos = ? WHERE seq = ?", (position, sig[0]))
            entry = Entry(
                position=position,
                kind="signal",
                name=name,
                status=EntryStatus.OK,
                result=bytes(sig[1]),
                started_at=existing.started_at if existing else now,
                finished_at=now,
                wake_at=existing.wake_at if existing else None,
                detail=f"signal #{sig[0]}",
            )
            self._upsert(c, workflow_id, entry)
        return Recorded(entry, written=True, cancel_requested=cancel)

    def suspend(
        self, workflow_id: str, token: int, *, wake_at: float, seen_wakeups: int, current_step: str
    ) -> None:
        now = self._now()
        with self._auto() as c:
            row = c.one(
                "UPDATE {wf} SET status = 'waiting', owner = NULL, lease_until = 0, "
                "wake_at = CASE WHEN wakeups <> ? THEN 0 ELSE ? END, current_step = ?, "
                "step_started_at = ?, updated_at = ? WHERE id = ? AND token = ?"
                + self._told("wake_at", when="wake_at <= updated_at"),
                (seen_wakeups, wake_at, current_step, now, now, workflow_id, token),
            )
            if row is None:
                raise self._fenced(c, workflow_id, token, "suspension")
            if float(row[0]) <= now:
                c.ring()  # woken while it parked: claimable at once

    def release(self, workflow_id: str, token: int) -> bool:
        with self._auto() as c:
            n = c.run(
                "UPDATE {wf} SET owner = NULL, lease_until = 0, updated_at = ? WHERE id = ? AND token = ? "
                f"AND status IN {_ACTIVE_SQL}" + self._told(),
                (self._now(), workflow_id, token),
            )
            if n > 0:
                c.ring()  # handed back: claimable at once
        return n > 0

    def set_compensating(self, workflow_id: str, token: int) -> None:
        with self._auto() as c:
            n = c.run(
                "UPDATE {wf} SET status = 'compensating', compensation = 'running', updated_at = ? "
                "WHERE id = ? AND token = ?",
                (self._now(), workflow_id, token),
            )
            if n == 0:
                raise self._fenced(c, workflow_id, token, "compensation start")

    def finish(
        self,
        workflow_id: str,
        token: int,
        status: WorkflowStatus,
        *,
        result: bytes | None = None,
        error: bytes | None = None,
        compensation: str = "",
    ) -> bool:
        now = self._now()
        guard = " AND cancel_requested = 0" if status == WorkflowStatus.SUCCEEDED else ""
        with self._tx() as c:
            row = c.one(
                "UPDATE {wf} SET status = ?, result = ?, error = ?, compensation = ?, owner = NULL, "
                "lease_until = 0, wake_at = 0, current_step = NULL, step_started_at = NULL, "
                f"finished_at = ?, updated_at = ? WHERE id = ? AND token = ?{guard} "
                "RETURNING parent_id, parent_pos",
                (status.value, result, error, compensation, now, now, workflow_id, token),
            )
            if row is None:
                if guard and c.one("SELECT 1 FROM {wf} WHERE id = ? AND token = ?", (workflow_id, token)):
                    return False  # a cancellation was requested first
                raise self._fenced(c, workflow_id, token, f"outcome ({status.value})")
            parent_id, parent_pos = row
            if parent_id is not None and parent_pos is not None:
                ok = status == WorkflowStatus.SUCCEEDED
                c.run(
                    "UPDATE {en} SET status = ?, result = ?, error = ?, finished_at = ? WHERE "
                    "workflow_id = ? AND pos = ? AND kind = 'child' AND detail = ? AND status = 'waiting'",
                    (
                        "ok" if ok else "error",
                        result if ok else None,
                        None if ok else error,
                        now,
                        parent_id,
                        parent_pos,
                        workflow_id,
                    ),
                )
                self._wake(c, [parent_id], now)
            c.ring()  # its result, and its parent
        return True

    def _wake(self, c: Cursor, ids: Sequence[str], now: float, *, cancel: bool = False) -> None:
        c.run(
            f"UPDATE {{wf}} SET wakeups = wakeups + 1, updated_at = ?, "
            f"{'cancel_requested = 1, ' if cancel else ''}"
            "wake_at = CASE WHEN status = 'waiting' THEN 0 ELSE wake_at END "
            f"WHERE id IN ({', '.join('?' * len(ids))}) AND status IN {_ACTIVE_SQL}",
            (now, *ids),
        )

    def _active_status(self, c: Cursor, workflow_id: str) -> str:
        row = c.one("SELECT status FROM {wf} WHERE id = ?", (workflow_id,))
        if row is None:
            raise NotFoundError(
                f"no workflow with id {workflow_id!r} in journal {self.shown}. "
                "Fix: check the id with `foundry workflows list`"
            )
        return str(row[0])

    def signal(self, workflow_id: str, name: str, payload: bytes) -> int:
        now = self._now()
        with self._tx() as c:
            status = self._active_status(c, workflow_id)
            if WorkflowStatus(status).finished:
                raise WorkflowFinishedError(
                    f"workflow {workflow_id!r} already finished ({status}); signal {name!r} was not "
                    "delivered and its journal is unchanged. Fix: signal a running workflow, or start a "
                    "new one"
                )
            row = c.one(
                "INSERT INTO {sg} (workflow_id, name, payload, sent_at) VALUES (?, ?, ?, ?) RETURNING seq",
                (workflow_id, name, payload, now),
            )
            self._wake(c, [workflow_id], now)
            c.ring()
        return int(row[0])

    def request_cancel(self, workflow_id: str) -> bool:
        now = self._now()
        with self._tx() as c:
            if WorkflowStatus(self._active_status(c, workflow_id)).finished:
                return False
            ids = [workflow_id]
            while ids:
                self._wake(c, ids, now, cancel=True)
                ids = [
                    r[0]
                    for r in c.all(
                        f"SELECT id FROM {{wf}} WHERE parent_id IN ({', '.join('?' * len(ids))}) "
                        f"AND status IN {_ACTIVE_SQL} AND cancel_requested = 0",
                        tuple(ids),
                    )
                ]
            c.ring()
        return True

    def get(self, workflow_id: str) -> WorkflowState | None:
        with self._auto() as c:
            row = c.one(f"SELECT {WF_COLS} FROM {{wf}} WHERE id = ?", (workflow_id,))
        return None if row is None else state_from_row(row)

    def workflows(
        self,
        *,
        status: str | None = None,
        name: str | None = None,
        parent_id: str | None = None,
        limit: int = 100,
    ) -> list[WorkflowState]:
        where: list[str] = []
        params: list[Any] = []
        for column, value in (("status", status), ("name", name), ("parent_id", parent_id)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        with self._auto() as c:
            rows = c.all(
                f"SELECT {WF_COLS} FROM {{wf}}{clause} ORDER BY created_at DESC, id LIMIT ?",
                (*params, limit),
            )
        return [state_from_row(r) for r in rows]

    def signals(self, workflow_id: str) -> list[SignalRecord]:
        with self._auto() as c:
            rows = c.all(
                "SELECT seq, workflow_id, name, payload, sent_at, consumed_pos FROM {sg} "
                "WHERE workflow_id = ? ORDER BY seq",
                (workflow_id,),
            )
        return [SignalRecord(int(r[0]), r[1], r[2], bytes(r[3]), float(r[4]), r[5]) for r in rows]

    def purge(self, finished_before: float) -> int:
        with self._tx() as c:
            ids = [
                r[0]
                for r in c.all(
                    "SELECT id FROM {wf} WHERE finished_at IS NOT NULL AND finished_at < ?",
                    (finished_before,),
                )
            ]
            for i in range(0, len(ids), 500):
                chunk = ids[i : i + 500]
                marks = ", ".join("?" * len(chunk))
                c.run(f"DELETE FROM {{en}} WHERE workflow_id IN ({marks})", chunk)
                c.run(f"DELETE FROM {{sg}} WHERE workflow_id IN ({marks})", chunk)
                c.run(f"DELETE FROM {{wf}} WHERE id IN ({marks})", chunk)
        return len(ids)

    def close(self) -> None:
        raise NotImplementedError


def parse_url(url: str) -> tuple[SplitResult, dict[str, list[str]], str, int]:
    """Split a journal URL into (parts, query, table prefix, pool size), checking both."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    prefix = query.get("prefix", ["foundry_"])[-1]
    if not prefix.replace("_", "").isalnum() or prefix[0].isdigit():
        raise ConfigError(
            f"journal URL {safe_url(url)!r}: prefix={prefix!r} must be letters, digits and _ (not "
            "starting with a digit). Fix: e.g. prefix=myapp_"
        )
    raw = query.get("pool", ["8"])[-1]
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(
            f"journal URL {safe_url(url)!r}: pool={raw!r} must be a whole number ≥ 1. Fix: e.g. pool=8"
        )
    return parts, query, prefix, int(raw)
