"""The queue's logic in portable SQL; ``sqlite.py`` and ``postgres.py`` supply the
connections, the DDL, the way a write transaction runs, the error mapping and the
wake-up mechanism.

Statements are written with qmark placeholders (``?``), ``{jobs}`` for the table and
``{skip}`` for the engine's row-lock clause; an engine with another paramstyle gets
them rewritten once (:class:`~foundry.backends._sql_common.SqlEngine`). One row per job holds its whole
life: ``status`` moves queued → running → succeeded | failed | dead | cancelled, the
lease is ``(token, lease_until)`` on the row, and every write that belongs to a
delivery checks the token in the same statement (the fence).
"""

from __future__ import annotations

import functools
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar, TypeVar
from urllib.parse import SplitResult, parse_qs, urlsplit

from foundry.backends._sql_common import SqlEngine
from foundry.backends.queue.base import (
    Capabilities,
    Claimed,
    Enqueued,
    JobState,
    JobStatus,
    NewJob,
    QueueStats,
    check_new_job,
)
from foundry.config import safe_url
from foundry.errors import ConfigError, SubmitError

T = TypeVar("T")

FINISHED = ("succeeded", "failed", "dead", "cancelled")
_FINISHED_SQL = "(" + ", ".join(f"'{s}'" for s in FINISHED) + ")"
STATE_COLS = (
    "id, unit, queue, status, deliveries, attempts, result, error, dead_reason, codec, enqueued_at, "
    "finished_at, eta, priority, key, payload"
)
CLAIM_COLS = (
    "id, queue, unit, payload, codec, token, lease_until, deliveries, attempts, max_retries, "
    "max_deliveries, timeout, enqueued_at, priority, eta, seq"
)
INSERT_COLS = (
    "id, queue, unit, payload, codec, key, priority, eta, status, lease_until, deliveries, attempts, "
    "max_retries, max_deliveries, timeout, result_ttl, enqueued_at"
)
_MARKS = ", ".join("?" * len(INSERT_COLS.split(",")))
# A completion: kept from a stale delivery too (the work is done), but never over a final state.
_SUCCEED = (
    "UPDATE {jobs} SET status = 'succeeded', result = ?, error = NULL, token = NULL, "
    "worker = NULL, lease_until = 0, finished_at = ?, expires_at = ? + result_ttl "
    "WHERE id = ? AND status IN ('queued', 'running')"
)
RECHECK = 1.0  # longest a waiter sleeps without re-reading the store (a lost wake-up costs this)


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def state_from_row(row: Sequence[Any]) -> JobState:
    return JobState(
        id=row[0],
        unit=row[1],
        queue=row[2],
        status=JobStatus(row[3]),
        deliveries=int(row[4]),
        attempts=int(row[5]),
        result=_bytes(row[6]),
        error=_bytes(row[7]),
        dead_reason=row[8],
        codec=row[9],
        enqueued_at=float(row[10]),
        finished_at=None if row[11] is None else float(row[11]),
        eta=float(row[12]),
        priority=int(row[13]),
        key=row[14],
        payload=_bytes(row[15]),
    )


def claimed_from_row(row: Sequence[Any]) -> Claimed:
    return Claimed(
        id=row[0],
        queue=row[1],
        unit=row[2],
        payload=bytes(row[3]),
        codec=row[4],
        token=row[5],
        lease_until=float(row[6]),
        deliveries=int(row[7]),
        attempts=int(row[8]),
        max_retries=int(row[9]),
        max_deliveries=int(row[10]),
        timeout=None if row[11] is None else float(row[11]),
        enqueued_at=float(row[12]),
    )


def insert_params(job: NewJob, now: float) -> tuple[Any, ...]:
    return (
        job.id,
        job.queue,
        job.unit,
        bytes(job.payload),
        job.codec,
        job.key,
        job.priority,
        float(job.eta) if job.eta is not None else now,
        "queued",
        0.0,
        0,
        0,
        job.max_retries,
        job.max_deliveries,
        None if job.timeout is None else float(job.timeout),
        float(job.result_ttl),
        now,
    )


