"""The queue backend contract: the cut between Foundry's durable queue and an engine.

Every engine (SQLite, PostgreSQL, Redis, RabbitMQ) implements :class:`QueueBackend`
and passes the one conformance suite (``tests/backends/queue``). The contract, which
the suite checks, is:

* **Enqueue is idempotent on ``key``.** Enqueuing a job whose key already names a
  job (in any state, until that job's record expires) creates nothing and returns
  the existing job id with ``created=False``.
* **Claim leases, per job.** ``claim`` hands a job to exactly one worker together with
  a fresh ``token`` and a lease deadline. Until the lease lapses nobody else can claim
  it. A worker extends its own lease with ``heartbeat``; a lease that lapses (the
  worker died, hung, or was partitioned) makes the job claimable again *on its own
  deadline*, never on some global timeout. Each claim increments ``deliveries``.
* **Completion is written once.** ``complete`` records the result and returns
  ``True`` only for the first completion of the job; a second completion (a
  redelivered copy that ran anyway, a stale token) returns ``False`` and changes
  nothing. A job with a completion record is never claimed again.
* **Tokens fence stale workers.** ``heartbeat``, ``fail`` and ``release`` with a token
  that is no longer the job's current lease do nothing and return ``False``.
  ``complete`` with a stale token still succeeds when the job has no completion yet
  (the work *was* done; dropping its result would be worse) — at-least-once delivery,
  single completion record.
* **Failures are data.** ``fail`` either schedules a retry at ``retry_at`` (kept in the
  store, not in worker memory) or, with ``dead_reason``, moves the job to the
  dead-letter set, where it can be listed, inspected and ``requeue``-d.
* **Delays live in the store.** A job with ``eta`` in the future is not claimable
  before it.
* **Priorities.** Among claimable jobs of a queue, higher ``priority`` first, then
  earlier ``eta``/enqueue time (FIFO within a priority). Engines that cannot order by
  priority say so with ``capabilities.priority = False``.
* **Waiting has a timeout.** ``claim`` and ``wait`` block at most ``timeout`` seconds,
  woken by the engine's notification mechanism where it has one (LISTEN/NOTIFY,
  blocking pops, AMQP push), by short polling otherwise (``capabilities.notify``).
* **Only the job that ran alone is charged with its worker's death.** A worker that
  dies (or hangs) takes every job it holds with it — the one that killed it, the ones
  running beside it, the ones waiting in its prefetch buffer, the finished ones whose
  completion was not written yet — and nothing in the store says which one it was. So
  a lapsed lease is *charged* to its job only when the worker had marked that delivery
  ``mark_alone`` (it was running with nothing else in the worker: see
  ``Claimed.suspect``); the job's ``crashes`` count goes up, and when it reaches
  ``max_deliveries`` the engine moves the job to the dead-letter set (``dead_reason``
  says the job killed or hung its worker that many times while running alone) instead
  of delivering it again. Any other lapse is not charged: the job goes back to the queue
  and, its last delivery having ended without an outcome, is a *suspect* that the next
  worker runs alone. A poison job is therefore dead-lettered after its first shared
  crash plus ``max_deliveries`` lone ones (more shared ones only if a worker ran it
  beside jobs that would not finish: see ``foundry.deliver.worker``), and a healthy job
  that merely shared its worker never is. ``release`` gives the delivery back (it does
  not count), so graceful restarts never make a suspect.
* **Malformed records are dead-lettered, never run.** A record the engine cannot decode
  into a job (written by something other than Foundry, or altered) is moved to the
  dead-letter set by ``claim`` with the :class:`~foundry.errors.MalformedRecordError`
  text as its reason, and the other jobs of the claim are handed out as usual; ``get``
  raises that error for it until then (a dead letter is read leniently, so that its
  reason shows). Each engine's decoder (``state_from_row``/``claimed_from_row``,
  ``state_from_hash``/``claimed_from_reply``, ``parse_body``) either returns a valid
  job or raises that one error.
* **Cancellation ends a job once, as ``cancelled``, and is never retried.** ``cancel``
  of a *queued* (or delayed, or retry-scheduled) job writes its final record at once: it
  never runs (:attr:`CancelResult.CANCELLED`). ``cancel`` of a *running* job records a
  **cancel request** in the store, durably (``JobState.cancel_requested_at``), and
  returns :attr:`CancelResult.REQUESTED`; the job's worker, on whatever host, learns of
  it through ``cancel_requests`` (woken by the engine's notification where it has one,
  re-reading the store at least every second) and stops the work. From the moment the
  request is recorded the store itself makes every end of that delivery ``cancelled``:
  ``fail`` (whatever it asks: a retry, a dead letter, a failure; the error is kept),
  ``release``, and the lapse of its lease (the worker died: not charged, not delivered
  again) all write ``cancelled``; ``complete`` writes ``cancelled`` too and returns
  ``False`` (the result is dropped: a cancel stops work, it does not undo the effects the
  work already had). So an accepted cancel always ends in ``cancelled``, written once;
  a job whose completion was written before the request landed keeps it
  (:attr:`CancelResult.FINISHED`: nothing changes). A running job whose lease has
  already lapsed (its worker is gone) is cancelled at once. ``cancel(…, running=False)``
  leaves a running job alone (:attr:`CancelResult.RUNNING`): what a purge of waiting
  jobs wants. Repeating a cancel is harmless (the first request's time is kept).
* **Progress is advisory, fenced and kept.** ``progress`` records what the running
  delivery says of itself (:class:`JobProgress`: done, total, a note) on the job, durably,
  when ``token`` is its current lease and it is running (else it does nothing and returns
  ``False``); the last record stays on the job after it finishes (a crash shows how far it
  got) and is cleared by ``requeue``. A record that cannot be decoded reads as ``None``:
  progress never makes a job unreadable.
* **The trace context travels with the job.** ``NewJob.trace`` (a W3C trace context,
  ``foundry.tracecontext``) is stored with the job and handed out on every ``Claimed``
  of it; a job stored without one (by an older Foundry, or by anything else) and a value
  that is not a valid trace context both read as ``None``: never an error, never a dead
  letter (tracing is advisory, like progress).
* **Results expire.** A finished job's record (and result) is kept for ``result_ttl``
  seconds after it finished, however often it is read (reading never deletes it); once
  that has passed, ``purge`` deletes it (Redis also expires the keys itself) and ``get``
  returns ``None``. ``NewJob.result_ttl`` is the unit's declared ``result_ttl=``.

Every method may raise :class:`~foundry.errors.BackendUnavailableError` when the
engine cannot be reached; callers retry with backoff, and no accepted job is lost
because the store, not the worker, is the source of truth.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar, Protocol, runtime_checkable

from foundry.errors import SubmitError
from foundry.tracecontext import parse_trace
from foundry.traits import queue_name_problem

__all__ = [
    "CancelResult",
    "Capabilities",
    "Claimed",
    "Enqueued",
    "JobProgress",
    "JobState",
    "JobStatus",
    "NewJob",
    "QueueBackend",
    "QueueStats",
    "StateStore",
    "Unclaimed",
    "check_claim",
    "check_fail",
    "check_new_job",
    "check_queue_name",
]


class JobStatus(StrEnum):
    QUEUED = "queued"  # claimable now or at eta (includes scheduled retries)
    RUNNING = "running"  # leased to a worker
    SUCCEEDED = "succeeded"  # completion record written
    FAILED = "failed"  # failed for good without dead-lettering (retries exhausted)
    DEAD = "dead"  # in the dead-letter set, with a reason
    CANCELLED = "cancelled"


class CancelResult(StrEnum):
    """What ``cancel`` did (see the module docstring)."""

    CANCELLED = "cancelled"  # it was queued (or cancelled already): it never runs
    REQUESTED = "requested"  # it runs: the request is recorded; it ends cancelled when its worker stops it
    RUNNING = "running"  # it runs and ``running=False`` asked to leave it alone: nothing changed
    FINISHED = "finished"  # it had its outcome already (succeeded, failed, dead): nothing changed
    UNKNOWN = "unknown"  # no such job (never enqueued here, or purged after its result_ttl)

    @property
    def accepted(self) -> bool:
        """The job will end ``cancelled`` (it will not complete)."""
        return self in (CancelResult.CANCELLED, CancelResult.REQUESTED)


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job to enqueue. ``payload`` is already encoded by ``codec``."""

    id: str
    queue: str
    unit: str
    payload: bytes
    codec: str = "json"
    key: str | None = None
    priority: int = 0
    eta: float | None = None  # unix time; None = now
    max_retries: int = 0
    max_deliveries: int = 5  # a job that keeps killing its worker goes to dead letters
    timeout: float | None = None  # per-job run timeout (seconds)
    result_ttl: float = 7 * 86400.0
    trace: str | None = None  # the W3C trace context it was submitted in (foundry.tracecontext.pack)


