"""Plumbing shared by the SQL engines of the queue (``queue/_sql.py``, ``sqlite.py``,
``postgres.py``) and of the workflow journal (``journal/_sql.py``, ``sqlite.py``,
``postgres.py``): statement text rewritten once per statement, the bounded connection
pool they build, driver errors mapped to Foundry's, the SQLite file a URL names,
PostgreSQL connections (psycopg 3) and the ``LISTEN`` thread that turns PostgreSQL's
notifications into wake-ups. Nothing here knows jobs or workflows, and nothing here
imports a database driver: the engines hand theirs in.

``what`` in the messages below names the backend and its URL (``"queue sqlite:///q.db"``,
``"journal postgresql://app:***@db/app"``), so every message says which store it is
about; its password masked (:func:`~foundry.config.safe_url`), like ``SqlEngine.shown``.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar
from urllib.parse import SplitResult, urlencode, urlsplit, urlunsplit

from foundry.backends._pool import Pool
from foundry.backends._urls import ShowsUrl, query_options, url_options
from foundry.config import safe_url, sqlite_path
from foundry.errors import BackendError, BackendUnavailableError, ConfigError, StorageError

C = TypeVar("C")


class SqlEngine(ShowsUrl):
    """Statement text for one engine. Statements are written with qmark placeholders
    (``?``) and ``{name}`` templates; :meth:`_sql` fills the names, rewrites the
    placeholders to the engine's ``placeholder`` and caches the result."""

    placeholder: ClassVar[str] = "?"  # what ``?`` becomes for this engine's driver

    def __init__(self, url: str, names: Mapping[str, str]) -> None:
        self._url = url  # to connect with; messages, logs and reprs show ``shown``
        self.shown = safe_url(url)
        self._names = dict(names)
        self._sql_cache: dict[str, str] = {}

    def _translate(self, exc: Exception) -> Exception | None:
        """The Foundry error for a driver error (``None``: not a driver error)."""
        raise NotImplementedError

    def _sql(self, sql: str) -> str:
        out = self._sql_cache.get(sql)
        if out is None:
            text = sql
            for name, value in self._names.items():
                text = text.replace(name, value)
            if self.placeholder != "?":
                text = text.replace("?", self.placeholder)
            out = self._sql_cache[sql] = text
        return out


PREFIX_SQL = "id >= ? AND id < ?"
"""The rows whose ``id`` begins with a prefix, as a range over the index on ``id`` (a
``LIKE 'abc%'`` uses no index on SQLite, which compares LIKE case-insensitively, nor on
PostgreSQL outside the C collation); its parameters are :func:`prefix_range`'s."""


def prefix_range(prefix: str) -> tuple[str, str]:
    """``(low, high)``: every string that begins with ``prefix`` sorts in ``[low, high)``
    by code point, SQLite's BINARY order and PostgreSQL's under the C (or C.UTF-8)
    collation. (Under a linguistic collation the range may miss ids with punctuation, so
    callers still check ``startswith``; Foundry's own ids are hex and sort alike in any.)"""
    last = ord(prefix[-1])
    if last >= 0x10FFFF:
        return prefix, prefix + "\U0010ffff"
    return prefix, prefix[:-1] + chr(last + 1)


def _close(conn: Any) -> None:
    conn.close()


def make_pool(
    connect: Callable[[], C], *, size: int, what: str, broken: Callable[[C], bool] = lambda conn: False
) -> Pool[C]:
    """A pool of ``size`` DB-API connections (closed with ``close()``); a caller waits at
    most 60 s for one."""
    return Pool(connect, _close, size=size, timeout=60.0, broken=broken, what=what)


def sqlite_contended(exc: BaseException, *, busy: bool = True) -> bool:
    """Whether ``exc`` is SQLite reporting another connection's lock ("database is locked";
    with ``busy``, also "database is busy"): transient, worth waiting out."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    text = str(exc)
    return "locked" in text or (busy and "busy" in text)


def sqlite_error(
    exc: Exception, what: str, *, busy: bool, fix: str, path: str | None = None
) -> Exception | None:
    """The Foundry error for a :mod:`sqlite3` error: a lock held too long (and, with
    ``busy``, a busy database) is transient, told with ``fix``; a full disk or a file
    that cannot be written (``path`` names it) is a :class:`StorageError` saying what to
    do; anything else is a :class:`BackendError`. ``None`` for an exception that is not
    SQLite's."""
    if sqlite_contended(exc, busy=busy):
        return BackendUnavailableError(f"{what}: the database stayed locked ({exc}). Fix: {fix}")
    if isinstance(exc, sqlite3.Error):
        storage = storage_error(exc, what, path)
        if storage is not None:
            return storage
        return BackendError(f"{what}: SQLite failed ({type(exc).__name__}: {exc})")
    return None


