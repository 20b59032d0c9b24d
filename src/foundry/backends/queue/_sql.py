"""The queue's logic in portable SQL; ``sqlite.py`` and ``postgres.py`` supply the
connections, the DDL, the way a write transaction runs, the error mapping and the
wake-up mechanism.

Statements are written with qmark placeholders (``?``), ``{jobs}`` for the table and
``{skip}`` for the engine's row-lock clause; an engine with another paramstyle gets
them rewritten once (:class:`~foundry.backends._sql_common.SqlEngine`). One row per job holds its whole
life: ``status`` moves queued → running → succeeded | failed | dead | cancelled, the
lease is ``(token, lease_until)`` on the row, and every write that belongs to a
delivery checks the token in the same statement (the fence). A cancel request of a
running job is ``cancel_at`` on the row; the statements that end a delivery read it in
the same statement, so a requested cancel always ends the job ``cancelled``.
"""

from __future__ import annotations

import functools
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar, TypeVar

from foundry.backends._records import INT32, Fields
from foundry.backends._sql_common import PREFIX_SQL, SqlEngine, prefix_range
from foundry.backends.queue._common import (
    CANCELS,
    RECHECK,
    Signals,
    finite,
    job_topic,
    queue_topic,
    watch_cancels,
)
from foundry.backends.queue._records import (
    CLAIM_FIELDS,
    STATE_FIELDS,
    dead_reason_for,
    decode_claimed,
    decode_state,
    encode_progress,
)
from foundry.backends.queue.base import (
    CancelResult,
    Capabilities,
    Claimed,
    Enqueued,
    JobProgress,
    JobState,
    NewJob,
    QueueStats,
    Unclaimed,
    check_claim,
    check_fail,
    check_new_job,
)
from foundry.errors import MalformedRecordError, SubmitError

T = TypeVar("T")
log = logging.getLogger("foundry.queue")

FINISHED = ("succeeded", "failed", "dead", "cancelled")
_FINISHED_SQL = "(" + ", ".join(f"'{s}'" for s in FINISHED) + ")"
STATE_COLS = (
    "id, unit, queue, status, deliveries, attempts, result, error, dead_reason, codec, enqueued_at, "
    "finished_at, eta, priority, key, cancel_at, progress, payload"
)
# What ``wait`` reads: the state without the payload (a waiter needs the outcome, and a
# large payload would be read again on every look).
WAIT_COLS = STATE_COLS.replace(", payload", ", NULL")
CLAIM_COLS = (
    "id, queue, unit, payload, codec, token, lease_until, deliveries, attempts, max_retries, "
    "max_deliveries, timeout, enqueued_at, priority, eta, seq, trace"
)
INSERT_COLS = (
    "id, queue, unit, payload, codec, key, priority, eta, status, lease_until, deliveries, attempts, "
    "max_retries, max_deliveries, timeout, result_ttl, enqueued_at, trace"
)
_MARKS = ", ".join("?" * len(INSERT_COLS.split(",")))
# A completion: kept from a stale delivery too (the work is done), but never over a final
# state, and never over a cancel request (then _CANCEL_HELD ends the job instead).
_SUCCEED = (
    "UPDATE {jobs} SET status = 'succeeded', result = ?, error = NULL, token = NULL, "
    "worker = NULL, lease_until = 0, finished_at = ?, expires_at = ? + result_ttl "
    "WHERE id = ? AND status IN ('queued', 'running') AND cancel_at IS NULL"
)
# The end of a running job with a cancel request, whatever its worker asked for (a
# completion, a retry, a dead letter, a release) or when its lease lapsed: ``cancelled``,
# the error (if any) kept. Params: error, now, now, id (+ token when fenced).
_CANCEL_HELD = (
    "UPDATE {jobs} SET status = 'cancelled', result = NULL, error = coalesce(?, error), token = NULL, "
    "worker = NULL, lease_until = 0, finished_at = ?, expires_at = ? + result_ttl "
    "WHERE id = ? AND status = 'running' AND cancel_at IS NOT NULL"
)
_DEAD_TTL = 7 * 86400.0  # how long a malformed record stays in dead letters (its own result_ttl is suspect)
# Columns added after the first release: (name, SQL type and default), added to older tables on open.
ADDED_COLUMNS = (
    ("crashes", "INTEGER NOT NULL DEFAULT 0"),
    ("alone", "TEXT"),
    ("cancel_at", "DOUBLE PRECISION"),
    ("progress", "TEXT"),
    ("trace", "TEXT"),
)
# The dead-lettering of a record that cannot be decoded (by ``seq``: its id may be what is broken).
_BURY = (
    "UPDATE {jobs} SET status = 'dead', dead_reason = ?, token = NULL, worker = NULL, lease_until = 0, "
    "finished_at = ?, expires_at = ? WHERE seq = ?"
)