@dataclass(frozen=True, slots=True)
class Enqueued:
    id: str
    created: bool  # False: the key named an existing job (its id returned)


@dataclass(frozen=True, slots=True)
class Claimed:
    """A job leased to one worker."""

    id: str
    queue: str
    unit: str
    payload: bytes
    codec: str
    token: str
    lease_until: float
    deliveries: int  # including this one
    attempts: int  # failed attempts recorded so far (retries used)
    max_retries: int
    max_deliveries: int
    timeout: float | None
    enqueued_at: float
    trace: str | None = None  # as submitted; None when absent or not a valid trace context

    @property
    def suspect(self) -> bool:
        """An earlier delivery ended without an outcome (its worker died or hung while
        holding it): run this one alone and ``mark_alone`` it, so that a death now is
        charged to this job and no other (see the module docstring)."""
        return self.deliveries > self.attempts + 1


@dataclass(frozen=True, slots=True)
class JobProgress:
    """How far a running job says it got (``foundry.progress(done, total, note)``)."""

    done: float
    total: float | None = None  # None: the job does not know how much there is
    note: str = ""
    at: float = 0.0  # unix time the worker recorded it

    @property
    def fraction(self) -> float | None:
        """``done / total`` in [0, 1], or ``None`` when the total is unknown."""
        if self.total is None or self.total <= 0:
            return None
        return min(1.0, max(0.0, self.done / self.total))

    def describe(self) -> str:
        """``"40% (24/60 frames)"`` style text for tables."""
        fraction = self.fraction
        amount = f"{self.done:g}" if self.total is None else f"{self.done:g}/{self.total:g}"
        head = f"{fraction:.0%} ({amount})" if fraction is not None else amount
        return f"{head} {self.note}".strip()