def storage_error(exc: BaseException, what: str, path: str | None) -> StorageError | None:
    """A :class:`StorageError` for a SQLite error (or an ``OSError``) that means the
    file cannot be written — the disk is full, or the file, its folder or the file system
    is read-only — naming the file and the fix; ``None`` for any other error."""
    name = str(getattr(exc, "sqlite_errorname", "") or "")
    errno_ = getattr(exc, "errno", None) if isinstance(exc, OSError) else None
    file = path or "the database file"
    folder = str(Path(path).resolve().parent) if path else "its folder"
    who = f"uid {os.getuid()}" if hasattr(os, "getuid") else "this user"
    if name == "SQLITE_FULL" or errno_ in (errno.ENOSPC, errno.EDQUOT):
        return StorageError(
            f"{what}: the disk is full ({exc}): SQLite cannot write {file} or its -wal journal, so no job "
            f"can be claimed, finished or submitted. Fix: free space on the file system holding {folder} "
            f"(see `df -h {folder}`), or move the queue to a file on another disk"
        )
    if name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN")) or errno_ in (
        errno.EROFS,
        errno.EACCES,
        errno.EPERM,
    ):
        return StorageError(
            f"{what}: {file} cannot be opened for writing ({exc}): the file, its -wal/-shm files or the "
            f"folder {folder} is read-only for this process ({who}), or the file system is mounted "
            f"read-only. Fix: make {file}, {file}-wal, {file}-shm and {folder} writable by {who}, or "
            "mount the file system read-write, or point the URL at a writable place"
        )
    if name.startswith("SQLITE_IOERR"):
        return StorageError(
            f"{what}: the disk failed a read or write of {file} ({exc}). Fix: check the disk and the "
            f"file system holding {folder} (free space, `dmesg` for I/O errors)"
        )
    return None


_TABLE_PREFIX = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_sql_url(
    family: str, url: str, own: Sequence[str] | None = None
) -> tuple[SplitResult, dict[str, str], str]:
    """The one reading of a SQL engine's URL, for every family: ``(parts, query options,
    table prefix)``. ``prefix`` (default ``foundry_``) names tables, so it is ASCII
    letters, digits and ``_``, not starting with a digit. With ``own``, an option outside
    it (and ``prefix``) is refused, except on PostgreSQL, which hands the rest to libpq."""
    parts = urlsplit(url)
    if own is None or parts.scheme.lower() in ("postgresql", "postgres"):  # libpq takes the rest
        query = query_options(url)
    else:
        query = url_options(family, url, sorted({*own, "prefix"}))
    prefix = query.get("prefix", "foundry_")
    if not _TABLE_PREFIX.fullmatch(prefix):
        raise ConfigError(
            f"{family} URL {safe_url(url)!r}: prefix={prefix!r} must be letters, digits and _, not "
            "starting with a digit (a table name prefix). Fix: e.g. ?prefix=myapp_"
        )
    return parts, query, prefix


def sqlite_connect(
    target: str, *, timeout: float, synchronous: str, wal: bool = True, uri: bool = False
) -> sqlite3.Connection:
    """The one way an engine opens a SQLite connection: autocommit (the engine writes its
    own ``BEGIN``), shared across threads, ``timeout`` seconds of waiting for a lock, the
    WAL journal (``wal``; not for an in-memory database) and ``synchronous`` (``FULL``,
    ``NORMAL``…). A ``sqlite3.Error`` is the caller's to map; the connection is closed
    when a setting fails."""
    # The set-up waits for locks longer than the caller's operations may: a writer that runs
    # on timeout=0 (it handles "busy" itself) must still open a file that several processes
    # open at the same moment, while one of them converts it to WAL or recovers its WAL.
    # Switching the journal mode can report "locked" without calling the busy handler, so
    # it is also retried, within the same bound.
    conn = sqlite3.connect(
        target, isolation_level=None, check_same_thread=False, timeout=max(timeout, _OPEN_WAIT), uri=uri
    )
    try:
        deadline = time.monotonic() + _OPEN_WAIT
        while True:
            try:
                if wal:
                    conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
                break
            except sqlite3.OperationalError as exc:
                if not sqlite_contended(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.02)
        if timeout < _OPEN_WAIT:
            conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
    except BaseException:
        conn.close()
        raise
    return conn


