"""The embedded event log: one SQLite file (WAL), shared by every process on the host.

URL: ``sqlite:///relative/stream.db`` or ``sqlite:////absolute/stream.db``; query options
``synchronous=normal|full`` (default ``normal``: an append survives a process crash;
``full`` also survives power loss at the cost of an fsync per commit) and ``poll=`` (the
longest pause of a waiting reader between two looks at the file, see below). ``memory://``
is a private temporary file, removed at close (tests, demos).

Layout (format 2, see :func:`open_schema` and docs/streams.md): events are rows keyed
``(sid, partition, offset)`` in one clustered b-tree (``WITHOUT ROWID``; ``sid`` is the
stream's integer id), so an append is one insert and a read is one range scan; the
publish dedup lookup is an index on ``(sid, id)`` of the same rows, and ``fs_dedup`` holds
only the ids that retention removed inside their dedup window. A group
keeps per partition ``committed`` and ``delivered``; the pending window
``(committed, delivered]`` is stored as a few *ranges* that share a delivery count and a
deadline (one row per batch, not one per event). Appends of a batch commit in one
transaction; timestamps are kept non-decreasing per partition so that age retention
and time seeks can binary-search offsets.

SQLite has one writer at a time. Reads that hand out events write too (the pending
range), so many consumers of one file contend for that lock: a single host, a few
thousand batches per second. For more, use NATS or Redis.

**Wake-ups.** A reader waiting for events sleeps until a commit may have given it
something: an append, a commit or dead letter that clears a pending window, a seek; or
until the oldest pending range is due for redelivery. In one process that commit wakes it directly.
Across processes, on Linux, the commit *rings* the waiting processes
(:mod:`foundry.backends._doorbell`: a datagram to each one listening on the file, listed
by marker files in ``<file>-wake/``), so a consumer in another process than the
publisher sees an event at once; the reader still looks again every ``poll`` (default
1 s) in case a ring was lost. Where the doorbell cannot work (other systems) the poll is
all there is and defaults to 20 ms.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, NoReturn
from urllib.parse import parse_qs, urlsplit

from foundry.backends._doorbell import Wakeups
from foundry.backends._sql_common import sqlite_connect
from foundry.backends._urls import ShowsUrl
from foundry.backends.stream._common import AppendInThread, CheckedRead, event_letter, gap_letter
from foundry.backends.stream.base import (
    Appended,
    Capabilities,
    DeadLetter,
    Event,
    MalformedEntryError,
    NewEvent,
    PartitionLag,
    Start,
    StreamConfig,
    StreamInfo,
    check_name,
    check_partition,
    derived_id,
    malformed_event,
    partition_for,
    partitions_changed,
    resolve_start,
    unknown_group,
    unknown_stream,
)
from foundry.config import safe_url
from foundry.errors import BackendError, BackendUnavailableError, ConfigError, DeclarationError
from foundry.tracecontext import parse_trace
from foundry.traits import parse_duration

__all__ = ["SqliteStreamBackend", "decode_row"]

FORMAT = 2
"""The log's format, kept in ``fs_meta`` (see :func:`open_schema`). 1: events and their
dedup rows keyed by the stream's name (Foundry before 2026-12-07); 2: keyed by the
stream's integer ``sid``, the dedup lookup an index on the events, ``fs_dedup`` only the
ids retention removed inside their dedup window."""

_TABLES = """
CREATE TABLE IF NOT EXISTS fs_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS fs_streams (
    sid INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL UNIQUE, partitions INTEGER NOT NULL,
    max_age REAL, max_events INTEGER, max_bytes INTEGER, dedup_window REAL NOT NULL, created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS fs_parts (
    stream TEXT NOT NULL, part INTEGER NOT NULL, first INTEGER NOT NULL, last INTEGER NOT NULL,
    cum INTEGER NOT NULL, last_ts REAL NOT NULL, PRIMARY KEY (stream, part)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fs_events (
    sid INTEGER NOT NULL, part INTEGER NOT NULL, off INTEGER NOT NULL, id TEXT NOT NULL,
    key TEXT, ts REAL NOT NULL, cum INTEGER NOT NULL, payload BLOB NOT NULL,
    trace TEXT, -- the W3C trace context it was published in (foundry.tracecontext)
    PRIMARY KEY (sid, part, off)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fs_dedup (
    sid INTEGER NOT NULL, id TEXT NOT NULL, part INTEGER NOT NULL, off INTEGER NOT NULL,
    ts REAL NOT NULL, PRIMARY KEY (sid, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fs_groups (
    stream TEXT NOT NULL, grp TEXT NOT NULL, part INTEGER NOT NULL, committed INTEGER NOT NULL,
    delivered INTEGER NOT NULL, created REAL NOT NULL, PRIMARY KEY (stream, grp, part)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fs_pending (
    stream TEXT NOT NULL, grp TEXT NOT NULL, part INTEGER NOT NULL, lo INTEGER NOT NULL,
    hi INTEGER NOT NULL, deliveries INTEGER NOT NULL, deadline REAL NOT NULL, consumer TEXT NOT NULL,
    PRIMARY KEY (stream, grp, part, lo)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fs_dead (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, stream TEXT NOT NULL, grp TEXT NOT NULL,
    part INTEGER NOT NULL, off INTEGER NOT NULL, last_off INTEGER, id TEXT NOT NULL, key TEXT,
    payload BLOB, reason TEXT NOT NULL, error TEXT, deliveries INTEGER NOT NULL, dead_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS fs_dead_group ON fs_dead (stream, grp, seq);
CREATE TABLE IF NOT EXISTS fs_members (
    stream TEXT NOT NULL, grp TEXT NOT NULL, consumer TEXT NOT NULL, expires REAL NOT NULL,
    PRIMARY KEY (stream, grp, consumer)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fs_leases (
    stream TEXT NOT NULL, grp TEXT NOT NULL, part INTEGER NOT NULL, owner TEXT NOT NULL,
    expires REAL NOT NULL, PRIMARY KEY (stream, grp, part)
) WITHOUT ROWID;
"""
_INDEX = "CREATE INDEX IF NOT EXISTS fs_events_id ON fs_events (sid, id)"  # the publish dedup lookup
_DDL = [*(statement for statement in _TABLES.split(";") if statement.strip()), _INDEX]  # format 2

# Format 1 -> 2, in the transaction that holds the write lock (open_schema). The tables
# keyed by the stream's name per batch (parts, groups, pending, dead letters, leases) stay
# as they were; the per-event ones move to the stream's sid.
_MIGRATE_1 = """
ALTER TABLE fs_streams RENAME TO fs_streams_v1;
ALTER TABLE fs_events RENAME TO fs_events_v1;
ALTER TABLE fs_dedup RENAME TO fs_dedup_v1;
{tables};
INSERT INTO fs_streams (name, partitions, max_age, max_events, max_bytes, dedup_window, created)
    SELECT name, partitions, max_age, max_events, max_bytes, dedup_window, created FROM fs_streams_v1
    ORDER BY rowid;
INSERT INTO fs_events (sid, part, off, id, key, ts, cum, payload, trace)
    SELECT s.sid, e.part, e.off, e.id, e.key, e.ts, e.cum, e.payload, e.trace
    FROM fs_events_v1 e JOIN fs_streams s ON s.name = e.stream;
INSERT OR REPLACE INTO fs_dedup (sid, id, part, off, ts)
    SELECT s.sid, d.id, d.part, d.off, d.ts FROM fs_dedup_v1 d JOIN fs_streams s ON s.name = d.stream
    WHERE NOT EXISTS (SELECT 1 FROM fs_events e WHERE e.sid = s.sid AND e.part = d.part AND e.off = d.off);
DROP TABLE fs_streams_v1;
DROP TABLE fs_events_v1;
DROP TABLE fs_dedup_v1;
{index}
"""

_V1_MISSING = (
    "CREATE TABLE IF NOT EXISTS fs_streams (name TEXT PRIMARY KEY, partitions INTEGER NOT NULL, "
    "max_age REAL, max_events INTEGER, max_bytes INTEGER, dedup_window REAL NOT NULL, created REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS fs_dedup (stream TEXT NOT NULL, id TEXT NOT NULL, part INTEGER NOT NULL, "
    "off INTEGER NOT NULL, ts REAL NOT NULL, PRIMARY KEY (stream, id)) WITHOUT ROWID",
)


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {str(row[1]) for row in conn.execute(f"PRAGMA table_info({table})")}


def open_schema(conn: sqlite3.Connection, path: Path) -> int:
    """Create the log's tables, or bring an older file's to :data:`FORMAT`; the format the
    file had (0: new). One ``BEGIN IMMEDIATE`` transaction: of processes opening the file
    at once, one migrates and the others, waiting for its lock, find it done. A file of a
    newer format (a newer Foundry's) is refused, and nothing of it is changed."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        found = _format(conn)
        if found > FORMAT:
            raise ConfigError(
                f"stream log {path}: format {found}, newer than this Foundry's ({FORMAT}); it was written "
                "by a newer Foundry. Fix: upgrade foundry-exec to the version that wrote it, or point "
                "the stream URL at another file"
            )
        if found == 1:
            for statement in _V1_MISSING:  # a file whose first open was cut short
                conn.execute(statement)
            if "trace" not in _columns(conn, "fs_events"):  # a log from before traces
                conn.execute("ALTER TABLE fs_events ADD COLUMN trace TEXT")
            script = _MIGRATE_1.replace("{tables}", _TABLES).replace("{index}", _INDEX)  # index built once
            for statement in script.split(";"):
                if statement.strip():
                    conn.execute(statement)
        else:
            for statement in _DDL:
                conn.execute(statement)
        if found != FORMAT:
            conn.execute("INSERT OR REPLACE INTO fs_meta VALUES ('format', ?)", (FORMAT,))
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return found


def _format(conn: sqlite3.Connection) -> int:
    """The format of the file's log: 0 when it has none yet, 1 for a log from before
    ``fs_meta`` (its events keyed by the stream's name)."""
    tables = {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if "fs_meta" in tables:
        row = conn.execute("SELECT value FROM fs_meta WHERE name='format'").fetchone()
        if row is not None:
            return int(row[0])
    if "fs_events" in tables and "stream" in _columns(conn, "fs_events"):
        return 1
    return 0


# The rows of a range that pass decode_row's test, in SQL: when every offset has one, a
# page is decoded without a Python test per row (the others go through decode_row).
_WELL_FORMED = (
    "SELECT off, id, key, ts, payload, trace FROM fs_events WHERE sid=? AND part=? AND off BETWEEN ? AND ? "
    "AND typeof(off)='integer' AND typeof(id)='text' AND typeof(key) IN ('text','null') "
    "AND typeof(ts)='real' AND ts>-9e999 AND ts<9e999 AND typeof(payload)='blob' ORDER BY off"
)
_DEAD_COLUMNS = "stream, grp, part, off, id, key, payload, reason, deliveries, dead_at, error, last_off"
_POLL = 0.02  # seconds between looks at the file for other processes' writes, without the doorbell
_SAFETY_POLL = 1.0  # the same with the doorbell: only a lost ring waits that long
_MAX_VARS = 900  # bound parameters per IN (...) list


def _parse_poll(url: str, raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        poll = parse_duration(raw, unit=f"stream URL {safe_url(url)!r}", field_name="poll")
    except DeclarationError as exc:
        poll = -1.0
        cause: Exception | None = exc
    else:
        cause = None
    if poll <= 0:
        raise ConfigError(
            f"stream URL {safe_url(url)!r}: poll={raw!r} is not a positive duration. "
            "Fix: e.g. poll=1s or poll=20ms"
        ) from cause
    return poll


def _parse(url: str) -> tuple[Path, str, float | None, bool]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = set(options) - {"synchronous", "poll"}
    if unknown:
        raise ConfigError(
            f"stream URL {safe_url(url)!r}: unknown option(s) {sorted(unknown)}. Fix: the sqlite stream "
            "takes only ?synchronous=normal|full and ?poll=<duration>"
        )
    sync = options.get("synchronous", "normal").lower()
    if sync not in ("normal", "full"):
        raise ConfigError(f"stream URL {safe_url(url)!r}: synchronous={sync!r}. Fix: use normal or full")
    poll = _parse_poll(url, options.get("poll"))
    if scheme == "memory":
        fd, name = tempfile.mkstemp(prefix="foundry-stream-", suffix=".db")
        os.close(fd)
        return Path(name), sync, poll, True
    raw = url.split("://", 1)[1].split("?", 1)[0]
    path = raw[1:] if raw.startswith("/") else raw
    if not path:
        raise ConfigError(
            f"stream URL {safe_url(url)!r} names no file. Fix: sqlite:///stream.db (relative) or "
            "sqlite:////var/lib/app/stream.db (absolute)"
        )
    return Path(path), sync, poll, False


class Text(bytes):
    """A TEXT value of ``fs_events`` as read by the entry query: its raw bytes, marked as
    TEXT (the query's ``text_factory``), so a TEXT payload is told from a BLOB and text
    that is not UTF-8 is an error of that row, not of the whole read."""


_KINDS: dict[type, str] = {type(None): "NULL", int: "INTEGER", float: "REAL", Text: "TEXT", bytes: "BLOB"}


def _kind(value: Any) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def decode_row(stream: str, partition: int, row: Sequence[Any], deliveries: int) -> Event:
    """One ``fs_events`` row ``(off, id, key, ts, payload)``, TEXT values as :class:`Text`,
    as the event Foundry stored — or :class:`MalformedEntryError` naming what Foundry
    could not have written (SQLite's columns take any type: a foreign writer or a
    corrupted file can put anything there). Nothing else is raised."""
    if len(row) != 5:
        raise MalformedEntryError(f"the row has {len(row)} columns, not 5")
    off, ident, key, ts, payload = row
    kind = type(ts)
    if not (  # what Foundry writes passes this one test (it runs once per event read)
        type(off) is int
        and type(payload) is bytes
        and type(ident) is Text
        and (key is None or type(key) is Text)
        and (kind is float or kind is int)
        and math.isfinite(ts)
    ):
        _refuse(off, ident, key, ts, payload)
    try:
        text_id = ident.decode()
        text_key = None if key is None else key.decode()
    except UnicodeDecodeError as exc:
        raise MalformedEntryError(f"its id or key is not UTF-8 ({exc})") from None
    return Event(
        stream,
        partition,
        off,
        text_id or derived_id(stream, partition, off),
        text_key,
        payload,
        ts if kind is float else float(ts),
        deliveries,
    )


def _refuse(off: Any, ident: Any, key: Any, ts: Any, payload: Any) -> NoReturn:
    """Raise :class:`MalformedEntryError` naming the first column Foundry did not write."""
    if type(off) is not int:
        raise MalformedEntryError(f"its offset is {_kind(off)} {off!r}, not an INTEGER")
    if type(payload) is not bytes:
        raise MalformedEntryError(f"its payload is {_kind(payload)}, not a BLOB")
    if type(ident) is not Text:
        raise MalformedEntryError(f"its id is {_kind(ident)}, not TEXT")
    if key is not None and type(key) is not Text:
        raise MalformedEntryError(f"its key is {_kind(key)}, not TEXT or NULL")
    raise MalformedEntryError(f"its timestamp is {_kind(ts)} {ts!r}, not a finite REAL")


def _salvage(
    stream: str, partition: int, off: int, row: Sequence[Any], reason: str, deliveries: int
) -> Event:
    """The stand-in for a row :func:`decode_row` refused: what of it can be kept."""
    ident, key, payload = (row[1], row[2], row[4]) if len(row) == 5 else (None, None, None)
    text = {}
    for name, value in (("id", ident), ("key", key)):
        if type(value) is Text:
            text[name] = value.decode(errors="replace")
    if isinstance(payload, bytes):
        data = bytes(payload)
    elif payload is None:
        data = b""
    else:
        data = str(payload).encode()
    return malformed_event(
        stream,
        partition,
        off,
        f"the entry at offset {off} of partition {partition} {reason} (a foreign writer or a corrupted log)",
        deliveries=deliveries,
        id=text.get("id"),
        key=text.get("key"),
        payload=data,
    )


def _insert_dead(conn: sqlite3.Connection, letter: DeadLetter) -> None:
    conn.execute(
        f"INSERT INTO fs_dead ({_DEAD_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
        dataclasses.astuple(letter),
    )


class SqliteStreamBackend(ShowsUrl, AppendInThread, CheckedRead):
    """The embedded log (see the module docstring)."""

    capabilities: ClassVar[Capabilities] = Capabilities(atomic_read=True, dense_offsets=True)

    def __init__(self, url: str) -> None:
        self._url = url
        self.shown = safe_url(url)  # for messages: the password masked (there is none today)
        self.path, self._sync, self._poll, self._temporary = _parse(url)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"stream URL {safe_url(url)!r}: cannot create directory {self.path.parent} ({exc}). "
                "Fix: point it at a writable directory"
            ) from exc
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._wake = Wakeups(str(self.path.resolve()))  # this process's commits, and the doorbell
        self._configs: dict[str, StreamConfig] = {}
        self._last_age_trim: dict[str, float] = {}
        self._closed = False
        conn = self._conn()
        with self._errors("open"):
            self.migrated_from = open_schema(conn, self.path)  # the format the file had (0: new)

    # -- plumbing --------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        if self._closed:
            raise BackendError(f"stream backend {self.shown} is closed. Fix: open a new one")
        try:
            conn = sqlite_connect(str(self.path), timeout=30.0, synchronous=self._sync)
        except sqlite3.Error as exc:
            raise BackendUnavailableError(f"cannot open the stream log {self.path}: {exc}") from exc
        self._local.conn = conn
        with self._conns_lock:
            self._conns.append(conn)
        return conn

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as exc:
            raise BackendUnavailableError(f"stream log {self.path}: {what} failed: {exc}") from exc
        except sqlite3.Error as exc:
            raise BackendError(f"stream log {self.path}: {what} failed: {exc}") from exc

    @contextlib.contextmanager
    def _tx(self, what: str) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        with self._errors(what):
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _config(self, stream: str, conn: sqlite3.Connection | None = None) -> StreamConfig:
        config = self._configs.get(stream)
        if config is not None:
            return config
        conn = conn or self._conn()
        with self._errors("load stream"):
            row = conn.execute(
                "SELECT partitions, max_age, max_events, max_bytes, dedup_window "
                "FROM fs_streams WHERE name=?",
                (stream,),
            ).fetchone()
        if row is None:
            raise unknown_stream(stream, self.streams())
        config = StreamConfig(stream, row[0], row[1], row[2], row[3], row[4])
        self._configs[stream] = config
        return config

    def _check_group(
        self, conn: sqlite3.Connection, stream: str, group: str, partition: int
    ) -> tuple[int, int]:
        row = conn.execute(
            "SELECT committed, delivered FROM fs_groups WHERE stream=? AND grp=? AND part=?",
            (stream, group, partition),
        ).fetchone()
        if row is not None:
            return int(row[0]), int(row[1])
        check_partition(self._config(stream, conn), partition)
        raise unknown_group(stream, group, self._groups(conn, stream))

    # -- streams ---------------------------------------------------------------

    def ensure_stream(self, config: StreamConfig) -> StreamConfig:
        with self._tx("create stream") as conn:
            row = conn.execute("SELECT partitions FROM fs_streams WHERE name=?", (config.name,)).fetchone()
            if row is not None and int(row[0]) != config.partitions:
                raise partitions_changed(config, row[0])
            conn.execute(
                "INSERT INTO fs_streams (name, partitions, max_age, max_events, max_bytes, dedup_window, "
                "created) VALUES (?,?,?,?,?,?,?) ON CONFLICT(name) DO UPDATE SET "
                "max_age=excluded.max_age, max_events=excluded.max_events, "
                "max_bytes=excluded.max_bytes, dedup_window=excluded.dedup_window",
                (
                    config.name,
                    config.partitions,
                    config.max_age,
                    config.max_events,
                    config.max_bytes,
                    config.dedup_window,
                    time.time(),
                ),
            )
            conn.executemany(
                "INSERT OR IGNORE INTO fs_parts VALUES (?,?,1,0,0,0)",
                [(config.name, p) for p in range(config.partitions)],
            )
        self._configs[config.name] = config
        return config

    def streams(self) -> list[str]:
        with self._errors("list streams"):
            return [r[0] for r in self._conn().execute("SELECT name FROM fs_streams ORDER BY name")]

    def _parts(self, conn: sqlite3.Connection, stream: str) -> dict[int, tuple[int, int, int, float]]:
        rows = conn.execute("SELECT part, first, last, cum, last_ts FROM fs_parts WHERE stream=?", (stream,))
        return {int(r[0]): (int(r[1]), int(r[2]), int(r[3]), float(r[4])) for r in rows}

    def info(self, stream: str) -> StreamInfo:
        conn = self._conn()
        config = self._config(stream, conn)
        with self._errors("stream info"):
            parts = self._parts(conn, stream)
            groups = self._groups(conn, stream)
        ordered = [parts[p] for p in range(config.partitions)]
        return StreamInfo(
            config=config,
            first=tuple(p[0] for p in ordered),
            last=tuple(p[1] for p in ordered),
            groups=tuple(groups),
        )

    def delete_stream(self, stream: str) -> bool:
        with self._tx("delete stream") as conn:
            row = conn.execute("SELECT sid FROM fs_streams WHERE name=?", (stream,)).fetchone()
            if row is not None:
                for table in ("fs_events", "fs_dedup"):
                    conn.execute(f"DELETE FROM {table} WHERE sid=?", (row[0],))
            conn.execute("DELETE FROM fs_streams WHERE name=?", (stream,))
            for table in ("fs_parts", "fs_groups", "fs_pending", "fs_dead"):
                conn.execute(f"DELETE FROM {table} WHERE stream=?", (stream,))
            conn.execute("DELETE FROM fs_members WHERE stream=?", (stream,))
            conn.execute("DELETE FROM fs_leases WHERE stream=?", (stream,))
        self._configs.pop(stream, None)
        return row is not None

    # -- producing -------------------------------------------------------------

    def append(self, stream: str, events: Sequence[NewEvent]) -> list[Appended]:
        if not events:
            return []
        config = self._config(stream)
        now = time.time()
        count, dedup = config.partitions, config.dedup_window > 0
        with self._tx("append") as conn:
            sid = self._sid(conn, stream)
            parts = self._parts(conn, stream)
            known: dict[str, tuple[int, int]] = {}
            if dedup:
                known = self._known_ids(conn, sid, [e.id for e in events], now - config.dedup_window)
            results: list[Appended] = []
            rows: list[tuple[Any, ...]] = []
            # Per partition: [last offset, cumulative bytes, the timestamp of this batch]
            # (never below the partition's last one, so time seeks can bisect offsets).
            touched: dict[int, list[Any]] = {}
            seen_get, add_row, add_result = known.get, rows.append, results.append
            for event in events:  # (once per event: keep it lean)
                ident = event.id
                seen = seen_get(ident)
                if seen is not None:
                    add_result(Appended(seen[0], seen[1], True))
                    continue
                p = 0 if count == 1 else partition_for(event.key, ident, count)
                state = touched.get(p)
                if state is None:
                    _, last, cum, last_ts = parts[p]
                    state = touched[p] = [last, cum, max(last_ts, now)]
                state[0] = offset = state[0] + 1
                payload = event.payload
                state[1] = cum = state[1] + len(payload)
                add_row((sid, p, offset, ident, event.key, state[2], cum, payload, event.trace))
                known[ident] = (p, offset)
                add_result(Appended(p, offset))
            conn.executemany(
                "INSERT INTO fs_events (sid, part, off, id, key, ts, cum, payload, trace) "
                "VALUES (?,?,?,?,?,?,?,?,?)",
                rows,
            )  # the index on (sid, id) is the dedup record: no second row per event
            for p, (last, cum, last_ts) in touched.items():
                conn.execute(
                    "UPDATE fs_parts SET last=?, cum=?, last_ts=? WHERE stream=? AND part=?",
                    (last, cum, last_ts, stream, p),
                )
                if config.max_events is not None or config.max_bytes is not None:
                    self._trim_size(conn, config, sid, p, (parts[p][0], last, cum), now)
            self._maybe_trim_age(conn, config, sid, now)
        self._wake.ring()
        return results

    def _sid(self, conn: sqlite3.Connection, stream: str) -> int:
        """The stream's integer id, the first column of its events' keys."""
        row = conn.execute("SELECT sid FROM fs_streams WHERE name=?", (stream,)).fetchone()
        if row is None:
            self._configs.pop(stream, None)  # deleted by another process since we cached it
            raise unknown_stream(stream, [r[0] for r in conn.execute("SELECT name FROM fs_streams")])
        return int(row[0])

    def _known_ids(
        self, conn: sqlite3.Connection, sid: int, ids: list[str], since: float
    ) -> dict[str, tuple[int, int]]:
        """Which of ``ids`` the stream stored at or after ``since``: from the index on its
        events, and from the dedup records retention left of the events it removed."""
        known: dict[str, tuple[int, int]] = {}
        unique = list(dict.fromkeys(ids))
        sources = ["fs_events INDEXED BY fs_events_id"]  # the planner would scan the stream's events
        if conn.execute("SELECT 1 FROM fs_dedup WHERE sid=? LIMIT 1", (sid,)).fetchone() is not None:
            sources.append("fs_dedup")
        for i in range(0, len(unique), _MAX_VARS):
            chunk = unique[i : i + _MAX_VARS]
            marks = ",".join("?" * len(chunk))
            for table in sources:
                for row in conn.execute(
                    f"SELECT id, part, off FROM {table} WHERE sid=? AND id IN ({marks}) AND ts>=?",
                    (sid, *chunk, since),
                ):
                    if (
                        type(row[0]) is str and type(row[1]) is int and type(row[2]) is int
                    ):  # not a foreign row's
                        known[row[0]] = (row[1], row[2])
        return known

    # -- retention -------------------------------------------------------------

    def _set_first(self, conn: sqlite3.Connection, stream: str, part: int, first: int) -> None:
        conn.execute(
            "UPDATE fs_parts SET first=? WHERE stream=? AND part=? AND first<?", (first, stream, part, first)
        )

    def _remove(
        self,
        conn: sqlite3.Connection,
        config: StreamConfig,
        sid: int,
        part: int,
        first: int,
        cut: int,
        now: float,
    ) -> int:
        """Delete offsets ``first..cut`` of ``part``; how many rows went. The ids of those
        still inside the dedup window are kept in ``fs_dedup`` first (the index on the
        events went with them), so a retried publish of one is still a duplicate until
        its window has passed — the age trim then drops the record."""
        if config.dedup_window > 0:
            since = now - config.dedup_window
            lo = max(first, self._last_before(conn, sid, part, first, cut, since) + 1)
            if lo <= cut:
                conn.execute(
                    "INSERT OR REPLACE INTO fs_dedup (sid, id, part, off, ts) SELECT sid, id, part, off, ts "
                    "FROM fs_events WHERE sid=? AND part=? AND off BETWEEN ? AND ? AND ts>=?",
                    (sid, part, lo, cut, since),
                )
        removed = conn.execute(
            "DELETE FROM fs_events WHERE sid=? AND part=? AND off<=?", (sid, part, cut)
        ).rowcount
        self._set_first(conn, config.name, part, cut + 1)
        return int(removed)

    def _trim_size(
        self,
        conn: sqlite3.Connection,
        config: StreamConfig,
        sid: int,
        part: int,
        span: Sequence[int],
        now: float,
    ) -> int:
        """Apply ``max_events`` / ``max_bytes`` to ``part``, whose ``span`` is (first offset,
        last offset, cumulative bytes)."""
        first, last, cum = span[0], span[1], span[2]
        cut = first - 1
        if config.max_events is not None:
            cut = max(cut, last - config.max_events)
        if config.max_bytes is not None and cum - self._cum_before(conn, sid, part, first) > config.max_bytes:
            row = conn.execute(
                "SELECT MAX(off) FROM fs_events WHERE sid=? AND part=? AND off>=? AND cum<=?",
                (sid, part, first, cum - config.max_bytes),
            ).fetchone()
            if row[0] is not None:
                cut = max(cut, int(row[0]))
        if cut < first:
            return 0
        return self._remove(conn, config, sid, part, first, cut, now)

    def _cum_before(self, conn: sqlite3.Connection, sid: int, part: int, first: int) -> int:
        row = conn.execute(
            "SELECT cum, length(payload) FROM fs_events WHERE sid=? AND part=? AND off=?",
            (sid, part, first),
        ).fetchone()
        if row is None:
            return 0
        try:
            return int(row[0]) - int(row[1])
        except (TypeError, ValueError):
            return 0  # a foreign row's cumulative size: count from nothing

    def _maybe_trim_age(
        self, conn: sqlite3.Connection, config: StreamConfig, sid: int, now: float, force: bool = False
    ) -> int:
        removed = 0
        if force or now - self._last_age_trim.get(config.name, 0.0) >= 1.0:
            self._last_age_trim[config.name] = now
            conn.execute("DELETE FROM fs_dedup WHERE sid=? AND ts<?", (sid, now - config.dedup_window))
            if config.max_age is not None:
                cutoff = now - config.max_age
                for part, (first, last, _, _) in self._parts(conn, config.name).items():
                    cut = self._last_before(conn, sid, part, first, last, cutoff)
                    if cut >= first:
                        removed += self._remove(conn, config, sid, part, first, cut, now)
        return removed

    def _ts(self, conn: sqlite3.Connection, sid: int, part: int, off: int) -> float:
        row = conn.execute(
            "SELECT ts FROM fs_events WHERE sid=? AND part=? AND off=?", (sid, part, off)
        ).fetchone()
        if row is None:
            return float("inf")
        try:
            return float(row[0])
        except (TypeError, ValueError):
            return 0.0  # a foreign row's timestamp: as old as can be (trimmed first, never sought)

    def _last_before(
        self, conn: sqlite3.Connection, sid: int, part: int, first: int, last: int, when: float
    ) -> int:
        """The largest offset whose timestamp is < ``when`` (first - 1 if none)."""
        lo, hi = first, last
        answer = first - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            if self._ts(conn, sid, part, mid) < when:
                answer, lo = mid, mid + 1
            else:
                hi = mid - 1
        return answer

    def enforce_retention(self, stream: str) -> int:
        config = self._config(stream)
        with self._tx("retention") as conn:
            sid, now = self._sid(conn, stream), time.time()
            removed = self._maybe_trim_age(conn, config, sid, now, force=True)
            if config.max_events is not None or config.max_bytes is not None:
                for part, (first, last, cum, _) in self._parts(conn, stream).items():
                    removed += self._trim_size(conn, config, sid, part, (first, last, cum), now)
        return removed

    # -- groups ----------------------------------------------------------------

    def _groups(self, conn: sqlite3.Connection, stream: str) -> list[str]:
        return [
            r[0]
            for r in conn.execute("SELECT DISTINCT grp FROM fs_groups WHERE stream=? ORDER BY grp", (stream,))
        ]

    def groups(self, stream: str) -> list[str]:
        conn = self._conn()
        self._config(stream, conn)
        with self._errors("list groups"):
            return self._groups(conn, stream)

    def _targets(
        self,
        conn: sqlite3.Connection,
        config: StreamConfig,
        group: str,
        start: Start,
        partitions: Sequence[int],
    ) -> dict[int, int]:
        """The next offset to deliver per partition for ``start``; raise if not retained."""
        parts = self._parts(conn, config.name)
        sid = self._sid(conn, config.name)
        targets: dict[int, int] = {}
        for p in partitions:
            first, last, _, _ = parts[p]

            def first_time(p: int = p, first: int = first) -> float:
                return self._ts(conn, sid, p, first)

            def offset_at(t: float, p: int = p, first: int = first, last: int = last) -> int:
                return self._last_before(conn, sid, p, first, last, t) + 1

            target = resolve_start(config, group, start, p, first, last, first_time, offset_at)
            if target is not None:
                targets[p] = target
        return targets

    def create_group(self, stream: str, group: str, start: Start) -> bool:
        check_name("group", group)
        config = self._config(stream)
        with self._tx("create group") as conn:
            if conn.execute("SELECT 1 FROM fs_groups WHERE stream=? AND grp=?", (stream, group)).fetchone():
                return False
            targets = self._targets(conn, config, group, start, range(config.partitions))
            parts = self._parts(conn, stream)
            now = time.time()
            conn.executemany(
                "INSERT INTO fs_groups VALUES (?,?,?,?,?,?)",
                [
                    (stream, group, p, targets.get(p, parts[p][0]) - 1, targets.get(p, parts[p][0]) - 1, now)
                    for p in range(config.partitions)
                ],
            )
        return True

    def delete_group(self, stream: str, group: str) -> bool:
        with self._tx("delete group") as conn:
            found = (
                conn.execute("DELETE FROM fs_groups WHERE stream=? AND grp=?", (stream, group)).rowcount > 0
            )
            for table in ("fs_pending", "fs_dead", "fs_members", "fs_leases"):
                conn.execute(f"DELETE FROM {table} WHERE stream=? AND grp=?", (stream, group))
        return found

    def seek(self, stream: str, group: str, start: Start, partitions: Sequence[int] | None = None) -> None:
        config = self._config(stream)
        with self._tx("seek") as conn:
            self._check_group(conn, stream, group, 0)
            chosen = list(range(config.partitions)) if partitions is None else list(partitions)
            for p in chosen:
                self._check_group(conn, stream, group, p)
            for p, target in self._targets(conn, config, group, start, chosen).items():
                conn.execute("DELETE FROM fs_pending WHERE stream=? AND grp=? AND part=?", (stream, group, p))
                conn.execute(
                    "UPDATE fs_groups SET committed=?, delivered=? WHERE stream=? AND grp=? AND part=?",
                    (target - 1, target - 1, stream, group, p),
                )
        self._wake.ring()

    # -- consuming -------------------------------------------------------------

    def _read(
        self, stream: str, group: str, partition: int, consumer: str, limit: int, ack: float, timeout: float
    ) -> list[Event]:
        until = time.monotonic() + (timeout if timeout > 0 else 0.0)
        wake = self._wake
        while True:
            mark = wake.mark() if timeout > 0 else 0  # before the look: a commit after it wakes us
            due = self._due_in(stream, group, partition)
            events = self._read_once(stream, group, partition, consumer, limit, ack) if due <= 0 else []
            remaining = until - time.monotonic()
            if events or remaining <= 0:
                return events
            poll = self._poll or (_SAFETY_POLL if wake.cross_process else _POLL)
            wake.wait(mark, min(remaining, poll, max(due, 0.001)))

    def _due_in(self, stream: str, group: str, partition: int) -> float:
        """Seconds until there may be something to read without another commit: 0 when
        there may be now, until the oldest pending range is due for redelivery, else
        infinity. A look without the write lock: idle consumers polling must not queue
        up behind publishers (or each other) for SQLite's one writer."""
        with self._errors("read"):
            row = (
                self._conn()
                .execute(
                    "SELECT g.delivered, p.last, (SELECT MIN(deadline) FROM fs_pending WHERE stream=g.stream "
                    "AND grp=g.grp AND part=g.part) FROM fs_groups g JOIN fs_parts p ON p.stream=g.stream "
                    "AND p.part=g.part WHERE g.stream=? AND g.grp=? AND g.part=?",
                    (stream, group, partition),
                )
                .fetchone()
            )
        if row is None:
            return 0.0  # let the locked path raise the right error
        delivered, last, deadline = row
        if deadline is not None:
            return max(0.0, float(deadline) - time.time())
        return math.inf if int(delivered) >= int(last) else 0.0

    def _read_once(
        self, stream: str, group: str, partition: int, consumer: str, limit: int, ack_deadline: float
    ) -> list[Event]:
        with self._tx("read") as conn:
            committed, delivered = self._check_group(conn, stream, group, partition)
            now = time.time()
            ranges = conn.execute(
                "SELECT lo, hi, deliveries, deadline, consumer FROM fs_pending "
                "WHERE stream=? AND grp=? AND part=? ORDER BY lo",
                (stream, group, partition),
            ).fetchall()
            key = (stream, group, partition)
            if ranges:
                taken: list[tuple[int, int, int]] = []
                need = limit
                for lo, hi, deliveries, deadline, holder in ranges:
                    if deadline > now or need == 0:
                        break
                    end = min(hi, lo + need - 1)
                    conn.execute(
                        "DELETE FROM fs_pending WHERE stream=? AND grp=? AND part=? AND lo=?", (*key, lo)
                    )
                    conn.execute(
                        "INSERT INTO fs_pending VALUES (?,?,?,?,?,?,?,?)",
                        (*key, lo, end, deliveries + 1, now + ack_deadline, consumer),
                    )
                    if end < hi:
                        # The rest stays with whoever it was delivered to: were it marked as
                        # this reader's, the reader's heartbeat would extend the deadline of
                        # events it never received, and they would never come due again.
                        conn.execute(
                            "INSERT INTO fs_pending VALUES (?,?,?,?,?,?,?,?)",
                            (*key, end + 1, hi, deliveries, deadline, holder),
                        )
                    taken.append((lo, end, deliveries + 1))
                    need -= end - lo + 1
                    if end < hi:
                        break
                if not taken:
                    return []
                first = self._parts(conn, stream)[partition][0]
                events: list[Event] = []
                for lo, end, deliveries in taken:
                    events.extend(self._events(conn, stream, partition, lo, end, deliveries, first))
                first_kept = events[0].offset if events else taken[-1][1] + 1
                if first_kept > taken[0][0]:
                    # The oldest pending entries were removed by retention while pending.
                    self._record_gap(conn, stream, group, partition, taken[0][0], first_kept - 1, now)
                    self._commit(conn, stream, group, partition, first_kept - 1, committed, delivered)
                return events
            first, last, _, _ = self._parts(conn, stream)[partition]
            start = delivered + 1
            if start < first:
                self._record_gap(conn, stream, group, partition, start, first - 1, now)
                start = first
                conn.execute(
                    "UPDATE fs_groups SET committed=?, delivered=? WHERE stream=? AND grp=? AND part=?",
                    (first - 1, first - 1, *key),
                )
            if start > last:
                return []
            end = min(last, start + limit - 1)
            conn.execute(
                "INSERT INTO fs_pending VALUES (?,?,?,?,?,?,?,?)",
                (*key, start, end, 1, now + ack_deadline, consumer),
            )
            conn.execute("UPDATE fs_groups SET delivered=? WHERE stream=? AND grp=? AND part=?", (end, *key))
            return self._events(conn, stream, partition, start, end, 1, first)

    def _events(
        self,
        conn: sqlite3.Connection,
        stream: str,
        partition: int,
        lo: int,
        hi: int,
        deliveries: int,
        first: int,
    ) -> list[Event]:
        """Every offset of ``max(lo, first)..hi`` as an event: the stored one, or a
        stand-in marked ``malformed`` for a row Foundry could not have written or one
        deleted from under the log (below ``first`` is retention's, recorded as a gap by
        the caller)."""
        sid, lo = self._sid(conn, stream), max(lo, first)
        try:  # what Foundry wrote, text decoded by SQLite: one row per offset, or the slow path
            rows = conn.execute(_WELL_FORMED, (sid, partition, lo, hi)).fetchall()
        except sqlite3.OperationalError:  # text that is not UTF-8: the slow path names its row
            rows = []
        if len(rows) == hi - lo + 1:
            return [
                Event(
                    stream,
                    partition,
                    off,
                    ident or derived_id(stream, partition, off),
                    key,
                    payload,
                    ts,
                    deliveries,
                    None,
                    None if trace is None else parse_trace(trace),
                )
                for off, ident, key, ts, payload, trace in rows
            ]
        conn.text_factory = Text
        try:
            rows = conn.execute(
                "SELECT off, id, key, ts, payload, trace FROM fs_events "
                "WHERE sid=? AND part=? AND off BETWEEN ? AND ? ORDER BY off",
                (sid, partition, lo, hi),
            ).fetchall()
        finally:
            conn.text_factory = str
        out: list[Event] = []
        expect = lo
        for row in rows:
            off = row[0]
            if type(off) is not int:
                continue  # a REAL offset between two integers: not a position of the log
            while expect < off:
                out.append(_salvage(stream, partition, expect, (), "is missing", deliveries))
                expect += 1
            try:
                event = decode_row(stream, partition, row[:5], deliveries)
            except MalformedEntryError as exc:
                out.append(
                    _salvage(stream, partition, off, row[:5], f"is not a Foundry event: {exc}", deliveries)
                )
            else:  # the trace context is advisory: one that does not parse is ignored
                out.append(event if row[5] is None else dataclasses.replace(event, trace=parse_trace(row[5])))
            expect = off + 1
        while expect <= hi:
            out.append(_salvage(stream, partition, expect, (), "is missing", deliveries))
            expect += 1
        return out

    def _record_gap(
        self, conn: sqlite3.Connection, stream: str, group: str, partition: int, lo: int, hi: int, now: float
    ) -> None:
        _insert_dead(conn, gap_letter(self._config(stream, conn), group, partition, lo, hi, now))

    def _commit(
        self,
        conn: sqlite3.Connection,
        stream: str,
        group: str,
        partition: int,
        offset: int,
        committed: int,
        delivered: int,
    ) -> None:
        if offset <= committed:
            return
        if offset > delivered:
            raise BackendError(
                f"stream {stream!r} group {group!r} partition {partition}: cannot commit offset {offset}, "
                f"only offsets up to {delivered} were delivered. Fix: commit the offset of an event you read"
            )
        key = (stream, group, partition)
        conn.execute("DELETE FROM fs_pending WHERE stream=? AND grp=? AND part=? AND hi<=?", (*key, offset))
        conn.execute(
            "UPDATE fs_pending SET lo=? WHERE stream=? AND grp=? AND part=? AND lo<=?",
            (offset + 1, *key, offset),
        )
        conn.execute("UPDATE fs_groups SET committed=? WHERE stream=? AND grp=? AND part=?", (offset, *key))

    def commit(self, stream: str, group: str, partition: int, offset: int) -> None:
        with self._tx("commit") as conn:
            committed, delivered = self._check_group(conn, stream, group, partition)
            self._commit(conn, stream, group, partition, offset, committed, delivered)
        self._wake.ring()  # a cleared pending window lets a waiting reader read on

    def extend(self, stream: str, group: str, partition: int, consumer: str, ack_deadline: float) -> None:
        with self._tx("extend") as conn:
            conn.execute(
                "UPDATE fs_pending SET deadline=? WHERE stream=? AND grp=? AND part=? AND consumer=?",
                (time.time() + ack_deadline, stream, group, partition, consumer),
            )

    def dead_letter(
        self, stream: str, group: str, event: Event, reason: str, error: str | None = None
    ) -> None:
        with self._tx("dead letter") as conn:
            committed, delivered = self._check_group(conn, stream, group, event.partition)
            if event.offset <= committed:
                return
            _insert_dead(conn, event_letter(stream, group, event, reason, error, time.time()))
            self._commit(conn, stream, group, event.partition, event.offset, committed, delivered)
        self._wake.ring()

    def dead_letters(self, stream: str, group: str | None = None, limit: int = 100) -> list[DeadLetter]:
        conn = self._conn()
        self._config(stream, conn)
        sql = f"SELECT {_DEAD_COLUMNS} FROM fs_dead WHERE stream=?"
        args: tuple[Any, ...] = (stream,)
        if group is not None:
            sql += " AND grp=?"
            args += (group,)
        with self._errors("dead letters"):
            rows = conn.execute(sql + " ORDER BY seq LIMIT ?", (*args, limit)).fetchall()
        return [
            DeadLetter(
                r[0],
                r[1],
                int(r[2]),
                int(r[3]),
                r[4],
                r[5],
                None if r[6] is None else bytes(r[6]),
                r[7],
                int(r[8]),
                float(r[9]),
                r[10],
                r[11],
            )
            for r in rows
        ]

    def lag(self, stream: str, group: str) -> list[PartitionLag]:
        conn = self._conn()
        config = self._config(stream, conn)
        with self._errors("lag"):
            rows = conn.execute(
                "SELECT part, committed, delivered FROM fs_groups WHERE stream=? AND grp=? ORDER BY part",
                (stream, group),
            ).fetchall()
            if not rows:
                raise unknown_group(stream, group, self._groups(conn, stream))
            parts = self._parts(conn, stream)
        out = []
        for part, committed, delivered in rows:
            first, last, _, _ = parts[int(part)]
            out.append(PartitionLag(int(part), int(committed), last, first, int(delivered) - int(committed)))
        assert len(out) == config.partitions
        return out

    # -- coordination ----------------------------------------------------------

    def join(self, stream: str, group: str, consumer: str, ttl: float) -> list[str]:
        now = time.time()
        with self._tx("join") as conn:
            conn.execute(
                "DELETE FROM fs_members WHERE stream=? AND grp=? AND expires<?", (stream, group, now)
            )
            conn.execute(
                "INSERT OR REPLACE INTO fs_members VALUES (?,?,?,?)", (stream, group, consumer, now + ttl)
            )
            return [
                r[0]
                for r in conn.execute(
                    "SELECT consumer FROM fs_members WHERE stream=? AND grp=? ORDER BY consumer",
                    (stream, group),
                )
            ]

    def leave(self, stream: str, group: str, consumer: str) -> None:
        with self._tx("leave") as conn:
            conn.execute(
                "DELETE FROM fs_members WHERE stream=? AND grp=? AND consumer=?", (stream, group, consumer)
            )
            conn.execute(
                "DELETE FROM fs_leases WHERE stream=? AND grp=? AND owner=?", (stream, group, consumer)
            )

    def acquire(self, stream: str, group: str, partition: int, consumer: str, ttl: float) -> bool:
        now = time.time()
        with self._tx("acquire") as conn:
            row = conn.execute(
                "SELECT owner, expires FROM fs_leases WHERE stream=? AND grp=? AND part=?",
                (stream, group, partition),
            ).fetchone()
            if row is not None and row[0] != consumer and float(row[1]) > now:
                return False
            conn.execute(
                "INSERT OR REPLACE INTO fs_leases VALUES (?,?,?,?,?)",
                (stream, group, partition, consumer, now + ttl),
            )
            return True

    def release(self, stream: str, group: str, partition: int, consumer: str) -> None:
        with self._tx("release") as conn:
            conn.execute(
                "DELETE FROM fs_leases WHERE stream=? AND grp=? AND part=? AND owner=?",
                (stream, group, partition, consumer),
            )

    def close(self) -> None:
        self._closed = True
        self._wake.close(remove=self._temporary)
        with self._conns_lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        self._local = threading.local()
        if self._temporary:
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(OSError):
                    os.unlink(f"{self.path}{suffix}")