def state_from_row(row: Sequence[Any]) -> JobState:
    """A :class:`JobState` from a row of ``STATE_COLS`` (see ``_records.decode_state``)."""
    if len(row) != len(STATE_FIELDS):
        raise MalformedRecordError(
            repr(row[:1]), "row", len(row), f"does not have the {len(STATE_FIELDS)} columns of a job"
        )
    return decode_state(dict(zip(STATE_FIELDS, row, strict=True)))


def claimed_from_row(row: Sequence[Any]) -> Claimed:
    """A :class:`Claimed` from a row of ``CLAIM_COLS`` (see ``_records.decode_claimed``)."""
    if len(row) < len(CLAIM_FIELDS):
        raise MalformedRecordError(repr(row[:1]), "row", len(row), "does not have the columns of a claim")
    values = dict(zip(CLAIM_FIELDS, row, strict=False))
    values["trace"] = row[16] if len(row) > 16 else None  # after priority, eta, seq
    return decode_claimed(values)


def _claim_order(row: Sequence[Any]) -> tuple[int, float, int]:
    """Best first: higher priority, then earlier eta, then enqueue order (``CLAIM_COLS``)."""
    f = Fields(row[0])
    return (-f.integer("priority", row[13], low=-INT32), f.number("eta", row[14]), int(row[15]))


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
        job.trace,
    )


def _marks(n: int) -> str:
    return ", ".join("?" * n)


