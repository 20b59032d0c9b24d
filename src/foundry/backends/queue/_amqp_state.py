"""The state store of the AMQP queue: where a job's record lives while RabbitMQ carries
the message that delivers it.

RabbitMQ has no key/value store, so idempotency keys, leases, the single completion
record, results, dead letters and counters live in one of Foundry's own queue stores —
the same tables (SQLite, PostgreSQL) or keys (Redis) as those engines, with a few more
operations that the AMQP engine needs and the :class:`QueueBackend` Protocol has no
use for: lease *these* jobs (the broker chose them), put lapsed leases back and say
which, the earliest lease deadline, the queued jobs that may have lost their message.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Sequence
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlsplit

from foundry.backends.queue._sql import CLAIM_COLS, SqlQueue, finite, job_topic
from foundry.backends.queue.base import Claimed, QueueBackend
from foundry.config import safe_url
from foundry.errors import ConfigError

__all__ = ["StateStore", "open_state"]

Other = tuple[str, str, float | None, int]  # (id, status or '', eta, priority) of a job not claimed


class StateStore(QueueBackend, Protocol):
    def claim_ids(
        self, queue: str, ids: Sequence[str], worker: str, lease: float
    ) -> tuple[list[Claimed], list[Other]]: ...

    def reap(self, queue: str) -> list[tuple[str, int]]: ...

    def next_deadline(self, queue: str) -> float | None: ...

    def orphans(self, queue: str, before: float, limit: int) -> list[tuple[str, int]]: ...

    def queues(self) -> list[str]: ...

    def destroy(self) -> None: ...


def _marks(n: int) -> str:
    return ", ".join("?" * n)


def _integer(value: Any) -> int:
    """A stored priority; 0 for a malformed one (it only orders broker messages)."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return 0


class SqlState(SqlQueue):
    """The extra operations over the SQL engines' ``jobs`` table (mixed into
    ``SqliteQueue`` / ``PostgresQueue``; every statement is portable SQL)."""

    def claim_ids(
        self, queue: str, ids: Sequence[str], worker: str, lease: float
    ) -> tuple[list[Claimed], list[Other]]:
        now = time.time()
        token = uuid.uuid4().hex

        def body(conn: Any) -> tuple[list[Any], list[Other]]:
            rows = self._all(
                conn,
                "UPDATE {jobs} SET status = 'running', token = ?, worker = ?, lease_until = ?, "
                "deliveries = deliveries + 1, started_at = ? WHERE id IN (" + _marks(len(ids)) + ") "
                # (queue || '') keeps SQLite's planner on the id index: on ``queue = ?`` it
                # picks the ready index and scans every queued job of the queue per claim.
                f"AND (queue || '') = ? AND status = 'queued' AND eta <= ? RETURNING {CLAIM_COLS}",
                (token, worker, now + lease, now, *ids, queue, now),
            )
            got = {r[0] for r in rows}
            claimed = self._lease_rows(conn, rows, now)
            rest = [i for i in ids if i not in got]
            if not rest:
                return claimed, []
            found = {
                r[0]: r
                for r in self._all(
                    conn,
                    "SELECT id, status, eta, priority FROM {jobs} WHERE id IN (" + _marks(len(rest)) + ")",
                    rest,
                )
            }
            others: list[Other] = [
                (i, str(found[i][1]), finite(found[i][2], None), _integer(found[i][3]))
                if i in found
                else (i, "", None, 0)
                for i in rest
            ]
            return claimed, others

        return self._commit(body, lambda _: ())

    def reap(self, queue: str) -> list[tuple[str, int]]:
        now = time.time()

        def body(conn: Any) -> tuple[list[tuple[str, int]], list[str]]:
            rows = self._all(
                conn,
                "SELECT id, priority FROM {jobs} WHERE queue = ? AND status = 'running' AND "
                "lease_until <= ? ORDER BY lease_until LIMIT 500{skip}",
                (queue, now),
            )
            if not rows:
                return [], []
            self._recover_lapsed(conn, queue, now)
            ids = [r[0] for r in rows]
            status = dict(
                self._all(conn, "SELECT id, status FROM {jobs} WHERE id IN (" + _marks(len(ids)) + ")", ids)
            )
            back = [(str(r[0]), _integer(r[1])) for r in rows if status.get(r[0]) == "queued"]
            return back, [i for i in ids if status.get(i) in ("dead", "cancelled")]

        back, _dead = self._commit(body, lambda v: [job_topic(str(i)) for i in v[1]])
        return back

    def next_deadline(self, queue: str) -> float | None:
        row = self._query(
            lambda conn: self._one(
                conn, "SELECT min(lease_until) FROM {jobs} WHERE queue = ? AND status = 'running'", (queue,)
            )
        )
        return None if row is None else finite(row[0], None)

    def orphans(self, queue: str, before: float, limit: int) -> list[tuple[str, int]]:
        rows = self._query(
            lambda conn: self._all(
                conn,
                "SELECT id, priority FROM {jobs} WHERE queue = ? AND status = 'queued' AND eta <= ? "
                "ORDER BY priority DESC, eta, seq LIMIT ?",
                (queue, before, limit),
            )
        )
        return [(str(r[0]), _integer(r[1])) for r in rows]

    def queues(self) -> list[str]:
        rows = self._query(lambda conn: self._all(conn, "SELECT DISTINCT queue FROM {jobs}"))
        return sorted(str(r[0]) for r in rows)

    def destroy(self) -> None:
        schedules = self.table.removesuffix("jobs") + "schedules"  # foundry.backends.queue.schedules

        def drop(conn: Any) -> None:
            self._run(conn, "DROP TABLE IF EXISTS {jobs}")
            self._run(conn, f"DROP TABLE IF EXISTS {schedules}")

        self._commit(drop, lambda _: ())


def open_state(url: str, prefix: str) -> StateStore:
    """Open the state store at ``url``, naming its tables or keys after ``prefix`` unless
    the URL says otherwise."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    query = dict(parse_qsl(urlsplit(url).query))
    sep = "&" if "?" in url else "?"
    if scheme in ("sqlite", "memory", "postgresql", "postgres"):
        if "prefix" not in query:
            url = f"{url}{sep}prefix={re.sub(r'[^A-Za-z0-9_]', '_', prefix)}_"
        if scheme in ("sqlite", "memory"):
            from foundry.backends.queue.sqlite import SqliteQueue

            class SqliteState(SqlState, SqliteQueue):
                pass

            return SqliteState(url)
        from foundry.backends.queue.postgres import PostgresQueue

        class PostgresState(SqlState, PostgresQueue):
            pass

        return PostgresState(url)
    if scheme in ("redis", "rediss"):
        from foundry.backends.queue.redis import RedisQueue

        if "prefix" not in query:
            url = f"{url}{sep}prefix={prefix}"
        return RedisQueue(url)
    raise ConfigError(
        f"AMQP queue: state={safe_url(url)!r} is not a store Foundry can keep job state in. Fix: use "
        "sqlite:///path, postgresql://…, redis://… or rediss://… (percent-encode it inside the amqp:// URL)"
    )