_OPEN_WAIT = 10.0  # seconds an opening connection waits for another process's lock


def sqlite_file(url: str, kind: str) -> str:
    """The file a ``sqlite:///`` URL names (:func:`sqlite_path`); its folder is created.
    ``kind`` is ``"queue"`` or ``"journal"``."""
    path = sqlite_path(url)
    if not path:
        raise ConfigError(
            f"{kind} URL {safe_url(url)!r} names no file. Fix: sqlite:///{kind}.db (relative) or "
            f"sqlite:////var/lib/app/{kind}.db (absolute)"
        )
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error(exc, f"{kind} {safe_url(url)}", path) or ConfigError(
            f"{kind} URL {safe_url(url)!r}: cannot create the folder of {path} ({exc}). Fix: correct the "
            "path, or create the folder"
        ) from exc
    return path


@functools.cache
def _bytea_dumper(psycopg: Any) -> Any:
    """A psycopg dumper sending bytes-like values as bytea in binary, as themselves: the
    default sends ``%s`` bytes as hex text (twice the size, built in another copy), and
    its binary dumper copies the value once more before libpq copies it into its buffer."""
    from psycopg.adapt import Dumper
    from psycopg.pq import Format

    class BytesAsThemselves(Dumper):
        format = Format.BINARY
        oid = psycopg.adapters.types["bytea"].oid

        def dump(self, obj: Any) -> Any:
            return obj

    return BytesAsThemselves


IDLE_IN_TRANSACTION = "10s"
"""The server ends a session of ours that sits inside a transaction this long. Foundry's
own transactions never wait on user code (a claim, a heartbeat, a record: a few
statements), so only a client that vanished mid-transaction — its machine cut off, its
TCP connection hanging rather than closed — leaves one open; without this its row locks
would pin the rows it was touching (every other worker's ``SKIP LOCKED`` skips them)
until the server's TCP keepalive gives up. With it, those rows' leases lapse and another
worker takes them within this time plus the lease."""

SESSION_SETTINGS = {
    "idle_in_transaction_session_timeout": IDLE_IN_TRANSACTION,
    # The server probes an idle client after 10 s and drops it after three unanswered
    # probes 5 s apart: a client cut off *inside* user code (a workflow's transactional
    # step, exempt from the timeout above) releases its locks within ~25 s, not the
    # kernel's default two hours.
    "tcp_keepalives_idle": "10",
    "tcp_keepalives_interval": "5",
    "tcp_keepalives_count": "3",
}
"""Server settings of every session of the PostgreSQL queue and journal."""


class Postgres:
    """psycopg 3 connections to one database, in one schema: the libpq connection
    string (the URL without Foundry's own options, ``connect_timeout=10`` unless
    given), connecting, the error mapping and the pool."""

    def __init__(
        self,
        psycopg: Any,
        what: str,
        parts: SplitResult,
        options: Mapping[str, str],
        schema: str,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        self.psycopg = psycopg
        self.what = what
        self.schema = schema
        # Server settings for every session (``-c name=value``), e.g. a queue's
        # idle_in_transaction_session_timeout.
        self.settings = "".join(f" -c {name}={value}" for name, value in (settings or {}).items())
        libpq = dict(options)
        libpq.setdefault("connect_timeout", "10")
        self.conninfo = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(libpq), ""))

    def connect(self) -> Any:
        """An autocommit connection whose ``search_path`` is the schema. Bytes go to the
        server in binary, as themselves (:func:`_bytea_dumper`)."""
        try:
            conn = self.psycopg.connect(
                self.conninfo, autocommit=True, options=f"-c search_path={self.schema}{self.settings}"
            )
        except self.psycopg.Error as exc:
            raise BackendUnavailableError(
                f"{self.what}: cannot connect ({exc}). Fix: check that PostgreSQL is up and the URL's "
                "host, port, user and database"
            ) from exc
        for kind in (bytes, bytearray, memoryview):
            conn.adapters.register_dumper(kind, _bytea_dumper(self.psycopg))
        return conn

    def pool(self, size: int) -> Pool[Any]:
        """``size`` connections from :meth:`connect`; one the server dropped is thrown away."""
        return make_pool(
            self.connect, size=size, what=self.what, broken=lambda conn: bool(conn.closed or conn.broken)
        )

    def translate(self, exc: Exception) -> Exception | None:
        """The Foundry error for a psycopg error (``None``: not one)."""
        psycopg = self.psycopg
        if isinstance(exc, psycopg.OperationalError):
            return BackendUnavailableError(
                f"{self.what}: PostgreSQL is unreachable ({exc}). Fix: usually transient (a restart); "
                "callers retry"
            )
        if isinstance(exc, psycopg.Error):
            return BackendError(f"{self.what}: PostgreSQL failed ({type(exc).__name__}: {exc})")
        return None


