"""Schedule records: the durable per-schedule watermark kept beside the jobs, in the
queue's own engine.

A schedule's ticks become queue jobs with an idempotency key naming the tick
(``<unit>:schedule:<UTC time>``), so any number of schedulers racing for one tick make
one job (the queue contract: enqueue is idempotent on ``key``). What the key cannot say
is *which ticks are settled*: a job's record expires after its ``result_ttl``, and a
restarted scheduler must know whether the ticks of last month already ran. That is this
record, one per schedule:

* ``last_tick`` — the **watermark**: every tick at or before it is settled (its job was
  enqueued, or it came before the schedule was first seen). Schedulers write it *after*
  enqueuing the tick's job, so a crash between the two re-enqueues the same key: nothing
  is lost, nothing doubled;
* ``last_job`` — the id of the job of the tick at ``last_tick`` (``""`` when the
  watermark is the moment the schedule was first seen, before any tick);
* ``expression``, ``tz`` — the schedule as last declared (``foundry schedules list``
  shows the next run without the app's code); ``updated_at`` — when it was written.

The contract (``tests/schedules/test_store.py``, on every engine):

* **The watermark only moves forward.** :meth:`ScheduleStore.advance` writes the record
  when there is none or its ``last_tick`` is later than the stored one, atomically
  (one statement or one script), and otherwise changes nothing and returns ``False`` —
  so concurrent schedulers converge on the latest tick whatever order they write in.
* **Records are durable** as the engine's jobs are (a committed row, a Redis hash under
  the engine's persistence settings), and survive every process.
* **A record that is not Foundry's** (altered in the store) is skipped by
  :meth:`~ScheduleStore.records` and read as absent by :meth:`~ScheduleStore.get`; a
  scheduler then treats the schedule as new, and the tick keys still prevent a second
  job for a tick.

Where they live: SQLite and PostgreSQL, a table ``<prefix>schedules`` beside
``<prefix>jobs`` (same file or schema); Redis, the hash ``<prefix>:schedules`` (field:
the unit, value: the record as JSON); RabbitMQ, its state store (one of those).
:func:`schedule_store` picks by the backend, reusing its connections.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from typing import Any, Protocol

from foundry.backends.queue._sql import SqlQueue
from foundry.backends.queue.base import QueueBackend
from foundry.errors import ConfigError

__all__ = ["ScheduleRecord", "ScheduleStore", "schedule_store"]

MAX_RECORDS = 10_000  # records() returns at most this many


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """One schedule's durable state (see the module docstring)."""

    name: str
    expression: str
    tz: str
    last_tick: float
    last_job: str = ""
    updated_at: float = 0.0


class ScheduleStore(Protocol):
    """The schedule records of one queue engine (see the module docstring)."""

    def advance(self, record: ScheduleRecord) -> bool:
        """Write ``record`` if its ``last_tick`` is later than the stored one (or there is
        none); ``True`` when it was written. Atomic."""
        ...

    def get(self, name: str) -> ScheduleRecord | None: ...

    def records(self) -> list[ScheduleRecord]:
        """Every well-formed record, by name (at most :data:`MAX_RECORDS`)."""
        ...


def _record(name: Any, expression: Any, tz: Any, last: Any, job: Any, at: Any) -> ScheduleRecord | None:
    """A record from stored values, or ``None`` when they are not Foundry's."""
    texts = (name, expression, tz, job)
    if not all(isinstance(v, str) and len(v) <= 1000 for v in texts) or not name:
        return None
    if isinstance(last, bool) or not isinstance(last, int | float) or not math.isfinite(last):
        return None
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
        at = 0.0
    return ScheduleRecord(name, expression, tz, float(last), job, float(at))


# -- SQL (SQLite, PostgreSQL, and RabbitMQ's SQL state stores) -----------------------------