def parse_url(url: str, own: Sequence[str]) -> tuple[SplitResult, dict[str, str], str]:
    """(parts, query options, table prefix); ``prefix`` must be a plain identifier."""
    parts = urlsplit(url)
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    prefix = query.get("prefix", "foundry_")
    if not prefix.replace("_", "").isalnum() or not (prefix[0].isalpha() or prefix[0] == "_"):
        raise ConfigError(
            f"queue URL {safe_url(url)!r}: prefix={prefix!r} must be letters, digits and _ (a table name "
            "prefix). Fix: e.g. ?prefix=myapp_"
        )
    unknown = [k for k in query if k not in own and k != "prefix"]
    if unknown and parts.scheme not in ("postgresql", "postgres"):
        raise ConfigError(
            f"queue URL {safe_url(url)!r}: unknown option(s) {', '.join(sorted(unknown))}. "
            f"Fix: use only {', '.join(sorted({*own, 'prefix'}))}"
        )
    return parts, query, prefix


def positive(url: str, query: dict[str, str], name: str, default: float) -> float:
    raw = query.get(name)
    if raw is None:
        return default
    try:
        value = float(raw[:-2]) / 1000 if raw.endswith("ms") else float(raw.rstrip("s"))
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(
            f"queue URL {safe_url(url)!r}: {name}={raw!r} is not a positive number. Fix: e.g. {name}=8"
        )
    return value


class Signals:
    """Wake-ups inside one process: a generation per topic (a queue, or a job id)
    plus one for "something changed, look again". Waiters read a generation, look at
    the store, and sleep only if the generation has not moved since — so a change
    between the look and the sleep is never missed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._gens: dict[str, int] = {}
        self._all = 0

    def gen(self, topic: str) -> tuple[int, int]:
        return (self._all, self._gens.get(topic, 0))

    def bump(self, *topics: str) -> None:
        with self._cond:
            for topic in topics:
                self._gens[topic] = self._gens.get(topic, 0) + 1
                if len(self._gens) > 100_000:  # job topics of finished jobs: forget them
                    self._gens.clear()
                    self._all += 1
            self._cond.notify_all()

    def bump_all(self) -> None:
        with self._cond:
            self._all += 1
            self._cond.notify_all()

    def wait(self, topic: str, since: tuple[int, int], timeout: float) -> bool:
        """Sleep until ``topic`` (or everything) moved past ``since``; ``False`` on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self.gen(topic) != since, max(0.0, timeout))


def job_topic(job_id: str) -> str:
    return "job:" + job_id


def queue_topic(queue: str) -> str:
    return "queue:" + queue