@dataclass(frozen=True, slots=True)
class JobState:
    """What a caller (in any process) can see of a job."""

    id: str
    unit: str
    queue: str
    status: JobStatus
    deliveries: int = 0
    attempts: int = 0
    result: bytes | None = None  # encoded with codec, when SUCCEEDED
    error: bytes | None = None  # JSON of foundry.serialize.encode_error, when FAILED/DEAD
    dead_reason: str | None = None
    codec: str = "json"
    enqueued_at: float = 0.0
    finished_at: float | None = None
    eta: float | None = None
    priority: int = 0
    key: str | None = None
    payload: bytes | None = None
    cancel_requested_at: float | None = None  # a cancel was requested (unix time) while it ran
    progress: JobProgress | None = None  # the last progress its deliveries recorded


@dataclass(frozen=True, slots=True)
class QueueStats:
    depth: int  # claimable now
    scheduled: int  # waiting for eta / retry
    running: int
    dead: int
    oldest_age: float  # seconds the oldest claimable job has waited (0 when empty)


@dataclass(frozen=True, slots=True)
class Capabilities:
    notify: bool = False  # claim/wait wake by notification instead of polling
    priority: bool = True
    cross_process_results: bool = True
    extras: tuple[str, ...] = field(default=())


class QueueBackend(Protocol):
    """A durable queue engine. See the module docstring for the contract."""

    capabilities: ClassVar[Capabilities]

    @property
    def url(self) -> str:
        """The queue's URL with its secrets masked (``foundry.config.safe_url``): what
        messages, logs and tools show; the password itself stays with the driver."""
        ...

    def enqueue(self, job: NewJob) -> Enqueued: ...

    def enqueue_many(self, jobs: list[NewJob]) -> list[Enqueued]:
        """Enqueue a batch atomically where the engine allows (one commit)."""
        ...

    def claim(self, queue: str, worker: str, *, lease: float, limit: int, timeout: float) -> list[Claimed]:
        """Lease up to ``limit`` claimable jobs; block up to ``timeout`` s for the first."""
        ...

    def heartbeat(self, job_id: str, token: str, *, lease: float) -> bool:
        """Extend the lease to now + ``lease``; ``False`` when the token is stale."""
        ...

    def progress(self, job_id: str, token: str, progress: JobProgress) -> bool:
        """Record ``progress`` on the running delivery ``token`` of the job (replacing the
        last record); ``False`` when the token is stale or the job is not running."""
        ...

    def mark_alone(self, job_id: str, token: str) -> bool:
        """Record, durably and before it starts, that this delivery runs alone in its
        worker: if its lease lapses now, the job is charged with the worker's death.
        ``False`` when the token is stale (then do not run it). When it returns, what this
        backend accepted before it — the jobs the worker just gave back — is where other
        workers find it (an engine that publishes asynchronously waits for its
        confirmations), so a death of the worker now costs no other job its delivery."""
        ...

    def complete(self, job_id: str, token: str, result: bytes) -> bool:
        """Write the single completion record; ``False`` if the job already had one (or
        has a cancel request: then ``cancelled`` is written instead)."""
        ...

    def fail(
        self,
        job_id: str,
        token: str,
        error: bytes,
        *,
        retry_at: float | None = None,
        dead_reason: str | None = None,
    ) -> bool:
        """Record a failed attempt: retry at ``retry_at``, dead-letter with ``dead_reason``,
        or (neither) fail for good; ``cancelled`` instead, whatever was asked, when the job
        has a cancel request. ``False`` when the token is stale."""
        ...

    def release(self, job_id: str, token: str) -> bool:
        """Give a leased job back for immediate redelivery (graceful shutdown); one with a
        cancel request ends ``cancelled`` instead."""
        ...

    def cancel(self, job_id: str, *, running: bool = True) -> CancelResult:
        """Cancel a queued job now, or record a cancel request for a running one (unless
        ``running=False``); what happened, as a :class:`CancelResult`. Atomic: the job is
        in exactly one of those cases, and a completion racing the request either was
        written first (``FINISHED``) or is turned into ``cancelled``."""
        ...

    def cancel_requests(self, job_ids: Sequence[str], *, timeout: float) -> list[str]:
        """Those of ``job_ids`` (jobs the caller runs) that are running with a cancel
        request; blocks up to ``timeout`` seconds until there is one, woken by the engine's
        notification where it has one, looking at the store at least every second."""
        ...

    def get(self, job_id: str) -> JobState | None: ...

    def find(self, key: str) -> JobState | None:
        """The job enqueued with idempotency ``key``, if any."""
        ...

    def wait(self, job_id: str, timeout: float) -> JobState | None:
        """Block until the job is finished (or ``timeout``); return its latest state, without
        its payload (``payload=None``: a waiter needs the outcome; :meth:`get` has it)."""
        ...

    def dead_letters(self, queue: str | None = None, limit: int = 100) -> list[JobState]: ...

    def requeue(self, job_id: str) -> bool:
        """Move a dead or failed job back to the queue with fresh counters."""
        ...

    def stats(self, queue: str) -> QueueStats: ...

    def purge(self, now: float | None = None) -> int:
        """Delete finished jobs past their ``result_ttl``; return how many."""
        ...

    def close(self) -> None: ...