class PgListener:
    """One ``LISTEN`` connection on one channel, read by a daemon thread.

    :meth:`start` starts the thread unless it runs. Each notification calls
    ``heard(payload)``. ``missed()`` is called once listening starts (or starts again after
    a lost connection) and when the connection is lost, since whatever was sent while
    nobody listened is gone: the owner's waiters should look again. A lost connection
    (a server restart) is reconnected with back-off (0.1 s doubling to 2 s). Every
    ``tick`` seconds the thread asks ``keep()``: ``False`` ends it (until the next
    :meth:`start`), so a process that stopped waiting holds no connection. :meth:`stop`
    ends it for good; ``wake`` (e.g. a ``pg_notify`` on the channel) cuts its last tick
    short.
    """

    def __init__(
        self,
        pg: Postgres,
        channel: str,
        *,
        heard: Callable[[str], None],
        missed: Callable[[], None],
        keep: Callable[[], bool] = lambda: True,
        name: str,
        log: logging.Logger,
        tick: float = 1.0,
    ) -> None:
        self._pg = pg
        self.channel = channel
        self._heard = heard
        self._missed = missed
        self._keep = keep
        self._name = name
        self._log = log
        self._tick = tick
        self._lock = threading.Lock()  # guards _thread: a start never races an idle exit
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stop.is_set()

    def start(self) -> None:
        """Listen, unless already listening or stopped (the thread connects on its own)."""
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    def stop(self, wake: Callable[[], None] | None = None, timeout: float = 5.0) -> None:
        """Stop for good; ``wake`` is called to cut the thread's wait short."""
        self._stop.set()
        with self._lock:
            thread = self._thread
        if thread is None or thread is threading.current_thread():
            return
        if wake is not None:
            try:
                wake()
            except Exception:  # the thread still sees the flag within a tick
                pass
        thread.join(timeout)

    def _idle_exit(self) -> bool:
        """Under the lock: end the thread when stopped or no longer wanted."""
        with self._lock:
            if self._stop.is_set() or not self._keep():
                self._thread = None
                return True
            return False

    def _run(self) -> None:
        psycopg, pause = self._pg.psycopg, 0.1
        what = self._pg.what
        while not self._idle_exit():
            try:
                conn = psycopg.connect(self._pg.conninfo, autocommit=True)
            except psycopg.Error as exc:
                self._log.warning("%s: listener cannot connect (%s); retrying in %.1fs", what, exc, pause)
                self._stop.wait(pause)
                pause = min(pause * 2, 2.0)
                continue
            try:
                conn.execute(f'LISTEN "{self.channel}"')
                pause = 0.1
                self._missed()  # anything sent while nobody listened: look again
                while not self._stop.is_set():
                    for note in conn.notifies(timeout=self._tick):
                        if self._stop.is_set():
                            break
                        self._heard(note.payload)
                    if self._idle_exit():
                        return
            except psycopg.Error as exc:
                if not self._stop.is_set():
                    self._log.warning("%s: listener lost its connection (%s); reconnecting", what, exc)
                    self._missed()
                    self._stop.wait(pause)
                    pause = min(pause * 2, 2.0)
            finally:
                conn.close()
