"""The embedded queue: one SQLite file (WAL), shared by every process on the machine.

URL: ``sqlite:///relative/queue.db`` or ``sqlite:////absolute/queue.db``; ``memory://``
is a private temporary file removed at ``close()`` (tests, demos). Query options:

* ``synchronous=normal|full`` — default ``normal``: a committed job survives the death
  of any process (SIGKILL included) but the last commits may be lost if the *machine*
  loses power; ``full`` survives power loss at the cost of an fsync per commit.
* ``busy_timeout=30`` — seconds a writer waits for another process's write lock.
* ``poll=2ms`` — the longest pause between two looks for other processes' commits.
* ``pool=8`` — read connections per process; ``prefix=foundry_`` — table name prefix.

**Batched commits.** SQLite has one writer at a time. Inside a process every write
goes through one combining writer: the writes that arrive while a transaction commits
(enqueues from several threads, completions from a worker's threads, claims) are
applied in the *next single transaction*, each caller returning only after that
commit. Nobody's write waits on a busy loop in-process, and the cost of a commit is
shared by everyone in the batch. Across processes, a writer that finds the lock taken
retries every 0.1 ms at most (SQLite's own busy handler sleeps whole
milliseconds and would dominate the latency).

**Wake-ups.** SQLite has no notification. In one process a commit wakes the waiters
directly (a condition variable). Across processes, one thread per process watches
``PRAGMA data_version`` on the writer connection — it changes only when *another*
process committed — while somebody waits (it stops when nobody does). On Linux a
commit that changed something also *rings* the other waiting processes
(:mod:`foundry.backends._doorbell`: a datagram to each one's abstract-namespace
socket, listed by marker files in ``<file>-wake/``), so a hand-off between processes
takes a fraction of a millisecond; the poll (0.5 ms after activity, backing off to
``poll`` when idle) stays as the safety net and is all there is elsewhere. So
``capabilities.notify`` stays ``False``: the database is the truth, the bell a hint.
"""

from __future__ import annotations

import os
import select
import socket
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar, TypeVar

from foundry.backends._doorbell import Doorbell, supported
from foundry.backends._sql_common import (
    make_pool,
    parse_sql_url,
    sqlite_connect,
    sqlite_contended,
    sqlite_error,
    sqlite_file,
    storage_error,
)
from foundry.backends._urls import seconds_option
from foundry.backends.queue._common import Signals
from foundry.backends.queue._sql import (
    ADDED_COLUMNS,
    INSERT_COLS,
    SqlQueue,
    insert_params,
)
from foundry.backends.queue.base import Capabilities, Enqueued, NewJob
from foundry.config import safe_url
from foundry.errors import BackendError, BackendUnavailableError, ConfigError

__all__ = ["SqliteQueue"]

T = TypeVar("T")

_BLOB_CHUNKED = 1 << 20  # payloads of this many bytes or more are written in chunks of this size
_INSERT_ZEROBLOB = (  # the payload's place, reserved: zeroblob(n) takes no memory
    f"INSERT INTO {{jobs}} ({INSERT_COLS}) VALUES (?, ?, ?, zeroblob(?), "
    + ", ".join("?" * (len(INSERT_COLS.split(",")) - 4))
    + ") ON CONFLICT DO NOTHING"
)
_DDL = """
CREATE TABLE IF NOT EXISTS {jobs} (
    seq INTEGER PRIMARY KEY, -- the rowid: FIFO among live jobs (no AUTOINCREMENT: it costs a page per commit)
    id TEXT NOT NULL UNIQUE,
    queue TEXT NOT NULL,
    unit TEXT NOT NULL,
    codec TEXT NOT NULL,
    key TEXT,
    priority INTEGER NOT NULL,
    eta REAL NOT NULL,
    status TEXT NOT NULL,
    token TEXT,
    worker TEXT,
    lease_until REAL NOT NULL,
    deliveries INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    max_retries INTEGER NOT NULL,
    max_deliveries INTEGER NOT NULL,
    timeout REAL,
    result BLOB,
    error BLOB,
    dead_reason TEXT,
    result_ttl REAL NOT NULL,
    enqueued_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    expires_at REAL,
    crashes INTEGER NOT NULL DEFAULT 0, -- lapses charged to the job: it ran alone (see base.py)
    alone TEXT, -- the token of the delivery its worker marked as running alone
    cancel_at REAL, -- a cancel was requested while it ran: every end of that delivery is 'cancelled'
    progress TEXT, -- the last JobProgress its deliveries recorded (JSON)
    trace TEXT, -- the W3C trace context it was submitted in (foundry.tracecontext)
    payload BLOB NOT NULL -- last: an insert can reserve it (zeroblob) and write it in chunks
);
CREATE UNIQUE INDEX IF NOT EXISTS {jobs}_key ON {jobs} (key) WHERE key IS NOT NULL;
CREATE INDEX IF NOT EXISTS {jobs}_ready ON {jobs} (queue, priority DESC, eta, seq) WHERE status = 'queued';
CREATE INDEX IF NOT EXISTS {jobs}_leased ON {jobs} (queue, lease_until) WHERE status = 'running';
CREATE INDEX IF NOT EXISTS {jobs}_dead ON {jobs} (queue, finished_at) WHERE status = 'dead';
CREATE INDEX IF NOT EXISTS {jobs}_expires ON {jobs} (expires_at) WHERE expires_at IS NOT NULL
"""