class SqlSchedules:
    """``<prefix>schedules`` beside the queue's ``<prefix>jobs``, on its connections."""

    def __init__(self, queue: SqlQueue) -> None:
        self._q = queue
        self.table = queue.table.removesuffix("jobs") + "schedules"
        t = self.table
        self._ddl = (
            f"CREATE TABLE IF NOT EXISTS {t} (name TEXT PRIMARY KEY, expression TEXT NOT NULL, "
            "tz TEXT NOT NULL, last_tick DOUBLE PRECISION NOT NULL, last_job TEXT NOT NULL, "
            "updated_at DOUBLE PRECISION NOT NULL)"
        )
        self._upsert = (
            f"INSERT INTO {t} (name, expression, tz, last_tick, last_job, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET expression = excluded.expression, "
            "tz = excluded.tz, last_tick = excluded.last_tick, last_job = excluded.last_job, "
            f"updated_at = excluded.updated_at WHERE {t}.last_tick < excluded.last_tick"
        )
        self._select = f"SELECT name, expression, tz, last_tick, last_job, updated_at FROM {t}"
        self._ready = False

    def _create(self) -> None:
        if self._ready:
            return
        postgres = getattr(self._q, "schema", None)

        def create(conn: Any) -> None:
            if postgres is not None:  # concurrent CREATE ... IF NOT EXISTS can collide: serialise
                self._q.fetch_one(
                    conn, "SELECT pg_advisory_xact_lock(hashtext(?))", (f"foundry:{self.table}",)
                )
            self._q.execute(conn, self._ddl)

        self._q.commit(create, lambda _: ())
        self._ready = True

    def advance(self, record: ScheduleRecord) -> bool:
        self._create()
        r = record
        params = (r.name, r.expression, r.tz, float(r.last_tick), r.last_job, r.updated_at or time.time())
        written = self._q.commit(lambda conn: self._q.execute(conn, self._upsert, params), lambda _: ())
        return written > 0

    def get(self, name: str) -> ScheduleRecord | None:
        self._create()
        row = self._q.query(lambda conn: self._q.fetch_one(conn, self._select + " WHERE name = ?", (name,)))
        return None if row is None else _record(*row)

    def records(self) -> list[ScheduleRecord]:
        self._create()
        rows = self._q.query(
            lambda conn: self._q.fetch_all(conn, f"{self._select} ORDER BY name LIMIT {MAX_RECORDS}")
        )
        return [r for r in (_record(*row) for row in rows) if r is not None]


# -- Redis (and RabbitMQ's Redis state store) -----------------------------------------------

_ADVANCE_LUA = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if current then
  local ok, record = pcall(cjson.decode, current)
  if ok and type(record) == 'table' and type(record['last_tick']) == 'number'
      and record['last_tick'] >= tonumber(ARGV[3]) then
    return 0
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""


class RedisSchedules:
    """The hash ``<prefix>:schedules`` of the Redis queue, through its client."""

    def __init__(self, queue: Any) -> None:
        self._q = queue
        self.key = queue.prefix + "schedules"
        self._advance = queue.client.register_script(_ADVANCE_LUA)

    def advance(self, record: ScheduleRecord) -> bool:
        r = record
        body = json.dumps(
            {
                "expression": r.expression,
                "tz": r.tz,
                "last_tick": float(r.last_tick),
                "last_job": r.last_job,
                "updated_at": r.updated_at or time.time(),
            },
            separators=(",", ":"),
        )

        def call() -> Any:
            return self._advance(keys=[self.key], args=[r.name, body, repr(float(r.last_tick))])

        return bool(self._q.call("schedule advance", call))

    @staticmethod
    def _decode(name: Any, raw: Any) -> ScheduleRecord | None:
        try:
            text = name.decode() if isinstance(name, bytes) else name
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError, TypeError):
            return None
        if not isinstance(data, dict):
            return None
        return _record(
            text,
            data.get("expression"),
            data.get("tz"),
            data.get("last_tick"),
            data.get("last_job"),
            data.get("updated_at"),
        )

    def get(self, name: str) -> ScheduleRecord | None:
        raw = self._q.call("schedule get", self._q.client.hget, self.key, name)
        return None if raw is None else self._decode(name, raw)

    def records(self) -> list[ScheduleRecord]:
        found: list[ScheduleRecord] = []
        cursor: Any = 0
        while True:
            cursor, chunk = self._q.call(
                "schedule records", self._q.client.hscan, self.key, cursor, None, 500
            )
            for name, raw in chunk.items():
                record = self._decode(name, raw)
                if record is not None:
                    found.append(record)
            if not cursor or len(found) >= MAX_RECORDS:
                break
        return sorted(found, key=lambda r: r.name)[:MAX_RECORDS]


def schedule_store(backend: QueueBackend) -> ScheduleStore:
    """The schedule records of the engine behind ``backend`` (closed with it)."""
    state = getattr(backend, "state", None)
    if state is not None and callable(getattr(state, "claim_ids", None)):
        return schedule_store(state)  # RabbitMQ: the records live in its state store
    if isinstance(backend, SqlQueue):
        return SqlSchedules(backend)
    redis_engine = sys.modules.get("foundry.backends.queue.redis")
    if redis_engine is not None and isinstance(backend, redis_engine.RedisQueue):
        return RedisSchedules(backend)
    raise ConfigError(
        f"queue {backend.url}: {type(backend).__name__} keeps no schedule records. Fix: use a queue engine "
        "Foundry ships (sqlite://, postgresql://, redis://, amqp://) for scheduled units"
    )
