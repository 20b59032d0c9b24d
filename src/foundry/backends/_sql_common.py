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

import logging
import sqlite3
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar
from urllib.parse import SplitResult, urlencode, urlunsplit

from foundry.backends.journal._pool import Pool
from foundry.config import safe_url
from foundry.errors import BackendError, BackendUnavailableError, ConfigError

C = TypeVar("C")


class SqlEngine:
    """Statement text for one engine. Statements are written with qmark placeholders
    (``?``) and ``{name}`` templates; :meth:`_sql` fills the names, rewrites the
    placeholders to the engine's ``placeholder`` and caches the result."""

    placeholder: ClassVar[str] = "?"  # what ``?`` becomes for this engine's driver

    def __init__(self, url: str, names: Mapping[str, str]) -> None:
        self.url = url  # to connect with; messages, logs and reprs show ``shown``
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

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.shown}>"


def _close(conn: Any) -> None:
    conn.close()


def make_pool(
    connect: Callable[[], C], *, size: int, what: str, broken: Callable[[C], bool] = lambda conn: False
) -> Pool[C]:
    """A pool of ``size`` DB-API connections (closed with ``close()``); a caller waits at
    most 60 s for one."""
    return Pool(connect, _close, size=size, timeout=60.0, broken=broken, what=what)


def sqlite_error(exc: Exception, what: str, *, busy: bool, fix: str) -> Exception | None:
    """The Foundry error for a :mod:`sqlite3` error: a lock held too long (and, with
    ``busy``, a busy database) is transient, told with ``fix``; anything else is a
    :class:`BackendError`. ``None`` for an exception that is not SQLite's."""
    if isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or (busy and "busy" in str(exc))):
        return BackendUnavailableError(f"{what}: the database stayed locked ({exc}). Fix: {fix}")
    if isinstance(exc, sqlite3.Error):
        return BackendError(f"{what}: SQLite failed ({type(exc).__name__}: {exc})")
    return None


def sqlite_file(url: str, kind: str) -> str:
    """The file a ``sqlite:///`` URL names (relative, or absolute with four slashes);
    its folder is created. ``kind`` is ``"queue"`` or ``"journal"``."""
    raw = url.split("?", 1)[0][len("sqlite://") :]
    path = raw[1:] if raw.startswith("/") else raw
    if not path:
        raise ConfigError(
            f"{kind} URL {safe_url(url)!r} names no file. Fix: sqlite:///{kind}.db (relative) or "
            f"sqlite:////var/lib/app/{kind}.db (absolute)"
        )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return path


class Postgres:
    """psycopg 3 connections to one database, in one schema: the libpq connection
    string (the URL without Foundry's own options, ``connect_timeout=10`` unless
    given), connecting, the error mapping and the pool."""

    def __init__(
        self, psycopg: Any, what: str, parts: SplitResult, options: Mapping[str, str], schema: str
    ) -> None:
        self.psycopg = psycopg
        self.what = what
        self.schema = schema
        libpq = dict(options)
        libpq.setdefault("connect_timeout", "10")
        self.conninfo = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(libpq), ""))

    def connect(self) -> Any:
        """An autocommit connection whose ``search_path`` is the schema."""
        try:
            return self.psycopg.connect(
                self.conninfo, autocommit=True, options=f"-c search_path={self.schema}"
            )
        except self.psycopg.Error as exc:
            raise BackendUnavailableError(
                f"{self.what}: cannot connect ({exc}). Fix: check that PostgreSQL is up and the URL's "
                "host, port, user and database"
            ) from exc

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