class SqlQueue(SqlEngine):
    """Shared implementation of :class:`~foundry.backends.queue.base.QueueBackend`."""

    capabilities: ClassVar[Capabilities] = Capabilities()
    skip_locked: ClassVar[str] = ""

    def __init__(self, url: str, *, prefix: str) -> None:
        self.table = f"{prefix}jobs"
        super().__init__(url, {"{jobs}": self.table, "{skip}": self.skip_locked})
        self.signals = Signals()
        self._busy: set[str] = set()  # queues whose last claim came back full
        self._closed = False

    # -- engine hooks ------------------------------------------------------------

    def _read(self) -> AbstractContextManager[Any]:
        """A connection for reads outside a transaction."""
        raise NotImplementedError

    def _write(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(conn)`` inside one committed write transaction and return its value."""
        raise NotImplementedError

    def _notify(self, conn: Any, topics: Sequence[str]) -> None:
        """Inside the write transaction: tell other processes (engines with notification)."""

    def _watch(self) -> AbstractContextManager[None]:
        """Held while a caller waits: keeps the cross-process wake-up source running."""
        raise NotImplementedError

    # -- plumbing ----------------------------------------------------------------

    def _one(self, conn: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        return conn.execute(self._sql(sql), params).fetchone()

    def _all(self, conn: Any, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return list(conn.execute(self._sql(sql), params).fetchall())

    def _run(self, conn: Any, sql: str, params: Sequence[Any] = ()) -> int:
        return int(conn.execute(self._sql(sql), params).rowcount)

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            mapped = self._translate(exc)
            if mapped is None:
                raise
            raise mapped from exc

    def _commit(self, fn: Callable[[Any], T], topics: Callable[[T], Sequence[str]]) -> T:
        """A write, its cross-process notification, then the local wake-up."""

        def body(conn: Any) -> T:
            value = fn(conn)
            wake = topics(value)
            if wake:
                self._notify(conn, wake)
            return value

        with self._errors():
            value = self._write(body)
        wake = topics(value)
        if wake:
            self.signals.bump(*wake)
        return value

    def _query(self, fn: Callable[[Any], T]) -> T:
        with self._errors(), self._read() as conn:
            return fn(conn)

    @staticmethod
    def _now() -> float:
        return time.time()

    # -- enqueue -----------------------------------------------------------------

    def _insert(self, conn: Any, job: NewJob, now: float) -> Enqueued:
        created = (
            self._run(
                conn,
                f"INSERT INTO {{jobs}} ({INSERT_COLS}) VALUES ({_MARKS}) ON CONFLICT DO NOTHING",
                insert_params(job, now),
            )
            > 0
        )
        if created:
            return Enqueued(job.id, True)
        row = None
        if job.key is not None:
            row = self._one(conn, "SELECT id FROM {jobs} WHERE key = ?", (job.key,))
        if row is None:
            row = self._one(conn, "SELECT id FROM {jobs} WHERE id = ?", (job.id,))
        if row is None:  # pragma: no cover - a conflict names a row that exists
            raise SubmitError(f"job {job.id!r}: enqueue conflicted with a job that vanished; submit again")
        return Enqueued(row[0], False)

    def enqueue(self, job: NewJob) -> Enqueued:
        check_new_job(job)
        now = self._now()
        return self._commit(
            lambda conn: self._insert(conn, job, now),
            lambda done: (queue_topic(job.queue),) if done.created else (),
        )

    def enqueue_many(self, jobs: list[NewJob]) -> list[Enqueued]:
        for job in jobs:
            check_new_job(job)
        if not jobs:
            return []
        now = self._now()
        queues = sorted({job.queue for job in jobs})
        return self._commit(
            lambda conn: self._insert_many(conn, jobs, now),
            lambda done: [queue_topic(q) for q in queues] if any(e.created for e in done) else [],
        )

    def _insert_many(self, conn: Any, jobs: list[NewJob], now: float) -> list[Enqueued]:
        return [self._insert(conn, job, now) for job in jobs]

    # -- claim -------------------------------------------------------------------

    def _recover_lapsed(self, conn: Any, queue: str, now: float) -> None:
        """Leases that lapsed: back to the queue, or to dead letters when poisonous."""
        rows = self._all(
            conn,
            "SELECT id, deliveries, attempts, max_deliveries FROM {jobs} WHERE queue = ? AND "
            "status = 'running' AND lease_until <= ? ORDER BY lease_until LIMIT 500{skip}",
            (queue, now),
        )
        for job_id, deliveries, attempts, max_deliveries in rows:
            lost = int(deliveries) - int(attempts)
            if lost >= int(max_deliveries):
                reason = (
                    f"its lease lapsed {lost} times without an outcome (deliveries={deliveries}, "
                    f"max_deliveries={max_deliveries}): the job keeps killing or hanging its worker"
                )
                self._run(
                    conn,
                    "UPDATE {jobs} SET status = 'dead', dead_reason = ?, token = NULL, worker = NULL, "
                    "lease_until = 0, finished_at = ?, expires_at = ? + result_ttl WHERE id = ?",
                    (reason, now, now, job_id),
                )
            else:
                self._run(
                    conn,
                    "UPDATE {jobs} SET status = 'queued', token = NULL, worker = NULL, lease_until = 0 "
                    "WHERE id = ?",
                    (job_id,),
                )

    def _claim_now(self, conn: Any, queue: str, worker: str, lease: float, limit: int) -> list[Claimed]:
        now = self._now()
        self._recover_lapsed(conn, queue, now)
        token = uuid.uuid4().hex
        rows = self._all(
            conn,
            "UPDATE {jobs} SET status = 'running', token = ?, worker = ?, lease_until = ?, "
            "deliveries = deliveries + 1, started_at = ? WHERE seq IN (SELECT seq FROM {jobs} "
            "WHERE queue = ? AND status = 'queued' AND eta <= ? ORDER BY priority DESC, eta, seq "
            f"LIMIT ?{{skip}}) RETURNING {CLAIM_COLS}",
            (token, worker, now + lease, now, queue, now, limit),
        )
        rows.sort(key=lambda r: (-int(r[13]), float(r[14]), int(r[15])))
        return [claimed_from_row(r) for r in rows]

    def _due(self, conn: Any, *, queue: str, now: float) -> tuple[bool, float]:
        """(something is claimable now, the next time something becomes claimable).

        "Is one due" is an EXISTS that stops at the first due entry of the ready index;
        ``min(eta)`` cannot use that index (priority comes first in it) and would read
        every queued job of the queue on each probe, so it is asked only when nothing is
        due (then the queued jobs are the delayed ones)."""
        row = self._one(
            conn,
            "SELECT EXISTS (SELECT 1 FROM {jobs} WHERE queue = ? AND status = 'queued' AND eta <= ?), "
            "(SELECT min(lease_until) FROM {jobs} WHERE queue = ? AND status = 'running')",
            (queue, now, queue),
        )
        lapse = math.inf if row[1] is None else float(row[1])
        if row[0] or lapse <= now:
            return True, now
        later = self._one(conn, "SELECT min(eta) FROM {jobs} WHERE queue = ? AND status = 'queued'", (queue,))
        nxt = min(math.inf if later[0] is None else float(later[0]), lapse)
        return nxt <= now, nxt

    def claim(self, queue: str, worker: str, *, lease: float, limit: int, timeout: float) -> list[Claimed]:
        if not isinstance(queue, str) or not queue:
            raise SubmitError(f"claim: queue={queue!r} is not a queue name. Fix: give a non-empty string")
        if not lease > 0 or not math.isfinite(lease):
            raise SubmitError(
                f"claim on queue {queue!r}: lease={lease!r} must be a positive number of seconds"
            )
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise SubmitError(f"claim on queue {queue!r}: limit={limit!r} must be an integer >= 1")
        deadline = time.monotonic() + max(0.0, timeout)
        topic = queue_topic(queue)
        with self._watch():
            while True:
                since = self.signals.gen(topic)
                now = self._now()
                if queue in self._busy:  # the last claim filled its batch: skip the probe
                    ready, nxt = True, now
                else:
                    ready, nxt = self._query(functools.partial(self._due, queue=queue, now=now))
                if ready:
                    got = self._commit(
                        lambda conn: self._claim_now(conn, queue, worker, lease, limit),
                        lambda _: (),
                    )
                    if len(got) == limit:
                        self._busy.add(queue)
                    else:
                        self._busy.discard(queue)
                    if got:
                        return got
                    continue  # raced with another worker, or a lapsed job went to dead letters
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return []
                self.signals.wait(topic, since, min(left, max(0.0, nxt - now) + 0.001, RECHECK))

    # -- a delivery's outcome ------------------------------------------------------

    def heartbeat(self, job_id: str, token: str, *, lease: float) -> bool:
        now = self._now()
        return self._commit(
            lambda conn: (
                self._run(
                    conn,
                    "UPDATE {jobs} SET lease_until = ? WHERE id = ? AND token = ? AND status = 'running'",
                    (now + lease, job_id, token),
                )
                > 0
            ),
            lambda _: (),
        )

    def complete(self, job_id: str, token: str, result: bytes) -> bool:
        now = self._now()
        return self._commit(
            lambda conn: self._run(conn, _SUCCEED, (bytes(result), now, now, job_id)) > 0,
            lambda ok: (job_topic(job_id),) if ok else (),
        )

    def complete_many(self, items: Sequence[tuple[str, str, bytes]]) -> list[bool]:
        """Several completions in one transaction (a worker's batched acks)."""
        now = self._now()

        def body(conn: Any) -> list[bool]:
            return [
                self._run(conn, _SUCCEED, (bytes(result), now, now, job_id)) > 0
                for job_id, _token, result in items
            ]

        return self._commit(
            body, lambda oks: [job_topic(i[0]) for i, ok in zip(items, oks, strict=True) if ok]
        )

    def fail(
        self,
        job_id: str,
        token: str,
        error: bytes,
        *,
        retry_at: float | None = None,
        dead_reason: str | None = None,
    ) -> bool:
        now = self._now()
        if retry_at is not None and dead_reason is not None:
            raise SubmitError(
                f"fail of job {job_id!r}: give retry_at or dead_reason, not both. Fix: choose one outcome"
            )
        if retry_at is not None:
            sql = (
                "UPDATE {jobs} SET status = 'queued', eta = ?, error = ?, attempts = attempts + 1, "
                "token = NULL, worker = NULL, lease_until = 0 "
                "WHERE id = ? AND token = ? AND status = 'running' RETURNING queue"
            )
            params: tuple[Any, ...] = (float(retry_at), bytes(error), job_id, token)
        else:
            status = "dead" if dead_reason is not None else "failed"
            sql = (
                "UPDATE {jobs} SET status = ?, error = ?, dead_reason = ?, attempts = attempts + 1, "
                "token = NULL, worker = NULL, lease_until = 0, finished_at = ?, expires_at = ? + result_ttl "
                "WHERE id = ? AND token = ? AND status = 'running' RETURNING queue"
            )
            params = (status, bytes(error), dead_reason, now, now, job_id, token)

        return self._update_job(job_id, sql, params, wake_queue=retry_at is not None)

    def _update_job(self, job_id: str, sql: str, params: Sequence[Any], *, wake_queue: bool) -> bool:
        """One ``UPDATE ... RETURNING queue`` of a job; wake its waiters (and its queue's
        claimers when it became claimable). ``True`` when the row matched."""

        def body(conn: Any) -> str | None:
            row = self._one(conn, sql, params)
            return None if row is None else str(row[0])

        def wake(queue: str | None) -> tuple[str, ...]:
            if queue is None:
                return ()
            return (job_topic(job_id), queue_topic(queue)) if wake_queue else (job_topic(job_id),)

        return self._commit(body, wake) is not None

    def release(self, job_id: str, token: str) -> bool:
        return self._update_job(
            job_id,
            "UPDATE {jobs} SET status = 'queued', token = NULL, worker = NULL, lease_until = 0, "
            "deliveries = CASE WHEN deliveries > 0 THEN deliveries - 1 ELSE 0 END "
            "WHERE id = ? AND token = ? AND status = 'running' RETURNING queue",
            (job_id, token),
            wake_queue=True,
        )

    def cancel(self, job_id: str) -> bool:
        now = self._now()

        def body(conn: Any) -> bool:
            n = self._run(
                conn,
                "UPDATE {jobs} SET status = 'cancelled', finished_at = ?, expires_at = ? + result_ttl "
                "WHERE id = ? AND status = 'queued'",
                (now, now, job_id),
            )
            if n:
                return True
            row = self._one(conn, "SELECT status FROM {jobs} WHERE id = ?", (job_id,))
            return row is not None and row[0] == "cancelled"

        return self._commit(body, lambda ok: (job_topic(job_id),) if ok else ())

    # -- reading -------------------------------------------------------------------

    def get(self, job_id: str) -> JobState | None:
        row = self._query(
            lambda conn: self._one(conn, f"SELECT {STATE_COLS} FROM {{jobs}} WHERE id = ?", (job_id,))
        )
        return None if row is None else state_from_row(row)

    def find(self, key: str) -> JobState | None:
        row = self._query(
            lambda conn: self._one(conn, f"SELECT {STATE_COLS} FROM {{jobs}} WHERE key = ?", (key,))
        )
        return None if row is None else state_from_row(row)

    def wait(self, job_id: str, timeout: float) -> JobState | None:
        deadline = time.monotonic() + max(0.0, timeout)
        topic = job_topic(job_id)
        with self._watch():
            while True:
                since = self.signals.gen(topic)
                state = self.get(job_id)
                left = deadline - time.monotonic()
                if state is None or state.status.value in FINISHED or left <= 0 or self._closed:
                    return state
                self.signals.wait(topic, since, min(left, RECHECK))

    def dead_letters(self, queue: str | None = None, limit: int = 100) -> list[JobState]:
        params: tuple[Any, ...]
        if queue is None:
            sql, params = (
                f"SELECT {STATE_COLS} FROM {{jobs}} WHERE status = 'dead' "
                "ORDER BY finished_at DESC, seq DESC LIMIT ?",
                (limit,),
            )
        else:
            sql, params = (
                f"SELECT {STATE_COLS} FROM {{jobs}} WHERE queue = ? AND status = 'dead' "
                "ORDER BY finished_at DESC, seq DESC LIMIT ?",
                (queue, limit),
            )
        return [state_from_row(r) for r in self._query(lambda conn: self._all(conn, sql, params))]

    def jobs(self, queue: str | None = None, status: str | None = None, limit: int = 100) -> list[JobState]:
        """The most recent jobs (``foundry jobs list``), newest first."""
        where, params = [], []
        if queue is not None:
            where.append("queue = ?")
            params.append(queue)
        if status is not None:
            where.append("status = ?")
            params.append(status)
        clause = (" WHERE " + " AND ".join(where)) if where else ""
        sql = f"SELECT {STATE_COLS} FROM {{jobs}}{clause} ORDER BY seq DESC LIMIT ?"
        return [state_from_row(r) for r in self._query(lambda conn: self._all(conn, sql, (*params, limit)))]

    def requeue(self, job_id: str) -> bool:
        return self._update_job(
            job_id,
            "UPDATE {jobs} SET status = 'queued', eta = ?, deliveries = 0, attempts = 0, token = NULL, "
            "worker = NULL, lease_until = 0, dead_reason = NULL, error = NULL, result = NULL, "
            "finished_at = NULL, expires_at = NULL WHERE id = ? AND status IN ('dead', 'failed') "
            "RETURNING queue",
            (self._now(), job_id),
            wake_queue=True,
        )

    def stats(self, queue: str) -> QueueStats:
        now = self._now()

        def read(conn: Any) -> QueueStats:
            q = self._one(
                conn,
                "SELECT sum(CASE WHEN eta <= ? THEN 1 ELSE 0 END), sum(CASE WHEN eta > ? THEN 1 ELSE 0 END), "
                "min(CASE WHEN eta <= ? THEN eta END) FROM {jobs} WHERE queue = ? AND status = 'queued'",
                (now, now, now, queue),
            )
            running = self._one(
                conn, "SELECT count(*) FROM {jobs} WHERE queue = ? AND status = 'running'", (queue,)
            )
            dead = self._one(
                conn, "SELECT count(*) FROM {jobs} WHERE queue = ? AND status = 'dead'", (queue,)
            )
            depth = int(q[0] or 0)
            oldest = float(q[2]) if q[2] is not None and depth else now
            return QueueStats(
                depth=depth,
                scheduled=int(q[1] or 0),
                running=int(running[0]),
                dead=int(dead[0]),
                oldest_age=max(0.0, now - oldest),
            )

        return self._query(read)

    def purge(self, now: float | None = None) -> int:
        at = self._now() if now is None else float(now)
        return self._commit(
            lambda conn: self._run(
                conn,
                f"DELETE FROM {{jobs}} WHERE status IN {_FINISHED_SQL} AND expires_at < ?",
                (at,),
            ),
            lambda _: (),
        )
