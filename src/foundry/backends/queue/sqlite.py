"""The embedded queue: one SQLite file (WAL), shared by every process on the machine.

URL: ``sqlite:///relative/queue.db`` or ``sqlite:////absolute/queue.db``; ``memory://``
is a private temporary file removed at ``close()`` (tests, demos). Query options:

* ``synchronous=normal|full`` — default ``normal``: a committed job survives the death
  of any process (SIGKILL included) but the last commits may be lost if the *machine*
  loses power; ``full`` survives power loss at the cost of an fsync per commit.
* ``busy_timeout=30`` — seconds a writer waits for another process's write lock.
* ``poll=2ms`` — without the doorbell (see *Wake-ups*), the longest pause between two
  looks for other processes' commits.
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
directly (a condition variable). Across processes, on Linux, a commit *rings* the other
waiting processes (:mod:`foundry.backends._doorbell`: a datagram to each one's
abstract-namespace socket, listed by marker files in ``<file>-wake/``), and the ring says
what moved, so only the waiters of that go and look:

* a commit that gives a queue new work (an enqueue, a retry, a job given back) rings
  **one** claimer — the first listener in a fixed order, so one worker process that
  keeps up takes everything, in batches, as if it were alone. A process whose claimer
  is not waiting holds the ring 10 ms: if its claimer comes back to ``claim`` meanwhile
  it looks at the queue itself, else the ring goes on to the next process (once to each
  at most). A claim that took all it asked for does the same for "there may be more".
  A claimer that nothing rang for since its last look takes only the jobs that have
  been due for that same 10 ms (``SqlQueue.unrung_age``): the fresh ones are the rung
  claimer's, so a second worker process that once took a batch does not go on polling
  and splitting the work into smaller claims, while a backlog that the rung worker
  leaves waiting reaches every claimer (and a job nobody rang for is never left).
  N worker processes do not all wake, look, and race for the write lock over every job;
* a job that ended rings the processes waiting for jobs' results, a cancel request the
  processes watching for cancels;
* a claim, a heartbeat, a progress note ring nobody (nobody waits for them).

The watcher thread of each process (it runs while somebody waits) turns rings into
wake-ups, and looks at ``PRAGMA data_version`` — it changes only when *another*
process committed — for a commit nobody rang for (another tool's; a ring dropped from a
full socket is noticed by its receiver, which then wakes everyone) when nothing rang for
0.5 s, or ``poll`` if longer (every waiter re-reads the store within a second anyway).
Where there is no doorbell the watcher polls every ``poll`` (0.5 ms after activity,
backing off). So ``capabilities.notify`` stays ``False``: the database is the truth,
the bell a hint. A ring for new work reaches only the claimers of *that* queue.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
import select
import socket
import sqlite3
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar, TypeVar

from foundry.backends._doorbell import EVERYTHING, QUEUE_LIMIT, Doorbell, supported
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


_RING_MOST = 8192  # bytes of topics a ring carries; past that it says "look at everything"
_ONE = b">"  # a ring for one claimer: b">HOPS\0topics"; passed on by a process with none waiting
# With the bell, the look for commits nobody rang for (another tool's; a ring dropped from
# a full socket is noticed by its receiver) comes this often at most: a ring meant for one
# claimer leaves the others quiet while the file changes, and each look that saw a change
# would wake every waiter of the process — the herd the rings avoid.
_UNRUNG = 0.5
# A ring for one claimer that finds this process's claimers busy is held this long: if one
# of them comes back to ``claim`` meanwhile (a worker that is full for a moment), it
# looks at the queue itself and the ring goes no further; else it is passed on. So one
# worker that keeps up takes the work in batches, and a worker full of long jobs delays
# a new job by this much at most.
_HOLD = 0.01


@functools.lru_cache(maxsize=1024)
def _kind(topic: str | None) -> str:
    """The doorbell kind of a topic: one queue's claimers (``q`` and a digest of its
    name: new work on one queue never wakes another's workers), a job's waiters (``j``),
    the rest (``c``: cancel requests); ``""`` for a waiter of everything."""
    if topic is None:
        return ""
    if topic.startswith("queue:"):
        return "q" + hashlib.sha256(topic.encode()).hexdigest()[:12]
    return "j" if topic.startswith("job:") else "c"


class _Op:
    __slots__ = ("done", "error", "fn", "topics", "value")

    def __init__(self, fn: Callable[[sqlite3.Connection], Any], precise: bool) -> None:
        self.fn = fn
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None
        # what the other processes must hear of it: the topics it moved (``note``), or
        # ``None``: unknown, so a change rings everyone
        self.topics: list[str] | None = [] if precise else None


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
        self._current: _Op | None = None  # the op running in the transaction (``note``)
        self._conn: sqlite3.Connection | None = None
        self._version = -1
        self._waiting = 0
        self._watch_lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        self._kinds: set[str] = set()  # the kinds of rings listened to (while the watcher runs)
        self._entered: dict[str, float] = {}  # queue topic -> when a claim last began here (monotonic)
        # rings for one claimer to pass on unless a claimer here comes back: (since, hops, topics);
        # appended by the watcher and by ``more`` (a deque: two threads), popped by the watcher
        self._held: deque[tuple[float, int, bytes]] = deque()
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

    def write(self, fn: Callable[[sqlite3.Connection], T], *, precise: bool = False) -> T:
        """Run ``fn(conn)`` in the next combined transaction. ``precise``: ``fn`` says
        what other processes must hear of it by calling :meth:`note` (a write that
        notes nothing rings nobody); otherwise any change rings every listener."""
        op = _Op(fn, precise)
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

    def note(self, topics: Sequence[str]) -> None:
        """Inside a write: other processes' waiters of ``topics`` must hear of it."""
        op = self._current
        if op is not None and op.topics is not None:
            op.topics.extend(topics)

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
                self._current = op
                if len(batch) == 1:
                    op.value = op.fn(conn)
                    continue
                conn.execute("SAVEPOINT op")
                try:
                    op.value = op.fn(conn)
                except Exception as exc:
                    conn.execute("ROLLBACK TO op")
                    op.error = exc
                    if op.topics is not None:
                        op.topics.clear()
                conn.execute("RELEASE op")
            self._current = None
            conn.execute("COMMIT")
            if self.bell is not None and conn.total_changes != before:
                self._ring(self.bell, batch)
        except BaseException as exc:
            self._current = None
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            for op in batch:
                op.error, op.value = exc, None
        for op in batch:
            op.done = True

    @staticmethod
    def _ring(bell: Doorbell, batch: list[_Op]) -> None:
        """After a commit that changed something: ring the listeners of the topics it
        moved, with those topics; everyone when an op did not say what it moved."""
        if any(op.topics is None for op in batch):
            bell.ring()
            return
        topics = sorted({t for op in batch for t in op.topics or ()})
        if not topics:
            return  # a claim, a heartbeat, a completion nobody waits for...: nobody to wake
        kinds = {_kind(t) for t in topics}
        message = "\0".join(topics).encode()
        if len(message) > _RING_MOST:
            bell.ring(EVERYTHING, kinds)
        elif len(kinds) == 1 and topics[0].startswith("queue:"):  # new work on one queue: one
            _File._ring_one(bell, _kind(topics[0]), message)  # claimer is enough (it passes it on when busy)
        else:
            bell.ring(message, kinds)

    @staticmethod
    def _ring_one(bell: Doorbell, kind: str, message: bytes, hops: int | None = None) -> None:
        """Ring one claimer of ``kind``; it may pass the ring on ``hops`` times (by default
        once to each other claimer)."""

        def make(listeners: int) -> bytes:
            return _ONE + b"%d\0" % max(0, listeners - 1 if hops is None else hops) + message

        bell.ring(make, {kind}, one=kind)

    def more(self, topic: str) -> None:
        """A claim took all it asked for and more may be there: unless this process's
        claimer comes back for it within ``_HOLD`` (a worker that keeps up), wake a
        claimer in another process (a burst spreads over the workers that have room)."""
        if self.bell is not None:
            self._held.append((time.monotonic(), -1, topic.encode()))  # -1: once to each other claimer

    # -- the watcher of other processes ----------------------------------------------

    @contextmanager
    def watching(self, topic: str | None = None) -> Iterator[None]:
        """Held while a caller waits for ``topic`` (``None``: for anything): the watcher
        runs, listening to the rings of its kind."""
        new = False
        with self._watch_lock:
            self._waiting += 1
            if self._watcher is None and not self._stop.is_set():
                self._watcher = threading.Thread(
                    target=self._watch_loop, name="foundry-queue-watch", daemon=True
                )
                self._watcher.start()
            kind = _kind(topic)
            if topic is not None and topic.startswith("queue:"):
                self._entered[topic] = time.monotonic()
            if self.bell is not None and not self._stop.is_set() and kind not in self._kinds:
                self._kinds.add(kind)
                new = self.bell.listen(kind) is not None
        if new and self.bell is not None:
            self.bell.nudge()  # (outside the lock) the watcher waits on the sockets it knew: show it this one
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

    def _watch_loop(self) -> None:
        """Wake this process's waiters on the other processes' commits: at once for a
        ring (only the waiters of the topics it names), and on ``PRAGMA data_version``
        having moved — a commit nobody rang for — when nothing rang for ``_UNRUNG``
        seconds (or ``poll``, the longer), or every ``poll`` at most without the bell."""
        interval = 0.0005
        idle_since = time.monotonic()
        while not self._stop.is_set():
            with self._watch_lock:
                if self._waiting == 0 and time.monotonic() - idle_since > 2.0:
                    if self.bell is not None:
                        self.bell.stop_listening()
                    self._kinds.clear()
                    self._watcher = None
                    return
            if self._waiting:
                idle_since = time.monotonic()
            sockets = self.bell.sockets() if self.bell is not None else []
            if sockets:
                wait = max(self.poll, _UNRUNG)
                if self._held:
                    wait = max(0.0, min(wait, self._held[0][0] + _HOLD - time.monotonic()))
                ready = select.select(sockets, [], [], wait)[0]
                if ready:
                    self._heard(ready)
                if self._held:
                    self._pass_on()
                if ready or self._held:
                    continue
            try:
                changed = self._foreign_commits()
            except sqlite3.Error:
                changed = True
            if changed:
                self.signals.bump_all()
            if not sockets:
                interval = 0.0005 if changed else min(interval * 1.5, self.poll)
                self._stop.wait(interval)

    def _heard(self, ready: list[socket.socket]) -> None:
        """Wake the waiters of what the rings received name (everyone for a ring that
        names nothing, or when a socket was full and may have dropped one)."""
        bell = self.bell
        assert bell is not None
        topics: set[str] = set()
        forward: list[tuple[int, bytes]] = []  # rings for one claimer, to pass on if none waits here
        everything = False
        for sock in ready:
            got = bell.receive(sock)
            everything = everything or len(got) >= QUEUE_LIMIT
            for message in got:
                if message == EVERYTHING:
                    everything = True
                    continue
                if message.startswith(_ONE):
                    head, _, message = message.partition(b"\0")
                    with contextlib.suppress(ValueError):
                        forward.append((int(head[1:]), message))
                topics.update(t for t in message.decode(errors="replace").split("\0") if t)
        waited = {t for t in topics if self.signals.waiting(t)}  # before the bump: its waiters leave
        if everything:
            self.signals.bump_all()
        elif topics:
            self.signals.bump(*topics)
        now = time.monotonic()
        for hops, message in forward:
            wanted = [t for t in message.decode(errors="replace").split("\0") if t]
            if hops > 0 and not any(t in waited for t in wanted):
                self._held.append((now, hops, message))

    def _pass_on(self) -> None:
        """Pass on the held rings for one claimer whose time is up and that no claimer
        of this process has come back for."""
        bell = self.bell
        now = time.monotonic()
        while self._held and self._held[0][0] + _HOLD <= now:
            heard, hops, message = self._held.popleft()
            wanted = [t for t in message.decode(errors="replace").split("\0") if t]
            if (
                bell is not None
                and wanted
                and not any(self._entered.get(t, -math.inf) > heard for t in wanted)
            ):
                self._ring_one(bell, _kind(wanted[0]), message, None if hops < 0 else hops - 1)

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
    unrung_age: ClassVar[float] = _HOLD if supported() else 0.0  # (without the bell every claimer polls)

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
        return self._file.write(fn, precise=True)  # every write here says what it moved (_notify)

    def _notify(self, conn: Any, topics: Sequence[str]) -> None:
        self._file.note(topics)

    def _more(self, topic: str) -> None:
        self._file.more(topic)

    def _watch(self, topic: str | None = None) -> AbstractContextManager[None]:
        return self._file.watching(topic)

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