def _integer(value: Any) -> int:
    """A stored priority; 0 for a malformed one (it only orders broker messages)."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return 0


class SqlQueue(SqlEngine):
    """Shared implementation of :class:`~foundry.backends.queue.base.QueueBackend`."""

    capabilities: ClassVar[Capabilities] = Capabilities()
    skip_locked: ClassVar[str] = ""
    # An engine whose new-work wake-up reaches one claimer (SQLite's doorbell): a claimer
    # that nothing rang for since its last look takes only jobs that have been due this
    # many seconds (``claim``): the rung claimer gets the fresh ones, a backlog reaches all.
    unrung_age: ClassVar[float] = 0.0

    def __init__(self, url: str, *, prefix: str) -> None:
        self.table = f"{prefix}jobs"
        super().__init__(url, {"{jobs}": self.table, "{skip}": self.skip_locked})
        self.signals = Signals()
        self._busy: set[str] = set()  # queues whose last claim came back full
        self._looked: dict[str, tuple[int, int]] = {}  # queue -> its wake-up generation at the last look
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

    def _more(self, topic: str) -> None:
        """After a claim that took all it asked for: more may be waiting (an engine
        whose new-work wake-up reaches only one claimer wakes another)."""

    def _watch(self, topic: str | None = None) -> AbstractContextManager[None]:
        """Held while a caller waits for ``topic`` (``None``: anything): keeps the
        cross-process wake-up source running."""
        raise NotImplementedError

    # -- plumbing, public for the family's other stores on the same tables ---------
    # (schedules.SqlSchedules): a statement in the engine's dialect, a write
    # transaction with its wake-ups, a read.

    def fetch_one(self, conn: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        return conn.execute(self._sql(sql), params).fetchone()

    def fetch_all(self, conn: Any, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return list(conn.execute(self._sql(sql), params).fetchall())

    def execute(self, conn: Any, sql: str, params: Sequence[Any] = ()) -> int:
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

    def commit(self, fn: Callable[[Any], T], topics: Callable[[T], Sequence[str]]) -> T:
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

    def query(self, fn: Callable[[Any], T]) -> T:
        """A read (on the engine's read connection)."""
        with self._errors(), self._read() as conn:
            return fn(conn)

    @staticmethod
    def _now() -> float:
        return time.time()

    # -- enqueue -----------------------------------------------------------------

    def _insert(self, conn: Any, job: NewJob, now: float) -> Enqueued:
        created = (
            self.execute(
                conn,
                f"INSERT INTO {{jobs}} ({INSERT_COLS}) VALUES ({_MARKS}) ON CONFLICT DO NOTHING",
                insert_params(job, now),
            )
            > 0
        )
        if created:
            return Enqueued(job.id, True)
        return self._existing(conn, job)

    def _existing(self, conn: Any, job: NewJob) -> Enqueued:
        """The job an insert of ``job`` conflicted with (its key, or its id)."""
        row = None
        if job.key is not None:
            row = self.fetch_one(conn, "SELECT id FROM {jobs} WHERE key = ?", (job.key,))
        if row is None:
            row = self.fetch_one(conn, "SELECT id FROM {jobs} WHERE id = ?", (job.id,))
        if row is None:  # pragma: no cover - a conflict names a row that exists
            raise SubmitError(f"job {job.id!r}: enqueue conflicted with a job that vanished; submit again")
        return Enqueued(row[0], False)

    def enqueue(self, job: NewJob) -> Enqueued:
        check_new_job(job)
        now = self._now()
        return self.commit(
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
        return self.commit(
            lambda conn: self._insert_many(conn, jobs, now),
            lambda done: [queue_topic(q) for q in queues] if any(e.created for e in done) else [],
        )

    def _insert_many(self, conn: Any, jobs: list[NewJob], now: float) -> list[Enqueued]:
        return [self._insert(conn, job, now) for job in jobs]

    # -- claim -------------------------------------------------------------------

    def _recover_lapsed(self, conn: Any, queue: str, now: float) -> list[str]:
        """Leases that lapsed: back to the queue, or to dead letters when poisonous. Only
        a delivery its worker marked ``alone`` is charged (``crashes``); any other goes
        back uncharged, and is a suspect next time (see the contract in ``base``). The
        topics to wake: the jobs that ended, and the queue when one went back to it."""
        wake: set[str] = set()
        rows = self.fetch_all(
            conn,
            "SELECT seq, id, max_deliveries, crashes, alone, token, cancel_at FROM {jobs} WHERE queue = ? "
            "AND status = 'running' AND lease_until <= ? ORDER BY lease_until LIMIT 500{skip}",
            (queue, now),
        )
        for seq, job_id, max_deliveries, crashes, alone, token, cancel_at in rows:
            if cancel_at is not None:  # its cancel was requested: it ends here, uncharged
                self.execute(conn, _CANCEL_HELD, (None, now, now, job_id))
                wake.add(job_topic(str(job_id)))
                continue
            f = Fields(job_id)
            try:
                most = f.integer("max_deliveries", max_deliveries, low=1)
                charged = f.integer("crashes", crashes) + (1 if alone is not None and alone == token else 0)
            except MalformedRecordError as exc:
                self.execute(conn, _BURY, (dead_reason_for(exc), now, now + _DEAD_TTL, seq))
                wake.add(job_topic(str(job_id)))
                continue
            if charged >= most:
                reason = (
                    f"its worker died or hung while this job ran alone in it, {charged} time(s) "
                    f"(max_deliveries={most}): the job keeps killing or hanging its worker"
                )
                self.execute(
                    conn,
                    "UPDATE {jobs} SET status = 'dead', dead_reason = ?, crashes = ?, token = NULL, "
                    "worker = NULL, lease_until = 0, finished_at = ?, expires_at = ? + result_ttl "
                    "WHERE seq = ?",
                    (reason, charged, now, now, seq),
                )
                wake.add(job_topic(str(job_id)))
            else:
                self.execute(
                    conn,
                    "UPDATE {jobs} SET status = 'queued', crashes = ?, token = NULL, worker = NULL, "
                    "lease_until = 0 WHERE seq = ?",
                    (charged, seq),
                )
                wake.add(queue_topic(queue))
        return sorted(wake)

    def _lease_rows(self, conn: Any, rows: list[Any], now: float) -> list[Claimed]:
        """The leased rows as jobs, best first; a row that cannot be decoded is
        dead-lettered in the same transaction, with the reason, instead of handed out."""
        good: list[tuple[tuple[int, float, int], Claimed]] = []
        for row in rows:
            try:
                good.append((_claim_order(row), claimed_from_row(row)))
            except MalformedRecordError as exc:
                log.warning("queue %s: %s; dead-lettered", self.shown, exc)
                self.execute(conn, _BURY, (dead_reason_for(exc), now, now + _DEAD_TTL, row[15]))
        good.sort(key=lambda pair: pair[0])
        return [claimed for _, claimed in good]

    def _claim_now(
        self, conn: Any, queue: str, worker: str, lease: float, limit: int
    ) -> tuple[list[Claimed], list[str]]:
        """(the jobs leased, the topics of the lapsed leases recovered on the way)."""
        now = self._now()
        wake = self._recover_lapsed(conn, queue, now)
        token = uuid.uuid4().hex
        rows = self.fetch_all(
            conn,
            "UPDATE {jobs} SET status = 'running', token = ?, worker = ?, lease_until = ?, "
            "deliveries = deliveries + 1, started_at = ? WHERE seq IN (SELECT seq FROM {jobs} "
            "WHERE queue = ? AND status = 'queued' AND eta <= ? ORDER BY priority DESC, eta, seq "
            f"LIMIT ?{{skip}}) RETURNING {CLAIM_COLS}",
            (token, worker, now + lease, now, queue, now, limit),
        )
        return self._lease_rows(conn, rows, now), wake

    def _due(self, conn: Any, *, queue: str, now: float, age: float = 0.0) -> tuple[bool, float]:
        """(something is claimable now, the next time something becomes claimable); with
        ``age``, claimable means due for ``age`` seconds at least.

        "Is one due" is an EXISTS that stops at the first due entry of the ready index;
        ``min(eta)`` cannot use that index (priority comes first in it) and would read
        every queued job of the queue on each probe, so it is asked only when nothing is
        due (then the queued jobs are the delayed ones, or the fresh ones of ``age``)."""
        row = self.fetch_one(
            conn,
            "SELECT EXISTS (SELECT 1 FROM {jobs} WHERE queue = ? AND status = 'queued' AND eta <= ?), "
            "(SELECT min(lease_until) FROM {jobs} WHERE queue = ? AND status = 'running')",
            (queue, now - age, queue),
        )
        lapse = finite(row[1], math.inf)
        if row[0] or lapse <= now:
            return True, now
        later = self.fetch_one(
            conn, "SELECT min(eta) FROM {jobs} WHERE queue = ? AND status = 'queued'", (queue,)
        )
        soonest = finite(later[0], math.inf)
        if age:  # (a fresh job is looked at again once it may have waited ``age``, not sooner)
            soonest = max(soonest, now) + age
        nxt = min(soonest, lapse)
        return nxt <= now, nxt

    def _claim_age(self, queue: str, gen: tuple[int, int]) -> float:
        """How long a job must have been due for this look to take it: ``unrung_age``
        when nothing rang for the queue since this process's last look (another claimer
        was rung for the fresh jobs), else 0 (a ring, a first look: then the claim goes
        ahead without the probe, as one after a full batch does)."""
        last = self._looked.get(queue)
        self._looked[queue] = gen
        return self.unrung_age if last == gen else 0.0

    def claim(self, queue: str, worker: str, *, lease: float, limit: int, timeout: float) -> list[Claimed]:
        check_claim(queue, lease, limit)
        deadline = time.monotonic() + max(0.0, timeout)
        topic = queue_topic(queue)
        with self._watch(topic):
            while True:
                since = self.signals.gen(topic)
                now = self._now()
                busy = queue in self._busy  # the last claim filled its batch
                age = self._claim_age(queue, since) if self.unrung_age and not busy else 0.0
                if busy or (self.unrung_age and not age):  # (or a ring says there is new work)
                    ready, nxt = True, now  # skip the probe
                else:
                    ready, nxt = self.query(functools.partial(self._due, queue=queue, now=now, age=age))
                if ready:
                    got, _ = self.commit(
                        lambda conn: self._claim_now(conn, queue, worker, lease, limit),
                        lambda done: done[1],
                    )
                    if len(got) == limit:
                        self._busy.add(queue)
                        self._more(topic)
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
        return self.commit(
            lambda conn: (
                self.execute(
                    conn,
                    "UPDATE {jobs} SET lease_until = ? WHERE id = ? AND token = ? AND status = 'running'",
                    (now + lease, job_id, token),
                )
                > 0
            ),
            lambda _: (),
        )

    def progress(self, job_id: str, token: str, progress: JobProgress) -> bool:
        record = encode_progress(progress)
        return self.commit(
            lambda conn: (
                self.execute(
                    conn,
                    "UPDATE {jobs} SET progress = ? WHERE id = ? AND token = ? AND status = 'running'",
                    (record, job_id, token),
                )
                > 0
            ),
            lambda _: (),
        )

    def mark_alone(self, job_id: str, token: str) -> bool:
        return self.commit(
            lambda conn: (
                self.execute(
                    conn,
                    "UPDATE {jobs} SET alone = token WHERE id = ? AND token = ? AND status = 'running'",
                    (job_id, token),
                )
                > 0
            ),
            lambda _: (),
        )

    def complete(self, job_id: str, token: str, result: bytes) -> bool:
        return self.complete_many([(job_id, token, result)])[0]

    def _complete_one(self, conn: Any, job_id: str, result: bytes, now: float) -> tuple[bool, bool]:
        """(the completion was written, the job ended: succeeded, or cancelled by a request)."""
        if self.execute(conn, _SUCCEED, (bytes(result), now, now, job_id)) > 0:
            return True, True
        return False, self.execute(conn, _CANCEL_HELD, (None, now, now, job_id)) > 0

    def complete_many(self, items: Sequence[tuple[str, str, bytes]]) -> list[bool]:
        """Several completions in one transaction (a worker's batched acks)."""
        now = self._now()

        def body(conn: Any) -> list[tuple[bool, bool]]:
            return [self._complete_one(conn, job_id, result, now) for job_id, _token, result in items]

        ends = self.commit(
            body, lambda done: [job_topic(i[0]) for i, (_, end) in zip(items, done, strict=True) if end]
        )
        return [written for written, _ in ends]

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
        check_fail(job_id, retry_at, dead_reason)
        if retry_at is not None:
            sql = (
                "UPDATE {jobs} SET status = 'queued', eta = ?, error = ?, attempts = attempts + 1, "
                "token = NULL, worker = NULL, lease_until = 0 "
                "WHERE id = ? AND token = ? AND status = 'running' AND cancel_at IS NULL RETURNING queue"
            )
            params: tuple[Any, ...] = (float(retry_at), bytes(error), job_id, token)
        else:
            status = "dead" if dead_reason is not None else "failed"
            sql = (
                "UPDATE {jobs} SET status = ?, error = ?, dead_reason = ?, attempts = attempts + 1, "
                "token = NULL, worker = NULL, lease_until = 0, finished_at = ?, expires_at = ? + result_ttl "
                "WHERE id = ? AND token = ? AND status = 'running' AND cancel_at IS NULL RETURNING queue"
            )
            params = (status, bytes(error), dead_reason, now, now, job_id, token)

        return self._update_job(
            job_id, sql, params, wake_queue=retry_at is not None, cancelled=(bytes(error), token)
        )

    def _update_job(
        self,
        job_id: str,
        sql: str,
        params: Sequence[Any],
        *,
        wake_queue: bool,
        cancelled: tuple[bytes | None, str] | None = None,
    ) -> bool:
        """One ``UPDATE ... RETURNING queue`` of a job; wake its waiters (and its queue's
        claimers when it became claimable). ``True`` when the row matched. With
        ``cancelled`` (the error to keep, the delivery's token): a job with a cancel
        request that the statement left alone ends ``cancelled`` instead (also ``True``)."""
        now = self._now()

        def body(conn: Any) -> tuple[str | None, bool]:
            row = self.fetch_one(conn, sql, params)
            if row is not None:
                return str(row[0]), wake_queue
            if cancelled is not None:
                error, token = cancelled
                row = self.fetch_one(
                    conn, _CANCEL_HELD + " AND token = ? RETURNING queue", (error, now, now, job_id, token)
                )
                if row is not None:
                    return str(row[0]), False
            return None, False

        def wake(done: tuple[str | None, bool]) -> tuple[str, ...]:
            queue, claimable = done
            if queue is None:
                return ()
            return (job_topic(job_id), queue_topic(queue)) if claimable else (job_topic(job_id),)

        return self.commit(body, wake)[0] is not None

    def release(self, job_id: str, token: str) -> bool:
        return self._update_job(
            job_id,
            "UPDATE {jobs} SET status = 'queued', token = NULL, worker = NULL, lease_until = 0, "
            "deliveries = CASE WHEN deliveries > 0 THEN deliveries - 1 ELSE 0 END "
            "WHERE id = ? AND token = ? AND status = 'running' AND cancel_at IS NULL RETURNING queue",
            (job_id, token),
            wake_queue=True,
            cancelled=(None, token),
        )

    def cancel(self, job_id: str, *, running: bool = True) -> CancelResult:
        now = self._now()

        def body(conn: Any) -> tuple[CancelResult, bool]:
            """(what happened, whether the job ended now)."""
            for _ in range(3):  # a job moving between the statements (PostgreSQL): look again
                if self.execute(
                    conn,
                    "UPDATE {jobs} SET status = 'cancelled', finished_at = ?, expires_at = ? + result_ttl "
                    "WHERE id = ? AND status = 'queued'",
                    (now, now, job_id),
                ):
                    return CancelResult.CANCELLED, True
                if running and self.execute(  # held by a worker that is gone: nobody would stop it
                    conn,
                    "UPDATE {jobs} SET status = 'cancelled', cancel_at = coalesce(cancel_at, ?), "
                    "token = NULL, worker = NULL, lease_until = 0, finished_at = ?, "
                    "expires_at = ? + result_ttl "
                    "WHERE id = ? AND status = 'running' AND lease_until <= ?",
                    (now, now, now, job_id, now),
                ):
                    return CancelResult.CANCELLED, True
                if running and self.execute(
                    conn,
                    "UPDATE {jobs} SET cancel_at = coalesce(cancel_at, ?) "
                    "WHERE id = ? AND status = 'running'",
                    (now, job_id),
                ):
                    return CancelResult.REQUESTED, False
                row = self.fetch_one(conn, "SELECT status FROM {jobs} WHERE id = ?", (job_id,))
                if row is None:
                    return CancelResult.UNKNOWN, False
                if row[0] == "cancelled":
                    return CancelResult.CANCELLED, False
                if row[0] == "running" and not running:
                    return CancelResult.RUNNING, False
                if row[0] in FINISHED:
                    return CancelResult.FINISHED, False
            return CancelResult.RUNNING, False  # pragma: no cover - it kept moving; nothing changed

        def wake(done: tuple[CancelResult, bool]) -> tuple[str, ...]:
            result, ended = done
            if ended:
                return (job_topic(job_id),)
            return (CANCELS,) if result is CancelResult.REQUESTED else ()

        return self.commit(body, wake)[0]

    def cancel_requests(self, job_ids: Sequence[str], *, timeout: float) -> list[str]:
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return []
        sql = (
            "SELECT id FROM {jobs} WHERE id IN (" + ", ".join("?" * len(ids)) + ") "
            "AND status = 'running' AND cancel_at IS NOT NULL"
        )
        with self._watch(CANCELS):
            return watch_cancels(
                self.signals,
                lambda: [str(r[0]) for r in self.query(lambda conn: self.fetch_all(conn, sql, ids))],
                timeout,
                lambda: self._closed,
            )

    # -- reading -------------------------------------------------------------------

    def get(self, job_id: str) -> JobState | None:
        row = self.query(
            lambda conn: self.fetch_one(conn, f"SELECT {STATE_COLS} FROM {{jobs}} WHERE id = ?", (job_id,))
        )
        return None if row is None else state_from_row(row)

    def find(self, key: str) -> JobState | None:
        row = self.query(
            lambda conn: self.fetch_one(conn, f"SELECT {STATE_COLS} FROM {{jobs}} WHERE key = ?", (key,))
        )
        return None if row is None else state_from_row(row)

    def wait(self, job_id: str, timeout: float) -> JobState | None:
        deadline = time.monotonic() + max(0.0, timeout)
        topic = job_topic(job_id)
        sql = f"SELECT {WAIT_COLS} FROM {{jobs}} WHERE id = ?"
        with self._watch(topic):
            while True:
                since = self.signals.gen(topic)
                row = self.query(lambda conn: self.fetch_one(conn, sql, (job_id,)))
                state = None if row is None else state_from_row(row)
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
        return self._states(self.query(lambda conn: self.fetch_all(conn, sql, params)))

    def _states(self, rows: list[Any]) -> list[JobState]:
        """The rows of a listing as states; a malformed one is left out, with a warning
        naming it (one bad record must not hide every other job)."""
        out: list[JobState] = []
        for row in rows:
            try:
                out.append(state_from_row(row))
            except MalformedRecordError as exc:
                log.warning("queue %s: %s; left out of the listing", self.shown, exc)
        return out

    def ids_starting(self, prefix: str, limit: int = 10) -> list[str]:
        """Up to ``limit`` ids of jobs that begin with ``prefix``, in id order
        (``foundry jobs show`` of a short id): a range over the unique index on ``id``."""
        if not prefix:
            return []
        sql = f"SELECT id FROM {{jobs}} WHERE {PREFIX_SQL} ORDER BY id LIMIT ?"
        rows = self.query(lambda conn: self.fetch_all(conn, sql, (*prefix_range(prefix), limit)))
        return [row[0] for row in rows if isinstance(row[0], str) and row[0].startswith(prefix)]

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
        return self._states(self.query(lambda conn: self.fetch_all(conn, sql, (*params, limit))))

    def requeue(self, job_id: str) -> bool:
        return self._update_job(
            job_id,
            "UPDATE {jobs} SET status = 'queued', eta = ?, deliveries = 0, attempts = 0, crashes = 0, "
            "alone = NULL, cancel_at = NULL, progress = NULL, token = NULL, worker = NULL, lease_until = 0, "
            "dead_reason = NULL, error = NULL, result = NULL, "
            "finished_at = NULL, expires_at = NULL WHERE id = ? AND status IN ('dead', 'failed') "
            "RETURNING queue",
            (self._now(), job_id),
            wake_queue=True,
        )

    def stats(self, queue: str) -> QueueStats:
        now = self._now()

        def read(conn: Any) -> QueueStats:
            q = self.fetch_one(
                conn,
                "SELECT sum(CASE WHEN eta <= ? THEN 1 ELSE 0 END), sum(CASE WHEN eta > ? THEN 1 ELSE 0 END), "
                "min(CASE WHEN eta <= ? THEN eta END) FROM {jobs} WHERE queue = ? AND status = 'queued'",
                (now, now, now, queue),
            )
            running = self.fetch_one(
                conn, "SELECT count(*) FROM {jobs} WHERE queue = ? AND status = 'running'", (queue,)
            )
            dead = self.fetch_one(
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

        return self.query(read)

    def purge(self, now: float | None = None) -> int:
        at = self._now() if now is None else float(now)
        return self.commit(
            lambda conn: self.execute(
                conn,
                f"DELETE FROM {{jobs}} WHERE status IN {_FINISHED_SQL} AND expires_at < ?",
                (at,),
            ),
            lambda _: (),
        )

    # -- the AMQP engine's state store (base.StateStore; see amqp.py) ----------------------

    def claim_ids(
        self, queue: str, ids: Sequence[str], worker: str, lease: float
    ) -> tuple[list[Claimed], list[Unclaimed]]:
        now = time.time()
        token = uuid.uuid4().hex

        def body(conn: Any) -> tuple[list[Any], list[Unclaimed]]:
            rows = self.fetch_all(
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
                for r in self.fetch_all(
                    conn,
                    "SELECT id, status, eta, priority FROM {jobs} WHERE id IN (" + _marks(len(rest)) + ")",
                    rest,
                )
            }
            others: list[Unclaimed] = [
                (i, str(found[i][1]), finite(found[i][2], None), _integer(found[i][3]))
                if i in found
                else (i, "", None, 0)
                for i in rest
            ]
            return claimed, others

        return self.commit(body, lambda _: ())

    def reap(self, queue: str) -> list[tuple[str, int]]:
        now = time.time()

        def body(conn: Any) -> tuple[list[tuple[str, int]], list[str]]:
            rows = self.fetch_all(
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
                self.fetch_all(
                    conn, "SELECT id, status FROM {jobs} WHERE id IN (" + _marks(len(ids)) + ")", ids
                )
            )
            back = [(str(r[0]), _integer(r[1])) for r in rows if status.get(r[0]) == "queued"]
            return back, [i for i in ids if status.get(i) in ("dead", "cancelled")]

        back, _dead = self.commit(body, lambda v: [job_topic(str(i)) for i in v[1]])
        return back

    def next_deadline(self, queue: str) -> float | None:
        row = self.query(
            lambda conn: self.fetch_one(
                conn, "SELECT min(lease_until) FROM {jobs} WHERE queue = ? AND status = 'running'", (queue,)
            )
        )
        return None if row is None else finite(row[0], None)

    def orphans(self, queue: str, before: float, limit: int) -> list[tuple[str, int]]:
        rows = self.query(
            lambda conn: self.fetch_all(
                conn,
                "SELECT id, priority FROM {jobs} WHERE queue = ? AND status = 'queued' AND eta <= ? "
                "ORDER BY priority DESC, eta, seq LIMIT ?",
                (queue, before, limit),
            )
        )
        return [(str(r[0]), _integer(r[1])) for r in rows]

    def queues(self) -> list[str]:
        rows = self.query(lambda conn: self.fetch_all(conn, "SELECT DISTINCT queue FROM {jobs}"))
        return sorted(str(r[0]) for r in rows)

    def destroy(self) -> None:
        schedules = self.table.removesuffix("jobs") + "schedules"  # foundry.backends.queue.schedules

        def drop(conn: Any) -> None:
            self.execute(conn, "DROP TABLE IF EXISTS {jobs}")
            self.execute(conn, f"DROP TABLE IF EXISTS {schedules}")

        self.commit(drop, lambda _: ())
