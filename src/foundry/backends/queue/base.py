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
* **Poison jobs go to dead letters.** When a job's lease lapses and the deliveries that
  ended without a recorded outcome (``deliveries - attempts``) have reached
  ``max_deliveries``, the engine moves it to the dead-letter set (``dead_reason`` says
  the worker died or hung that many times) instead of delivering it again.
  ``release`` gives the delivery back (it does not count), so graceful restarts never
  poison a job.
* **Cancellation** of a queued job (``cancel``) succeeds only while nobody holds it.
* **Results expire.** A finished job's record (and result) is kept until read or
  until ``result_ttl`` passes, whichever is later-bounded by ``purge``.

Every method may raise :class:`~foundry.errors.BackendUnavailableError` when the
engine cannot be reached; callers retry with backoff, and no accepted job is lost
because the store, not the worker, is the source of truth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar, Protocol

from foundry.errors import SubmitError

__all__ = [
    "Capabilities",
    "Claimed",
    "Enqueued",
    "JobState",
    "JobStatus",
    "NewJob",
    "QueueBackend",
    "QueueStats",
    "check_new_job",
]


class JobStatus(StrEnum):
    QUEUED = "queued"  # claimable now or at eta (includes scheduled retries)
    RUNNING = "running"  # leased to a worker
    SUCCEEDED = "succeeded"  # completion record written
    FAILED = "failed"  # failed for good without dead-lettering (retries exhausted)
    DEAD = "dead"  # in the dead-letter set, with a reason
    CANCELLED = "cancelled"


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
    url: str

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

    def complete(self, job_id: str, token: str, result: bytes) -> bool:
        """Write the single completion record; ``False`` if the job already had one."""
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
        or (neither) fail for good. ``False`` when the token is stale."""
        ...

    def release(self, job_id: str, token: str) -> bool:
        """Give a leased job back for immediate redelivery (graceful shutdown)."""
        ...

    def cancel(self, job_id: str) -> bool:
        """Cancel a job nobody holds; ``True`` when it will not run."""
        ...

    def get(self, job_id: str) -> JobState | None: ...

    def find(self, key: str) -> JobState | None:
        """The job enqueued with idempotency ``key``, if any."""
        ...

    def wait(self, job_id: str, timeout: float) -> JobState | None:
        """Block until the job is finished (or ``timeout``); return its latest state."""
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


def check_new_job(job: NewJob) -> None:
    """Reject a job no engine could carry, naming the field and the fix (every engine
    calls this first in ``enqueue``/``enqueue_many``, so bad input never reaches a store)."""

    def bad(name: str, problem: str, fix: str) -> SubmitError:
        value = getattr(job, name)
        return SubmitError(f"job {job.id!r} (unit {job.unit!r}): {name}={value!r} {problem}. Fix: {fix}")

    for name in ("id", "queue", "unit"):
        value = getattr(job, name)
        if not isinstance(value, str) or not value or len(value) > 255:
            raise bad(name, "is not a non-empty string of at most 255 characters", f"give a {name} name")
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
    if isinstance(job.max_retries, bool) or not isinstance(job.max_retries, int) or job.max_retries < 0:
        raise bad("max_retries", "is not an integer >= 0", "use retries=0 or more")
    if (
        isinstance(job.max_deliveries, bool)
        or not isinstance(job.max_deliveries, int)
        or job.max_deliveries < 1
    ):
        raise bad("max_deliveries", "is not an integer >= 1", "use max_deliveries=1 or more")
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
