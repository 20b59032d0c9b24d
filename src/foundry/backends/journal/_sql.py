"""The journal's logic in portable SQL; ``sqlite.py`` and ``postgres.py`` supply the
connections, the DDL, the error mapping and the few statements that differ.

Statements are written with qmark placeholders (``?``) and ``{wf}``, ``{en}``, ``{sg}``
for the tables; an engine with another paramstyle gets them rewritten once (``_sql``,
from :class:`~foundry.backends._sql_common.SqlEngine`). Every write that belongs to a
run checks the run's lease token in the same transaction (the fence).

Every row read back goes through the typed decoders of ``_records``: a row that is not
a workflow's is set aside (the workflow ends failed, its reason naming the field) or
left out of a listing, never an exception that stops a claim for every other workflow.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, ClassVar
from urllib.parse import SplitResult

from foundry.backends._doorbell import Wakeups
from foundry.backends._pool import Pool
from foundry.backends._records import Fields
from foundry.backends._sql_common import PREFIX_SQL, SqlEngine, parse_sql_url, prefix_range
from foundry.backends.journal._records import (
    CLAIMS_MAX,
    ID_LIMIT,
    MAX_CRASHES,
    SUSPECT,
    TOKEN_MAX,
    WAKEUPS_MAX,
    check_new_workflow,
    crash_error,
    decode_claim,
    decode_entry,
    decode_signal,
    decode_state,
    set_aside_error,
)
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
    MalformedRecordError,
    NotFoundError,
    SubmitError,
    WorkflowFinishedError,
)

log = logging.getLogger("foundry.journal")

_HELD_WORTH_GIVING_BACK = 1.0  # seconds a transactional step held its row (see record_transactional)

WF_COLS = (
    "id, name, status, codec, args, result, error, parent_id, parent_pos, owner, token, lease_until, "
    "wake_at, cancel_requested, compensation, claims, "
    "(SELECT COALESCE(MAX(e.pos) + 1, 0) FROM {en} e WHERE e.workflow_id = {wf}.id), "
    "current_step, step_started_at, "
    "wakeups, created_at, updated_at, finished_at, deadline, published, origin"
)
CLAIM_COLS = (
    "id, name, token, lease_until, status, args, codec, parent_id, parent_pos, cancel_requested, "
    "wakeups, claims, alone, crashes, deadline, trace"
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
    finished_at {real},
    alone {bigint} NOT NULL DEFAULT 0,
    crashes INTEGER NOT NULL DEFAULT 0,
    deadline {real},
    published {blob},
    origin TEXT,
    trace TEXT -- the W3C trace context it was started in (foundry.tracecontext)
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

# Columns added after the first release, added to older tables when a journal opens
# (``alone``: 0, ``SUSPECT``, or the token of a run marked alone; ``crashes``: see
# ``MAX_CRASHES``; ``deadline``: the workflow's timeout as a time; ``published``: its
# queryable state; ``origin``: the run it was forked from; ``trace``: the W3C trace context it
# was started in).
ADDED_COLUMNS = (
    ("alone", "{bigint} NOT NULL DEFAULT 0"),
    ("crashes", "INTEGER NOT NULL DEFAULT 0"),
    ("deadline", "{real}"),
    ("published", "{blob}"),
    ("origin", "TEXT"),
    ("trace", "TEXT"),
)


def entry_params(workflow_id: str, e: Entry) -> tuple[Any, ...]:
    # ``kind`` and ``status`` as plain strings (the same text): sqlite3 binds a str subclass
    # such as EntryKind only after looking for an adapter, a protocol and ``__conform__``,
    # failed attribute lookups whose AttributeErrors cost more than the rest of the bind
    return (
        workflow_id,
        e.position,
        str(e.kind),
        e.name,
        str(e.status),
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
    # How a claim names a row: its id, or (SQLite) the rowid, since a row set aside may be
    # one whose id is what is broken (text that is not UTF-8 cannot be bound back).
    row_key: ClassVar[str] = "id"
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

    def _write(self, sql: str, params: Sequence[Any]) -> int:
        """One autocommit write that wakes nobody, on a pooled connection: its row count.
        What :meth:`_auto` does for it, without the session (a step's record takes this
        path, once per step)."""
        pool = self._pool
        conn = pool.acquire()
        try:
            n = conn.execute(self._sql(sql), params).rowcount
        except Exception as exc:
            pool.release(conn, check=True)
            self._raise_mapped(exc)
            raise
        pool.release(conn, check=False)
        return int(n)

    def _create_schema(self) -> None:
        """Create the tables and indexes if they are missing (idempotent, one transaction)."""
        text = DDL.format(wf=self.wf, en=self.entries, sg=self.sigs, **self.types)
        with self._tx() as c:
            self._prepare_schema(c)
            for statement in text.split(";"):
                if statement.strip():
                    c.conn.execute(statement)
            have = self._columns(c)
            for (
                name,
                kind,
            ) in ADDED_COLUMNS:  # to a table made by an older Foundry (ALTER locks it: only then)
                if name not in have:
                    c.conn.execute(f"ALTER TABLE {self.wf} ADD COLUMN {name} {kind.format(**self.types)}")

    def _prepare_schema(self, c: Cursor) -> None:
        """Engine hook run first in the schema transaction."""

    def _columns(self, c: Cursor) -> set[str]:
        """The columns the workflows table has (engine hook)."""
        raise NotImplementedError

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
        return Fields(workflow_id).flag("cancel_requested", row[0])

    def _entry_at(self, c: Cursor, workflow_id: str, position: int) -> Entry | None:
        row = c.one(
            f"SELECT {ENTRY_COLS} FROM {{en}} WHERE workflow_id = ? AND pos = ?", (workflow_id, position)
        )
        return None if row is None else decode_entry(workflow_id, row)

    def _upsert(self, c: Cursor, workflow_id: str, entry: Entry) -> bool:
        n = c.run(
            f"INSERT INTO {{en}} (workflow_id, {ENTRY_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            + ON_CONFLICT,
            entry_params(workflow_id, entry),
        )
        return n > 0

    # -- the contract ------------------------------------------------------------

    def start(self, wf: NewWorkflow, *, owner: str | None = None, lease: float = 30.0) -> Started:
        check_new_workflow(wf)
        now = self._now()
        claimed = owner is not None
        lease_until = now + lease if claimed else 0.0
        with self._auto() as c:
            created = self._insert(c, wf, now, owner, lease_until)
            if not created:
                row = c.one(f"SELECT {WF_COLS} FROM {{wf}} WHERE id = ?", (wf.id,))
                return Started(decode_state(row), created=False, claim=None)
            if not claimed:
                c.ring()  # a new claimable workflow: wake the workers
        return self._started(wf, now, owner, lease_until)

    def _insert(self, c: Cursor, wf: NewWorkflow, now: float, owner: str | None, lease_until: float) -> bool:
        """Insert the row of ``wf`` unless its id exists; whether it did."""
        claimed = owner is not None
        token, claims = (1, 1) if claimed else (0, 0)
        deadline = None if wf.timeout is None else now + wf.timeout
        return (
            c.run(
                "INSERT INTO {wf} (id, name, status, codec, args, parent_id, parent_pos, owner, token, "
                "lease_until, wake_at, cancel_requested, compensation, claims, wakeups, "
                "created_at, updated_at, deadline, origin, trace) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, '', ?, 0, ?, ?, ?, ?, ?) "
                "ON CONFLICT (id) DO NOTHING" + ("" if claimed else self._told()),
                (
                    wf.id,
                    wf.name,
                    "running" if claimed else "pending",
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
                    deadline,
                    wf.origin,
                    wf.trace,
                ),
            )
            > 0
        )

    def _started(self, wf: NewWorkflow, now: float, owner: str | None, lease_until: float) -> Started:
        """What ``start`` returns for the workflow it just created."""
        claimed = owner is not None
        token, claims = (1, 1) if claimed else (0, 0)
        status = "running" if claimed else "pending"
        deadline = None if wf.timeout is None else now + wf.timeout
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
            deadline=deadline,
            origin=wf.origin,
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
                deadline=deadline,
                trace=wf.trace,
            )
        return Started(state, created=True, claim=claim)

    # The counters stop short of their limits (``_records``): a counter someone set to the
    # database's maximum must not make the claim of every workflow fail with an overflow.
    # A claim that finds an owner still set finds a run that ended without an outcome: a
    # suspect (``alone`` = SUSPECT), and a crash if that run was marked alone (``alone`` =
    # its token). Every expression reads the row as it was before the claim.
    _CLAIM_SET = (
        f"SET owner = ?, token = CASE WHEN token < {TOKEN_MAX} THEN token + 1 ELSE token END, "
        f"lease_until = ?, claims = CASE WHEN claims < {CLAIMS_MAX} THEN claims + 1 ELSE claims END, "
        "wake_at = 0, status = CASE WHEN status IN ('pending', 'waiting') THEN 'running' ELSE status END, "
        "current_step = NULL, step_started_at = NULL, updated_at = ?, "
        f"crashes = CASE WHEN owner IS NOT NULL AND alone = token AND crashes < {CLAIMS_MAX} "
        "THEN crashes + 1 ELSE crashes END, "
        f"alone = CASE WHEN owner IS NOT NULL THEN {SUSPECT} ELSE 0 END "
    )

    def claim(
        self, owner: str, *, lease: float, limit: int = 1, names: Collection[str] | None = None
    ) -> list[Claim]:
        if limit <= 0 or (names is not None and not names):
            return []
        now = self._now()
        name_list = sorted(names) if names is not None else []
        name_sql = f" AND name IN ({', '.join('?' * len(name_list))})" if name_list else ""
        key = self.row_key
        with self._tx() as c:
            keys = [
                r[0]
                for r in c.all(
                    f"SELECT {key} FROM {{wf}} WHERE status IN {_ACTIVE_SQL} AND lease_until <= ? "
                    f"AND wake_at <= ?{name_sql} ORDER BY wake_at, created_at LIMIT ?{self.skip_locked}",
                    (now, now, *name_list, limit),
                )
            ]
            if not keys:
                return []
            rows = c.all(
                f"UPDATE {{wf}} {self._CLAIM_SET}WHERE {key} IN ({', '.join('?' * len(keys))}) "
                f"RETURNING {key}, {CLAIM_COLS}",
                (owner, now + lease, now, *keys),
            )
            order = {k: i for i, k in enumerate(keys)}
            claims: list[tuple[int, Claim]] = []
            for row in rows:
                try:
                    claim = decode_claim(row[1:])
                except MalformedRecordError as exc:  # set aside in this transaction; claim the rest
                    self._set_aside(c, row[0], set_aside_error(exc), now, str(exc))
                    continue
                if claim.crashes >= MAX_CRASHES:
                    self._set_aside(c, row[0], crash_error(claim), now, "it killed its worker")
                    continue
                claims.append((order.get(row[0], 0), claim))
        claims.sort(key=lambda pair: pair[0])
        return [claim for _, claim in claims]

    def claim_one(self, workflow_id: str, owner: str, *, lease: float) -> Claim | None:
        now = self._now()
        with self._auto() as c:
            row = c.one(
                f"UPDATE {{wf}} {self._CLAIM_SET}WHERE id = ? AND status IN {_ACTIVE_SQL} "
                f"AND lease_until <= ? AND wake_at <= ? RETURNING {self.row_key}, {CLAIM_COLS}",
                (owner, now + lease, now, workflow_id, now, now),
            )
        if row is None:
            return None
        try:
            claim = decode_claim(row[1:])
        except MalformedRecordError as exc:  # leased to us just now: nobody else writes it meanwhile
            error, why = set_aside_error(exc), str(exc)
        else:
            if claim.crashes < MAX_CRASHES:
                return claim
            error, why = crash_error(claim), "it killed its worker"
        with self._tx() as c:
            self._set_aside(c, row[0], error, now, why)
        return None

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
        return Beat(alive=True, cancel_requested=Fields(workflow_id).flag("cancel_requested", row[0]))

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
        state = decode_state(row)
        if not state.status.finished:  # a run replays them: each must be what Foundry wrote
            return state, [decode_entry(workflow_id, r) for r in rows]
        return state, self._readable(rows, lambda r: decode_entry(workflow_id, r), "its history")

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
                with self._user_view(c.conn):
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

    def _user_view(self, conn: Any) -> AbstractContextManager[Any]:
        """The connection as a transactional step sees it (the driver's defaults: an
        engine that reads the journal's own rows otherwise restores them here)."""
        return nullcontext()

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
            f = Fields(f"signal #{sig[0]!r} of {workflow_id}")
            seq = f.integer("seq", sig[0], low=1, high=2**63 - 1)
            payload = f.blob("payload", sig[1])
            c.run("UPDATE {sg} SET consumed_pos = ? WHERE seq = ?", (position, seq))
            entry = Entry(
                position=position,
                kind="signal",
                name=name,
                status=EntryStatus.OK,
                result=payload,
                started_at=existing.started_at if existing else now,
                finished_at=now,
                wake_at=existing.wake_at if existing else None,
                detail=f"signal #{seq}",
            )
            self._upsert(c, workflow_id, entry)
        return Recorded(entry, written=True, cancel_requested=cancel)

    def suspend(
        self, workflow_id: str, token: int, *, wake_at: float, seen_wakeups: int, current_step: str
    ) -> None:
        now = self._now()
        with self._auto() as c:
            # Never parked past its deadline: the claim that finds it then times it out.
            row = c.one(
                "UPDATE {wf} SET status = 'waiting', owner = NULL, lease_until = 0, crashes = 0, "
                "wake_at = CASE WHEN wakeups <> ? THEN 0 WHEN deadline IS NOT NULL AND deadline < ? "
                "THEN deadline ELSE ? END, current_step = ?, "
                "step_started_at = ?, updated_at = ? WHERE id = ? AND token = ?"
                + self._told("wake_at", when="wake_at <= updated_at"),
                (seen_wakeups, wake_at, wake_at, current_step, now, now, workflow_id, token),
            )
            if row is None:
                raise self._fenced(c, workflow_id, token, "suspension")
            if float(row[0]) <= now:
                c.ring()  # woken while it parked: claimable at once

    def mark_alone(self, workflow_id: str, token: int) -> bool:
        with self._auto() as c:
            n = c.run(
                "UPDATE {wf} SET alone = token WHERE id = ? AND token = ? AND owner IS NOT NULL "
                "AND status IN ('running', 'compensating')",
                (workflow_id, token),
            )
        return n > 0

    def release(self, workflow_id: str, token: int, *, suspect: bool = False) -> bool:
        # A suspect keeps its owner: the next claim still finds a run that ended without an
        # outcome (and, not marked alone, charges nobody).
        owner = "" if suspect else "owner = NULL, "
        with self._auto() as c:
            n = c.run(
                f"UPDATE {{wf}} SET {owner}lease_until = 0, updated_at = ? WHERE id = ? AND token = ? "
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

    def publish(self, workflow_id: str, token: int, state: bytes) -> None:
        with self._auto() as c:
            n = c.run(
                "UPDATE {wf} SET published = ?, updated_at = ? WHERE id = ? AND token = ?",
                (state, self._now(), workflow_id, token),
            )
            if n == 0:
                raise self._fenced(c, workflow_id, token, "published state")

    def fork(self, source_id: str, wf: NewWorkflow, *, upto: int) -> Started:
        check_new_workflow(wf)
        now = self._now()
        with self._tx() as c:
            if c.one("SELECT 1 FROM {wf} WHERE id = ?", (source_id,)) is None:
                raise NotFoundError(
                    f"no workflow with id {source_id!r} in journal {self.shown} to fork. "
                    "Fix: check the id with `foundry workflows list`"
                )
            if not self._insert(c, wf, now, None, 0.0):
                row = c.one(f"SELECT {WF_COLS} FROM {{wf}} WHERE id = ?", (wf.id,))
                return Started(decode_state(row), created=False, claim=None)
            c.run(
                f"INSERT INTO {{en}} (workflow_id, {ENTRY_COLS}) SELECT ?, {ENTRY_COLS} FROM {{en}} "
                "WHERE workflow_id = ? AND pos < ?",
                (wf.id, source_id, upto),
            )
            c.ring()  # a new claimable workflow: wake the workers
        return self._started(wf, now, None, 0.0)

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
                "RETURNING id, parent_id, parent_pos",
                (status.value, result, error, compensation, now, now, workflow_id, token),
            )
            if row is None:
                if guard and c.one("SELECT 1 FROM {wf} WHERE id = ? AND token = ?", (workflow_id, token)):
                    return False  # a cancellation was requested first
                raise self._fenced(c, workflow_id, token, f"outcome ({status.value})")
            self._resolve_parent(c, row, status == WorkflowStatus.SUCCEEDED, result, error, now)
            c.ring()  # its result, and its parent
        return True

    def _resolve_parent(
        self, c: Cursor, child: Sequence[Any], ok: bool, result: bytes | None, error: bytes | None, now: float
    ) -> None:
        """Resolve the waiting ``child`` entry of the parent of the workflow that just
        finished (``child``: its ``id, parent_id, parent_pos``) and wake the parent."""
        f = Fields(child[0])
        try:
            child_id = f.name("id", child[0], limit=ID_LIMIT)
            parent_id = f.optional_name("parent_id", child[1], limit=ID_LIMIT)
            parent_pos = f.optional_integer("parent_pos", child[2])
        except MalformedRecordError as exc:
            log.warning("journal %s: %s; no parent is told that this workflow finished", self.shown, exc)
            return
        if parent_id is None or parent_pos is None:
            return
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
                child_id,
            ),
        )
        self._wake(c, [parent_id], now)

    def _set_aside(self, c: Cursor, key: Any, error: bytes, now: float, why: str) -> None:
        """End the workflow at row ``key`` (``row_key``) failed with the error record
        ``error`` — the journal's dead letter — and resolve its parent's wait, in the
        caller's transaction; ``why`` is logged."""
        log.warning("journal %s: %s; the workflow is set aside (failed)", self.shown, why)
        row = c.one(
            "UPDATE {wf} SET status = 'failed', result = NULL, error = ?, owner = NULL, lease_until = 0, "
            "wake_at = 0, current_step = NULL, step_started_at = NULL, finished_at = ?, updated_at = ? "
            f"WHERE {self.row_key} = ? RETURNING id, parent_id, parent_pos",
            (error, now, now, key),
        )
        if row is not None:
            self._resolve_parent(c, row, False, None, error, now)
        c.ring()  # its submitter waits for its outcome

    def _readable(self, rows: list[Any], decode: Callable[[Any], Any], what: str) -> list[Any]:
        """The rows a reader only shows, decoded; a malformed one is left out with a warning
        naming it (one bad record must not hide the others)."""
        out = []
        for row in rows:
            try:
                out.append(decode(row))
            except MalformedRecordError as exc:
                log.warning("journal %s: %s; left out of %s", self.shown, exc, what)
        return out

    def _wake(self, c: Cursor, ids: Sequence[str], now: float, *, cancel: bool = False) -> None:
        c.run(
            f"UPDATE {{wf}} SET wakeups = CASE WHEN wakeups < {WAKEUPS_MAX} THEN wakeups + 1 "
            "ELSE wakeups END, updated_at = ?, "
            f"{'cancel_requested = 1, ' if cancel else ''}"
            "wake_at = CASE WHEN status = 'waiting' THEN 0 ELSE wake_at END "
            f"WHERE id IN ({', '.join('?' * len(ids))}) AND status IN {_ACTIVE_SQL}",
            (now, *ids),
        )

    def _active_status(self, c: Cursor, workflow_id: str) -> WorkflowStatus:
        row = c.one("SELECT status FROM {wf} WHERE id = ?", (workflow_id,))
        if row is None:
            raise NotFoundError(
                f"no workflow with id {workflow_id!r} in journal {self.shown}. "
                "Fix: check the id with `foundry workflows list`"
            )
        return Fields(workflow_id).member("status", row[0], WorkflowStatus, "a workflow status")

    def signal(self, workflow_id: str, name: str, payload: bytes) -> int:
        now = self._now()
        with self._tx() as c:
            status = self._active_status(c, workflow_id)
            if status.finished:
                raise WorkflowFinishedError(
                    f"workflow {workflow_id!r} already finished ({status.value}); signal {name!r} was not "
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
            if self._active_status(c, workflow_id).finished:
                return False
            ids = [workflow_id]
            while ids:
                self._wake(c, ids, now, cancel=True)
                ids = self._readable(
                    c.all(
                        f"SELECT id FROM {{wf}} WHERE parent_id IN ({', '.join('?' * len(ids))}) "
                        f"AND status IN {_ACTIVE_SQL} AND cancel_requested = 0",
                        tuple(ids),
                    ),
                    lambda r: Fields(r[0]).name("id", r[0], limit=ID_LIMIT),
                    "the cancellation (a child)",
                )
            c.ring()
        return True

    def ids_starting(self, prefix: str, limit: int = 10) -> list[str]:
        """Up to ``limit`` ids of workflows that begin with ``prefix``, in id order
        (``foundry workflows show`` of a short id): a range over the primary key."""
        if not prefix:
            return []
        with self._auto() as c:
            rows = c.all(
                f"SELECT id FROM {{wf}} WHERE {PREFIX_SQL} ORDER BY id LIMIT ?",
                (*prefix_range(prefix), limit),
            )
        return [row[0] for row in rows if isinstance(row[0], str) and row[0].startswith(prefix)]

    def get(self, workflow_id: str) -> WorkflowState | None:
        with self._auto() as c:
            row = c.one(f"SELECT {WF_COLS} FROM {{wf}} WHERE id = ?", (workflow_id,))
        return None if row is None else decode_state(row)

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
        return self._readable(rows, decode_state, "the listing")

    def signals(self, workflow_id: str) -> list[SignalRecord]:
        with self._auto() as c:
            rows = c.all(
                "SELECT seq, workflow_id, name, payload, sent_at, consumed_pos FROM {sg} "
                "WHERE workflow_id = ? ORDER BY seq",
                (workflow_id,),
            )
        return self._readable(rows, decode_signal, "the inbox")

    def purge(self, finished_before: float) -> int:
        # In SQL, not by the ids read back: an id someone damaged cannot be bound again.
        gone = "finished_at IS NOT NULL AND finished_at < ?"
        with self._tx() as c:
            for table in ("{en}", "{sg}"):
                c.run(
                    f"DELETE FROM {table} WHERE workflow_id IN (SELECT id FROM {{wf}} WHERE {gone})",
                    (finished_before,),
                )
            return c.run(f"DELETE FROM {{wf}} WHERE {gone}", (finished_before,))

    def close(self) -> None:
        raise NotImplementedError


def parse_url(url: str) -> tuple[SplitResult, dict[str, str], str, int]:
    """Split a journal URL into (parts, query options, table prefix, pool size), checking
    the prefix (:func:`~foundry.backends._sql_common.parse_sql_url`) and the pool size."""
    parts, query, prefix = parse_sql_url("journal", url)
    raw = query.get("pool", "8")
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(
            f"journal URL {safe_url(url)!r}: pool={raw!r} must be a whole number ≥ 1. Fix: e.g. pool=8"
        )
    return parts, query, prefix, int(raw)