Unclaimed = tuple[str, str, float | None, int]
"""``(id, status or '', eta, priority)`` of a job ``claim_ids`` did not lease (``''``: no such job)."""


@runtime_checkable
class StateStore(QueueBackend, Protocol):
    """A queue engine that can also keep the job records of an engine whose broker
    carries only messages (the AMQP engine: RabbitMQ has no key/value store). The broker
    chooses which job runs next; the store keeps idempotency keys, leases, the single
    completion record, results, dead letters and counters, in its own tables or keys.
    The SQL engines (``_sql.SqlQueue``) and the Redis engine offer it; the AMQP engine
    opens one by URL through the family's registry and sees nothing but this contract.
    """

    def claim_ids(
        self, queue: str, ids: Sequence[str], worker: str, lease: float
    ) -> tuple[list[Claimed], list[Unclaimed]]:
        """Lease the given jobs if they are still queued in ``queue`` and due, in one
        atomic step per job (a job is leased once however many messages name it).
        Returns the claimed jobs (best priority first) and the others, as ``Unclaimed``."""
        ...

    def reap(self, queue: str) -> list[tuple[str, int]]:
        """Put lapsed leases back (or dead-letter a job out of deliveries); ``(id,
        priority)`` of those put back, whose message the broker must carry again."""
        ...

    def next_deadline(self, queue: str) -> float | None:
        """The earliest lease deadline in ``queue`` (``None`` when nothing is leased)."""
        ...

    def orphans(self, queue: str, before: float, limit: int) -> list[tuple[str, int]]:
        """Queued jobs due before ``before`` (maybe without a message): ``(id, priority)``,
        best first, at most ``limit``."""
        ...

    def queues(self) -> list[str]:
        """Every queue the store has a job of."""
        ...

    def destroy(self) -> None:
        """Delete every table or key of this store (tests, teardown)."""
        ...


