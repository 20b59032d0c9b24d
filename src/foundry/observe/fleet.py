"""The fleet: which Foundry processes are running, where, and whether they still are.

Every long-running process (``foundry worker``, ``foundry workflows worker``,
``foundry streams consume``, or your own with :class:`Beacon`) writes one small record
— a *heartbeat* — every ``interval`` seconds (1 s by default) into a shared store; the
dashboard reads the store. A record says who the process is (role, app, host, pid,
start time), when it last reported, what it serves (queues, groups and the stream
partitions it owns), a compact copy of its in-memory metrics, and its last watchdog
reports. A process that exits cleanly writes ``status: "stopped"``; one that dies
(SIGKILL, OOM, a lost host) simply stops beating, and readers call it **down** once its
last beat is older than :func:`liveness`'s timeout (three intervals, at least 3 s) —
or at once, on the same host, when its pid is gone. A dead worker is never shown idle.

Stores, chosen by URL (``FOUNDRY_FLEET``, else derived by :func:`fleet_url`):

=================================  ============================================================
``file:///path/to/dir``            one JSON file per process (one host; the default,
                                   ``<FOUNDRY_HOME>/fleet``)
``redis://host:6379/0?prefix=p``   ``<p>:fleet:<id>`` keys with an expiry + a sorted set
``postgresql://…?schema=s``        one row per process in ``foundry_fleet``
=================================  ============================================================

**Cost.** One write of a few kilobytes per process per interval (a file replace, a
Redis pipeline of two commands, one upsert), and one read of the in-memory registry
without its collected gauges (``Registry.snapshot(collected=False)``: no database query
in the worker). Readers never contact the workers.

Records are hostile input to a reader: anything malformed, oversized or foreign is
skipped and counted, never trusted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from foundry.config import safe_url
from foundry.errors import BackendError, BackendUnavailableError, ConfigError
from foundry.observe.metrics import Registry

__all__ = [
    "Beacon",
    "FleetStore",
    "Member",
    "fleet_url",
    "liveness",
    "open_fleet",
    "parse_member",
]

log = logging.getLogger("foundry.fleet")

MAX_RECORD = 64 * 1024  # bytes of one record, written or read
MAX_MEMBERS = 1000  # records one read returns
MAX_ROWS = 400  # metric rows one record carries
KEEP = 3600.0  # seconds a record is kept after its last beat (then it is forgotten)
SCHEMES = ("file", "redis", "rediss", "postgresql", "postgres")


# -- the record -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Member:
    """One process of the fleet, as its last heartbeat described it."""

    id: str
    role: str  # "queue-worker", "workflow-worker", "stream-consumer", "exporter", ...
    app: str
    host: str
    pid: int
    started_at: float
    beat_at: float
    interval: float
    status: str  # "running" | "stopped"
    details: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    reports: tuple[dict[str, Any], ...] = ()


def _text(value: Any, limit: int = 200) -> str:
    if not isinstance(value, str) or not value or len(value) > limit:
        raise ValueError(value)
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise ValueError(value)
    return float(value)


def parse_member(raw: bytes | str) -> Member | None:
    """A record read from a store, or ``None`` when it is malformed or too large."""
    if len(raw) > MAX_RECORD:
        return None
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("v") != 1:
            return None
        details = data.get("details", {})
        metrics = data.get("metrics", {})
        reports = data.get("reports", [])
        if not isinstance(details, dict) or not isinstance(metrics, dict) or not isinstance(reports, list):
            return None
        clean_metrics: dict[str, list[dict[str, Any]]] = {}
        for name, rows in metrics.items():
            if isinstance(name, str) and isinstance(rows, list):
                clean_metrics[name] = [
                    r for r in rows if isinstance(r, dict) and isinstance(r.get("labels"), dict)
                ]
        return Member(
            id=_text(data["id"]),
            role=_text(data["role"], 60),
            app=_text(data.get("app") or "-", 200),
            host=_text(data["host"], 255),
            pid=int(_number(data["pid"])),
            started_at=_number(data["started_at"]),
            beat_at=_number(data["beat_at"]),
            interval=max(0.05, _number(data["interval"])),
            status="stopped" if data.get("status") == "stopped" else "running",
            details=details,
            metrics=clean_metrics,
            reports=tuple(r for r in reports[:20] if isinstance(r, dict)),
        )
    except (ValueError, KeyError, TypeError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def liveness(
    member: Member,
    now: float,
    *,
    this_host: str | None = None,
    pid_alive: Callable[[int], bool] = _pid_alive,
) -> tuple[str, str]:
    """``("up" | "down" | "stopped", why)`` for a member at time ``now``.

    Down when the last beat is older than three intervals (at least 3 s), or at once when
    the member runs on ``this_host`` and its pid no longer exists."""
    if member.status == "stopped":
        return "stopped", "exited cleanly"
    silent = now - member.beat_at
    if this_host is not None and member.host == this_host and not pid_alive(member.pid):
        return "down", f"pid {member.pid} is gone (last report {silent:.1f}s ago)"
    timeout = max(3.0, 3 * member.interval)
    if silent > timeout:
        return "down", f"no report for {silent:.1f}s (timeout {timeout:.0f}s)"
    return "up", f"reported {max(0.0, silent):.1f}s ago"


# -- stores -----------------------------------------------------------------------------


class FleetStore(Protocol):
    """Where heartbeats go. ``put`` replaces the member's record (idempotent);
    ``members`` returns the records beaten within ``KEEP`` seconds (at most
    ``MAX_MEMBERS``, malformed ones skipped); both may raise
    :class:`~foundry.errors.BackendUnavailableError`."""

    url: str

    def put(self, member_id: str, beat_at: float, record: bytes) -> None: ...

    def members(self) -> list[Member]: ...

    def close(self) -> None: ...


class FileFleet:
    """One JSON file per member in a directory (every process on one host)."""

    def __init__(self, url: str) -> None:
        self.url = url
        path = unquote(urlsplit(url).path)
        if not path:
            raise ConfigError(
                f"fleet URL {safe_url(url)!r} names no directory. Fix: file:///var/lib/app/fleet"
            )
        self.dir = Path(path)

    def put(self, member_id: str, beat_at: float, record: bytes) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        target = self.dir / f"{member_id}.json"
        tmp = self.dir / f".{member_id}.{os.getpid()}.tmp"
        tmp.write_bytes(record)
        os.replace(tmp, target)

    def members(self) -> list[Member]:
        out: list[Member] = []
        if not self.dir.is_dir():
            return out
        horizon = time.time() - KEEP
        with os.scandir(self.dir) as entries:
            for entry in entries:
                if len(out) >= MAX_MEMBERS:
                    break
                if not entry.name.endswith(".json") or entry.name.startswith("."):
                    continue
                try:
                    info = entry.stat()
                    if info.st_size > MAX_RECORD or info.st_mtime < horizon:
                        continue
                    with open(entry.path, "rb") as fh:
                        member = parse_member(fh.read(MAX_RECORD + 1))
                except OSError:
                    continue
                if member is not None:
                    out.append(member)
        return out

    def close(self) -> None:
        return None


class RedisFleet:
    """``<prefix>:fleet:<id>`` (the record, expiring after ``KEEP``) and the sorted set
    ``<prefix>:fleet`` of ids by last beat."""

    def __init__(self, url: str) -> None:
        try:
            import redis
        except ModuleNotFoundError as exc:
            raise ConfigError(
                f'fleet URL {safe_url(url)!r} needs the redis client. Fix: pip install "foundry-exec[redis]"'
            ) from exc
        self.url = url
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        self.prefix = query.pop("prefix", "foundry") + ":fleet"
        query = {k: v for k, v in query.items() if k.startswith(("ssl_", "socket_"))}
        base = urlunsplit(parts._replace(query=urlencode(query)))
        self._errors = (redis.RedisError, OSError)
        self.client = redis.Redis.from_url(base, socket_timeout=2.0, socket_connect_timeout=2.0)

    def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except self._errors as exc:
            raise BackendUnavailableError(
                f"fleet {safe_url(self.url)}: Redis failed ({type(exc).__name__}: {exc}). Fix: check Redis"
            ) from exc

    def put(self, member_id: str, beat_at: float, record: bytes) -> None:
        def run() -> None:
            pipe = self.client.pipeline(transaction=False)
            pipe.set(f"{self.prefix}:{member_id}", record, ex=int(KEEP))
            pipe.zadd(self.prefix, {member_id: beat_at})
            pipe.execute()

        self._call(run)

    def members(self) -> list[Member]:
        def run() -> list[Any]:
            now = time.time()
            self.client.zremrangebyscore(self.prefix, "-inf", now - KEEP)
            ids: list[Any] = list(
                self.client.zrevrangebyscore(self.prefix, "+inf", now - KEEP, start=0, num=MAX_MEMBERS)
            )
            if not ids:
                return []
            keys = [f"{self.prefix}:{i.decode() if isinstance(i, bytes) else i}" for i in ids]
            return list(self.client.mget(keys))

        found = (parse_member(raw) for raw in self._call(run) if raw is not None)
        return [m for m in found if m is not None]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()


class PostgresFleet:
    """One row per member in ``foundry_fleet`` (schema ``?schema=``, default public)."""

    def __init__(self, url: str) -> None:
        try:
            import psycopg
        except ModuleNotFoundError as exc:
            raise ConfigError(
                f'fleet URL {safe_url(url)!r} needs psycopg. Fix: pip install "foundry-exec[postgres]"'
            ) from exc
        self.url = url
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        schema = query.pop("schema", "public")
        if not schema.replace("_", "").isalnum():
            raise ConfigError(f"fleet URL {safe_url(url)!r}: schema={schema!r} is not a plain name")
        query.setdefault("connect_timeout", "5")
        self._psycopg = psycopg
        self._conninfo = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))
        self._table = f'"{schema}".foundry_fleet'
        self._conn: Any = None
        self._lock = threading.Lock()

    def _execute(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = self._psycopg.connect(self._conninfo, autocommit=True)
                    errors = self._psycopg.errors
                    with contextlib.suppress(errors.UniqueViolation, errors.DuplicateTable):  # a racing twin
                        self._conn.execute(
                            f"CREATE TABLE IF NOT EXISTS {self._table} "
                            "(id TEXT PRIMARY KEY, beat_at DOUBLE PRECISION NOT NULL, record TEXT NOT NULL)"
                        )
                cur = self._conn.execute(sql, params)
                return list(cur.fetchall()) if cur.description else []
            except self._psycopg.Error as exc:
                if self._conn is not None:
                    with contextlib.suppress(Exception):
                        self._conn.close()
                    self._conn = None
                raise BackendUnavailableError(
                    f"fleet {safe_url(self.url)}: PostgreSQL failed ({type(exc).__name__}). "
                    "Fix: check the server"
                ) from exc

    def put(self, member_id: str, beat_at: float, record: bytes) -> None:
        self._execute(
            f"INSERT INTO {self._table} (id, beat_at, record) VALUES (%s, %s, %s) "
            "ON CONFLICT (id) DO UPDATE SET beat_at = EXCLUDED.beat_at, record = EXCLUDED.record",
            (member_id, beat_at, record.decode()),
        )

    def members(self) -> list[Member]:
        horizon = time.time() - KEEP
        self._execute(f"DELETE FROM {self._table} WHERE beat_at < %s", (horizon,))
        rows = self._execute(
            f"SELECT record FROM {self._table} ORDER BY beat_at DESC LIMIT %s", (MAX_MEMBERS,)
        )
        found = (parse_member(str(r[0])) for r in rows)
        return [m for m in found if m is not None]

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None


def open_fleet(url: str) -> FleetStore:
    """The fleet store at ``url`` (``file://``, ``redis://``, ``postgresql://``)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "file":
        return FileFleet(url)
    if scheme in ("redis", "rediss"):
        return RedisFleet(url)
    if scheme in ("postgresql", "postgres"):
        return PostgresFleet(url)
    raise ConfigError(
        f"fleet URL {safe_url(url)!r} has scheme {scheme or '(none)'!r}. "
        f"Fix: use one of {', '.join(s + '://' for s in SCHEMES)}"
    )


def fleet_url(settings: Any, explicit: str | None = None) -> str:
    """Where the fleet beats: ``explicit``, else ``FOUNDRY_FLEET``, else the queue's Redis
    or PostgreSQL (a fleet that shares a queue engine shares its roster), else the
    journal's PostgreSQL, else ``<home>/fleet`` on this host."""
    chosen = explicit or os.environ.get("FOUNDRY_FLEET")
    if chosen:
        return chosen
    url: str
    for url in (str(settings.queue), str(settings.journal)):
        scheme = url.split("://", 1)[0].lower()
        if scheme in ("redis", "rediss", "postgresql", "postgres"):
            if scheme.startswith("redis"):
                parts = urlsplit(url)
                keep = {k: v for k, v in parse_qsl(parts.query) if k == "prefix" or k.startswith("ssl_")}
                return urlunsplit(parts._replace(query=urlencode(keep)))
            return url
    return Path(settings.home, "fleet").resolve().as_uri()


# -- the beacon: the process side ---------------------------------------------------------


def compact_metrics(snapshot: Mapping[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """The rows a heartbeat carries: every ``foundry_*`` family, numbers rounded, at most
    ``MAX_ROWS`` rows."""
    out: dict[str, list[dict[str, Any]]] = {}
    rows = 0
    for name, samples in snapshot.items():
        if not name.startswith("foundry_"):
            continue
        kept: list[dict[str, Any]] = []
        for row in samples:
            if rows >= MAX_ROWS:
                break
            slim: dict[str, Any] = {"labels": row.get("labels", {})}
            for key in ("value", "rate", "count", "p50", "p99", "max"):
                if key in row:
                    slim[key] = round(float(row[key]), 6)
            kept.append(slim)
            rows += 1
        if kept:
            out[name] = kept
    return out


class _Reports(logging.Handler):
    """Keeps the last watchdog reports (the ``foundry.watchdog`` logger) for the beat."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.recent: deque[dict[str, Any]] = deque(maxlen=10)

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.recent.append({"at": record.created, "message": record.getMessage()[:2000]})


class Beacon:
    """Writes this process's heartbeat every ``interval`` seconds until ``stop()``.

    ``details`` (a dict, or a function returning one, called at each beat) says what the
    process serves: ``{"queues": [...], "units": [...], "streams": [{"stream", "group",
    "consumer", "owned": [partitions]}], "exporter": "http://..."}``. A failed write is
    logged once and retried at the next beat: the fleet store never stops a worker.
    """

    def __init__(
        self,
        store: FleetStore | str,
        *,
        role: str,
        app: str = "-",
        registry: Registry | None = None,
        interval: float = 1.0,
        details: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        if not interval > 0:
            raise ConfigError(f"fleet beacon: interval={interval!r} must be > 0 seconds (e.g. 1)")
        self.store: FleetStore = open_fleet(store) if isinstance(store, str) else store
        self._own_store = isinstance(store, str)
        self.role = role
        self.app = app
        self.registry = registry
        self.interval = interval
        self._details = details
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.id = f"{self.host.split('.')[0]}-{self.pid}-{uuid.uuid4().hex[:8]}"
        self.started_at = time.time()
        self.beats = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reports = _Reports()
        self._failing = False

    def record(self, status: str = "running") -> bytes:
        """This process's heartbeat record, as written."""
        details = self._details() if callable(self._details) else (self._details or {})
        metrics: dict[str, list[dict[str, Any]]] = {}
        if self.registry is not None:
            metrics = compact_metrics(self.registry.snapshot(collected=False))
        body: dict[str, Any] = {
            "v": 1,
            "id": self.id,
            "role": self.role,
            "app": self.app,
            "host": self.host,
            "pid": self.pid,
            "started_at": self.started_at,
            "beat_at": time.time(),
            "interval": self.interval,
            "status": status,
            "details": dict(details),
            "metrics": metrics,
            "reports": list(self._reports.recent),
        }
        data = json.dumps(body, separators=(",", ":"), default=str).encode()
        if len(data) > MAX_RECORD:  # too many series: identity and details still go out
            body["metrics"] = {}
            body["details"] = {"truncated": True}
            data = json.dumps(body, separators=(",", ":"), default=str).encode()
        return data

    def beat(self, status: str = "running") -> None:
        """Write one heartbeat now."""
        try:
            self.store.put(self.id, time.time(), self.record(status))
            self.beats += 1
            if self._failing:
                log.info("fleet %s reachable again", safe_url(self.store.url))
            self._failing = False
        except (BackendError, OSError) as exc:
            if not self._failing:
                log.warning(
                    "fleet heartbeat to %s failed (%s); retrying each beat", safe_url(self.store.url), exc
                )
            self._failing = True

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.beat()

    def start(self) -> Beacon:
        if self._thread is None:
            logging.getLogger("foundry.watchdog").addHandler(self._reports)
            self.beat()
            self._thread = threading.Thread(target=self._run, name="foundry-fleet-beacon", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop beating and record a clean exit (``status: "stopped"``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
            logging.getLogger("foundry.watchdog").removeHandler(self._reports)
            self.beat("stopped")
        if self._own_store:
            self.store.close()

    def __enter__(self) -> Beacon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def fleet_beacon(
    app: Any,
    role: str,
    details: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
    *,
    interval: float | None = None,
) -> Beacon:
    """Start the heartbeat of a process that runs ``app`` (a ``Foundry``): into the store
    :func:`fleet_url` picks for the app's settings, with the app's metrics.
    ``FOUNDRY_FLEET_INTERVAL`` overrides the 1 s interval."""
    every = interval if interval is not None else float(os.environ.get("FOUNDRY_FLEET_INTERVAL", "1") or 1)
    return Beacon(
        fleet_url(app.settings),
        role=role,
        app=app.name,
        registry=app.metrics,
        interval=every,
        details=details,
    ).start()