_BATCH = 256  # most writes combined into one transaction
_CHECKPOINT_BYTES = 4 << 20  # the WAL size at which the background checkpointer copies it back


class _Op:
    __slots__ = ("done", "error", "fn", "value")

    def __init__(self, fn: Callable[[sqlite3.Connection], Any]) -> None:
        self.fn = fn
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None


class _File:
    """What the processes' instances on one file share: the combining writer (its
    connection and lock), the wake-ups, and the watcher of other processes' commits."""

    def __init__(self, path: str, synchronous: str, busy_timeout: float, poll: float) -> None:
        self.path = path
        self.synchronous = synchronous
        self.busy_timeout = busy_timeout
        self.poll = poll
        self.refs = 0
        self.signals = Signals()
        self._lock = threading.Lock()  # held while a transaction runs
        self._pending: list[_Op] = []
        self._pending_lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._version = -1
        self._waiting = 0
        self._watch_lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()
        self._checkpointer: threading.Thread | None = None
        self.bell = Doorbell(path) if supported() else None

    # -- connections -------------------------------------------------------------

    def connect(self, timeout: float) -> sqlite3.Connection:
        try:
            conn = sqlite_connect(self.path, timeout=timeout, synchronous=self.synchronous)
        except sqlite3.Error as exc:
            what = f"queue sqlite:///{self.path}"
            raise storage_error(exc, what, self.path) or BackendUnavailableError(
                f"{what}: cannot open the file ({exc}). Fix: check the path and its permissions"
            ) from exc
        try:
            conn.execute("PRAGMA wal_autocheckpoint=0")  # the checkpointer thread does it, off the hot path
        except BaseException:
            conn.close()
            raise
        return conn

    def _writer(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = self.connect(timeout=0.0)
            self._checkpointer = threading.Thread(
                target=self._checkpoint, name="foundry-queue-checkpoint", daemon=True
            )
            self._checkpointer.start()
        return self._conn

    def _checkpoint(self) -> None:
        """Copy the WAL back into the database in the background (a PASSIVE checkpoint
        never blocks readers or writers), so no commit pays for a checkpoint and its
        fsync. Every process that writes runs one; they take turns."""
        conn: sqlite3.Connection | None = None
        wal = self.path + "-wal"
        try:
            while not self._stop.wait(0.05):
                try:
                    size = os.stat(wal).st_size
                except OSError:
                    continue
                if size < _CHECKPOINT_BYTES:
                    continue
                try:
                    if conn is None:
                        conn = self.connect(timeout=0.0)
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error:
                    continue  # another process is checkpointing: its turn
        finally:
            if conn is not None:
                conn.close()

    # -- the combining writer ------------------------------------------------------

    def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        op = _Op(fn)
        with self._pending_lock:
            self._pending.append(op)
        with self._lock:
            if not op.done:
                with self._pending_lock:
                    batch, self._pending = self._pending[:_BATCH], self._pending[_BATCH:]
                if op not in batch:  # pragma: no cover - only with more than _BATCH writers
                    batch.append(op)
                    self._pending.remove(op)
                self._transaction(batch)
        if op.error is not None:
            raise op.error
        return op.value  # type: ignore[no-any-return]

    def _begin(self, conn: sqlite3.Connection) -> None:
        deadline = time.monotonic() + self.busy_timeout
        pause = 0.00002
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not sqlite_contended(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.0001)

    def _transaction(self, batch: list[_Op]) -> None:
        try:
            conn = self._writer()
            self._begin(conn)
        except BaseException as exc:
            for op in batch:
                op.error, op.done = exc, True
            return
        before = conn.total_changes
        try:
            for op in batch:
                if len(batch) == 1:
                    op.value = op.fn(conn)
                    continue
                conn.execute("SAVEPOINT op")
                try:
                    op.value = op.fn(conn)
                except Exception as exc:
                    conn.execute("ROLLBACK TO op")
                    op.error = exc
                conn.execute("RELEASE op")
            conn.execute("COMMIT")
            if self.bell is not None and conn.total_changes != before:
                self.bell.ring()
        except BaseException as exc:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            for op in batch:
                op.error, op.value = exc, None
        for op in batch:
            op.done = True

    # -- the watcher of other processes ----------------------------------------------

    @contextmanager
    def watching(self) -> Iterator[None]:
        with self._watch_lock:
            self._waiting += 1
            if self._watcher is None and not self._stop.is_set():
                self._watcher = threading.Thread(target=self._watch, name="foundry-queue-watch", daemon=True)
                self._watcher.start()
        try:
            yield
        finally:
            with self._watch_lock:
                self._waiting -= 1

    def _foreign_commits(self) -> bool:
        """Whether another process committed since the last look (our own writer's
        ``data_version`` moves only for other connections' commits)."""
        if not self._lock.acquire(blocking=False):
            return False  # our own writer is busy: we are active anyway, look next time
        try:
            version = int(self._writer().execute("PRAGMA data_version").fetchone()[0])
        finally:
            self._lock.release()
        changed = self._version >= 0 and version != self._version
        self._version = version
        return changed

    def _watch(self) -> None:
        bell = self.bell.listen() if self.bell is not None else None
        try:
            self._watch_loop(bell)
        finally:
            if self.bell is not None:
                self.bell.stop_listening()

    def _watch_loop(self, bell: socket.socket | None) -> None:
        interval = 0.0005
        idle_since = time.monotonic()
        while not self._stop.is_set():
            with self._watch_lock:
                if self._waiting == 0 and time.monotonic() - idle_since > 2.0:
                    self._watcher = None
                    return
            if self._waiting:
                idle_since = time.monotonic()
            try:
                changed = self._foreign_commits()
            except sqlite3.Error:
                changed = True
            if changed:
                self.signals.bump_all()
                interval = 0.0005
            else:
                interval = min(interval * 1.5, self.poll)
            if bell is not None:
                interval = self.poll  # the bell wakes us; the poll is only the safety net
            if bell is None:
                self._stop.wait(interval)
            elif select.select([bell], [], [], interval)[0] and self.bell is not None:
                self.bell.drain()  # another process committed: look now

    def close(self) -> None:
        self._stop.set()
        if self.bell is not None:
            self.bell.nudge()  # the watcher may sleep in select() for up to ``poll``
        for thread in (self._watcher, self._checkpointer):
            if thread is not None:
                thread.join(5.0)
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if self.bell is not None:
                self.bell.close()


_FILES: dict[str, _File] = {}
_FILES_LOCK = threading.Lock()


def _acquire(path: str, synchronous: str, busy_timeout: float, poll: float) -> _File:
    with _FILES_LOCK:
        shared = _FILES.get(path)
        if shared is None:
            shared = _FILES[path] = _File(path, synchronous, busy_timeout, poll)
        shared.refs += 1
        return shared


def _release(shared: _File) -> None:
    with _FILES_LOCK:
        shared.refs -= 1
        if shared.refs > 0:
            return
        if _FILES.get(shared.path) is shared:
            del _FILES[shared.path]
    shared.close()


class SqliteQueue(SqlQueue):
    """The embedded default queue backend (see the module docstring)."""

    capabilities: ClassVar[Capabilities] = Capabilities(
        notify=False, priority=True, cross_process_results=True
    )

    def __init__(self, url: str) -> None:
        parts, query, prefix = parse_sql_url("queue", url, ("synchronous", "busy_timeout", "poll", "pool"))
        super().__init__(url, prefix=prefix)
        self._temporary = parts.scheme == "memory"
        if self._temporary:
            fd, path = tempfile.mkstemp(prefix="foundry-queue-", suffix=".db")
            os.close(fd)
        else:
            path = sqlite_file(url, "queue")
        self.path = os.path.realpath(path)
        synchronous = query.get("synchronous", "normal").upper()
        if synchronous not in ("NORMAL", "FULL", "EXTRA"):
            raise ConfigError(
                f"queue URL {safe_url(url)!r}: synchronous={synchronous.lower()!r} is not a SQLite setting. "
                "Fix: use synchronous=normal (default) or synchronous=full"
            )
        busy = seconds_option("queue", url, query, "busy_timeout", 30.0)
        poll = seconds_option("queue", url, query, "poll", 0.002)
        size = int(seconds_option("queue", url, query, "pool", 8))
        self._file = _acquire(self.path, synchronous, busy, poll)
        self.signals = self._file.signals
        self._pool = make_pool(
            lambda: self._file.connect(timeout=busy), size=size, what=f"queue {safe_url(url)}"
        )
        try:
            with self._errors():
                # A file made before the payload moved to the end (or given columns since,
                # which go after it) cannot take it in chunks: a reserved blob followed by
                # other data is materialised in the row at once.
                self._chunked_payload = self._write(self._create)
        except BaseException:
            self.close()
            raise

    def _create(self, conn: sqlite3.Connection) -> bool:
        """The table and its indexes; the columns added since are added to an older table.
        Whether the payload is the table's last column (then large ones go in chunks)."""
        for statement in _DDL.replace("{jobs}", self.table).split(";"):
            if statement.strip():
                conn.execute(statement)
        have = {row[1] for row in conn.execute(f"PRAGMA table_info({self.table})")}
        for name, kind in ADDED_COLUMNS:
            if name not in have:
                conn.execute(f"ALTER TABLE {self.table} ADD COLUMN {name} {kind}")
        columns = conn.execute(f"PRAGMA table_info({self.table})").fetchall()
        return bool(columns) and columns[-1][1] == "payload"

    def _insert(self, conn: Any, job: NewJob, now: float) -> Enqueued:
        """A large payload is written into the new row in chunks (``blobopen``) after
        ``zeroblob(n)`` reserved its place (the last column, so the reservation costs no
        memory): binding it as a parameter would copy it twice (the binding, then the
        row's record)."""
        size = len(job.payload)
        if size < _BLOB_CHUNKED or not self._chunked_payload:
            return super()._insert(conn, job, now)
        params = insert_params(job, now)
        cursor = conn.execute(
            _INSERT_ZEROBLOB.replace("{jobs}", self.table), (*params[:3], size, *params[4:])
        )
        if cursor.rowcount <= 0:
            return self._existing(conn, job)
        view = memoryview(job.payload).cast("B")
        with conn.blobopen(self.table, "payload", cursor.lastrowid) as blob:
            for at in range(0, size, _BLOB_CHUNKED):
                blob.write(view[at : at + _BLOB_CHUNKED])
        return Enqueued(job.id, True)

    def _read(self) -> AbstractContextManager[sqlite3.Connection]:
        return self._pool.connection()

    def _write(self, fn: Callable[[Any], T]) -> T:
        if self._closed:
            raise BackendError(f"queue {self.shown} is closed. Fix: do not use a queue backend after close()")
        return self._file.write(fn)

    def _watch(self) -> AbstractContextManager[None]:
        return self._file.watching()

    def _translate(self, exc: Exception) -> Exception | None:
        return sqlite_error(
            exc,
            f"queue {self.shown}",
            busy=True,
            fix="another process holds the write lock for long; raise ?busy_timeout= or find the long "
            "transaction",
            path=self.path,
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.signals.bump_all()
        self._pool.close()
        _release(self._file)
        if self._temporary:
            if self._file.bell is not None:
                self._file.bell.remove()
            for suffix in ("", "-wal", "-shm"):
                try:
                    os.unlink(self.path + suffix)
                except FileNotFoundError:
                    pass