def check_new_job(job: NewJob) -> None:
    """Reject a job no engine could carry, naming the field and the fix (every engine
    calls this first in ``enqueue``/``enqueue_many``, so bad input never reaches a store)."""

    def bad(name: str, problem: str, fix: str) -> SubmitError:
        value = getattr(job, name)
        return SubmitError(f"job {job.id!r} (unit {job.unit!r}): {name}={value!r} {problem}. Fix: {fix}")

    for name in ("id", "unit"):
        value = getattr(job, name)
        if not isinstance(value, str) or not value or len(value) > 255 or not value.isprintable():
            raise bad(
                name, "is not a non-empty printable string of at most 255 characters", f"give a {name} name"
            )
    problem = queue_name_problem(job.queue)
    if problem is not None:
        raise bad("queue", problem, 'name the queue, e.g. queue="emails"')
    if not isinstance(job.payload, bytes | bytearray | memoryview):
        raise bad("payload", "is not bytes", "encode it with foundry.serialize.get_codec(...).encode")
    if job.codec not in ("json", "pickle"):
        raise bad("codec", "is not a codec Foundry knows", "use 'json' (default) or 'pickle'")
    if job.key is not None and (not isinstance(job.key, str) or not job.key):
        raise bad("key", "is not a non-empty string", "give an idempotency key string, or None")
    if isinstance(job.priority, bool) or not isinstance(job.priority, int) or abs(job.priority) > 2**31 - 1:
        raise bad("priority", "is not a 32-bit integer", "use a small integer; higher runs first")
    if job.eta is not None and (not isinstance(job.eta, int | float) or not math.isfinite(job.eta)):
        raise bad("eta", "is not a finite unix time", "give time.time() + delay, or None for now")
    if (
        isinstance(job.max_retries, bool)
        or not isinstance(job.max_retries, int)
        or not 0 <= job.max_retries <= 2**31 - 1
    ):
        raise bad("max_retries", "is not an integer from 0 to 2**31-1", "use retries=0 or more")
    if (
        isinstance(job.max_deliveries, bool)
        or not isinstance(job.max_deliveries, int)
        or not 1 <= job.max_deliveries <= 2**31 - 1
    ):
        raise bad("max_deliveries", "is not an integer from 1 to 2**31-1", "use max_deliveries=1 or more")
    if job.timeout is not None and (
        not isinstance(job.timeout, int | float) or not math.isfinite(job.timeout) or job.timeout <= 0
    ):
        raise bad("timeout", "is not a positive number of seconds", "give a timeout > 0, or None")
    if (
        not isinstance(job.result_ttl, int | float)
        or not math.isfinite(job.result_ttl)
        or job.result_ttl <= 0
    ):
        raise bad("result_ttl", "is not a positive number of seconds", "keep results e.g. 7 days (604800)")
    if job.trace is not None and parse_trace(job.trace) != job.trace:
        raise bad(
            "trace", "is not a W3C trace context", "give foundry.tracecontext.pack(traceparent), or None"
        )


def check_queue_name(queue: object, what: str = "claim") -> None:
    """Refuse a queue name that not every engine can carry (:data:`foundry.traits.QUEUE_NAME_RULE`)."""
    problem = queue_name_problem(queue)
    if problem is not None:
        raise SubmitError(f"{what}: queue={queue!r} {problem}. Fix: name the queue, e.g. 'emails'")


def check_claim(queue: str, lease: float, limit: int) -> None:
    """Refuse a claim no engine could serve, naming the field and the fix."""
    check_queue_name(queue)
    if not isinstance(lease, int | float) or not lease > 0 or not math.isfinite(lease):
        raise SubmitError(f"claim on queue {queue!r}: lease={lease!r} must be a positive number of seconds")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise SubmitError(f"claim on queue {queue!r}: limit={limit!r} must be an integer >= 1")


def check_fail(job_id: str, retry_at: float | None, dead_reason: str | None) -> None:
    """Refuse a ``fail`` that asks for two outcomes at once."""
    if retry_at is not None and dead_reason is not None:
        raise SubmitError(
            f"fail of job {job_id!r}: give retry_at or dead_reason, not both. Fix: choose one outcome"
        )
