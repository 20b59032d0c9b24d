"""Every error Foundry raises, in one tree.

    FoundryError                      root; catch this to catch anything of ours
    ├── DeclarationError (ValueError) a unit was declared wrongly; raised at declaration time
    │   └── UnknownTraitError         a keyword Foundry does not know (typo?)
    ├── ConfigError (ValueError)      a backend URL, foundry.toml or FOUNDRY_* value is wrong
    ├── SubmitError (ValueError)      these arguments cannot be carried by the chosen model
    │   └── PayloadTooLargeError      the encoded payload exceeds the backend's limit
    ├── OverloadError                 a bounded intake is full and the policy is "reject"
    ├── PoolError                     the work pool could not carry a request (``foundry.deliver.pool``)
    │   ├── NoWorkerError             ... no worker serves the unit (none started, all dead): fails fast
    │   ├── WorkerLostError           ... the worker running it died, timed out or was cut off; the
    │   │                                 work may or may not have happened (not idempotent: no retry)
    │   └── DeadlineExceededError (TimeoutError)  ... no free worker, or no answer, within the deadline
    ├── ChannelError                  a message channel (foundry.execute.channels) refused
    │   ├── ChannelClosedError        ... because *your* code closed this end, then used it
    │   ├── BrokenChannelError        ... sending, but every receiver is gone (nobody would read it)
    │   ├── EndOfChannel              ... receiving, every sender closed and the buffer is drained
    │   ├── ChannelFullError (OverloadError, TimeoutError)  still full when the send timed out
    │   └── ChannelEmptyError (TimeoutError)  still empty when the receive timed out
    ├── PoolDeadlockError             a pooled task waited on its own pool with every slot taken
    │   └── PoolDeadlockTimeoutError (ResultTimeoutError)  ... in a timed wait: it times out now
    ├── WorkTimeoutError (TimeoutError)  the work itself exceeded its declared timeout
    ├── WorkflowTimeoutError (TimeoutError)  a workflow ran past its timeout= (its deadline in the
    │                                 journal); it compensated and ended ``timed_out``
    ├── ResultTimeoutError (TimeoutError) the *wait* for a result timed out; the work may go on
    ├── CancelledError (concurrent.futures.CancelledError)  the work was cancelled before it
    │                                 produced a result (never asyncio.CancelledError: see below)
    ├── ChildCrashedError             a child process died (signal or exit code) while running it
    ├── RemoteError                   the work failed in another process and its type could not
    │                                 be rebuilt here; carries the original type name and traceback
    ├── DeadLetteredError             a durable job gave up (retries exhausted, poison, bad input)
    ├── RecordError                   a record read from a store is malformed or disagrees with the
    │   │                             unit's declaration (another codec); refused, never decoded
    │   └── MalformedRecordError (BackendError)  ... a job record not in Foundry's format
    ├── BackendError                  the substrate (SQLite, Redis, RabbitMQ, PostgreSQL, NATS) failed
    │   ├── BackendUnavailableError   ... because it cannot be reached; usually transient
    │   ├── StorageError              ... because its storage refuses writes (disk full, read-only)
    │   └── ClusterError              a cluster engine (Dask, Ray) could not compute a parallel chunk
    │       ├── ClusterUnavailableError (BackendUnavailableError)  ... its scheduler/head is gone
    │       └── ClusterWorkerLostError (ChildCrashedError)  ... the worker computing it died
    ├── WorkerFailedError             a worker stopped because one of its own threads failed
    ├── NonDeterminismError           a workflow's code no longer matches its journal
    ├── WorkflowFinishedError         a signal was sent to a workflow that already finished
    ├── LeaseLostError                another worker took over this durable work (our lease lapsed);
    │                                 our writes are fenced off and this run stops
    ├── LabInputError (ValueError)    a `foundry lab` model was given an input it cannot use
    └── NotFoundError (LookupError)   no such job, workflow, group, unit or offset

``CancelledError`` says what ``concurrent.futures`` says when a ``Future`` is cancelled,
so ``except concurrent.futures.CancelledError`` around ``handle.result()`` catches it as
it would around ``future.result()``; it stays an ``Exception`` under ``FoundryError``.
It is deliberately *not* an ``asyncio.CancelledError``. That one is a ``BaseException``
that tells the event loop "this task is being cancelled": a coroutine that lets one out
of ``await handle`` is marked cancelled itself (``task.cancelled()`` turns true),
``asyncio.gather`` and ``TaskGroup`` treat it as cancellation instead of a failure to
report, and ``asyncio.timeout``/``wait_for`` may take it for their own. Work cancelled
elsewhere (another process, a ``foundry jobs cancel``) is an outcome of that work, not a
cancellation of the task waiting for it, so ``await handle`` raises this error as an
ordinary exception; cancelling the awaiting task itself still raises asyncio's.

Messages follow one rule: name the unit of work, the field, the value, and the fix.
Errors raised for a lower-level library's failure chain it with ``raise ... from exc``.

An error whose constructor takes more than a message defines ``__reduce__`` with its
constructor's arguments (each kept as an attribute of the same name). That one
definition carries it across a process and a store: pickled over a child's pipe, and
written as a JSON error record (a queue's result, a workflow journal) whose ``args`` are
those arguments, rebuilt by :func:`foundry.serialize.decode_error` — explicitly, by
calling the allow-listed class, never by unpickling — so ``ChildCrashedError.exitcode``
survives the trip.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

__all__ = [
    "BackendError",
    "BackendUnavailableError",
    "BrokenChannelError",
    "CancelledError",
    "ChannelClosedError",
    "ChannelEmptyError",
    "ChannelError",
    "ChannelFullError",
    "ChildCrashedError",
    "ClusterError",
    "ClusterUnavailableError",
    "ClusterWorkerLostError",
    "ConfigError",
    "DeadLetteredError",
    "DeadlineExceededError",
    "DeclarationError",
    "EndOfChannel",
    "FoundryError",
    "LabInputError",
    "LeaseLostError",
    "MalformedRecordError",
    "NoWorkerError",
    "NonDeterminismError",
    "NotFoundError",
    "OverloadError",
    "PayloadTooLargeError",
    "PoolDeadlockError",
    "PoolDeadlockTimeoutError",
    "PoolError",
    "RecordError",
    "RemoteError",
    "ResultTimeoutError",
    "StorageError",
    "SubmitError",
    "UnknownTraitError",
    "WorkTimeoutError",
    "WorkerFailedError",
    "WorkerLostError",
    "WorkflowFinishedError",
    "WorkflowTimeoutError",
    "declaration_error",
]


class FoundryError(Exception):
    """Root of every error Foundry raises."""


class DeclarationError(FoundryError, ValueError):
    """A unit of work was declared with a bad or contradictory trait.

    Attributes name what was wrong so tools can point at it: ``unit``, ``field``,
    ``value`` and ``fix``.
    """

    def __init__(self, unit: str, field: str, value: Any, problem: str, fix: str) -> None:
        self.unit = unit
        self.field = field
        self.value = value
        self.problem = problem
        self.fix = fix
        super().__init__(f"unit {unit!r}: {field}={value!r} {problem}. Fix: {fix}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.unit, self.field, self.value, self.problem, self.fix))


class UnknownTraitError(DeclarationError):
    """A keyword that is not a trait; usually a typo."""


def declaration_error(unit: str, field: str, value: Any, problem: str, fix: str) -> DeclarationError:
    """Build a :class:`DeclarationError` (helper that keeps call sites on one line)."""
    return DeclarationError(unit, field, value, problem, fix)


class ConfigError(FoundryError, ValueError):
    """Configuration (a backend URL, ``foundry.toml``, ``FOUNDRY_*``) is wrong."""


class SubmitError(FoundryError, ValueError):
    """The arguments cannot be carried by the chosen model (e.g. unpicklable for a process)."""


class PayloadTooLargeError(SubmitError):
    """The encoded payload is larger than the backend accepts."""


class OverloadError(FoundryError):
    """A bounded intake is full and its overflow policy is ``reject``."""


class PoolError(FoundryError):
    """The work pool could not carry a request to an answer (see the subclasses).

    ``unit`` names the unit, ``request`` the request id, ``key`` its idempotency key
    and ``attempts`` how many workers it was handed to.
    """

    def __init__(self, unit: str, request: str, key: str, attempts: int, message: str) -> None:
        self.unit = unit
        self.request = request
        self.key = key
        self.attempts = attempts
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.unit, self.request, self.key, self.attempts, str(self)))


class NoWorkerError(PoolError):
    """No worker serves the unit at all: none was started, every one is dead, or (NATS)
    nobody subscribes to its subject. Raised at once, not at the deadline."""


class WorkerLostError(PoolError):
    """The worker running the request died, timed out or was cut off before it answered.
    The work may or may not have happened; a unit declared ``idempotent=True`` is retried
    on another worker instead of raising this (until its attempts or deadline run out)."""


class DeadlineExceededError(PoolError, TimeoutError):
    """The request's deadline passed before a worker was free, or before one answered."""


class ChannelError(FoundryError):
    """A message channel refused a send or a receive (see the subclasses)."""


class ChannelClosedError(ChannelError):
    """This end of the channel was closed by your own code and then used (trio's
    ``ClosedResourceError``)."""


class BrokenChannelError(ChannelError):
    """A send found every receiving end closed: the item would never be read (trio's
    ``BrokenResourceError``). The item was not accepted."""


class EndOfChannel(ChannelError):
    """Every sending end is closed and every buffered item has been received: the
    normal end of a stream of messages, not a failure."""


class ChannelFullError(ChannelError, OverloadError, TimeoutError):
    """The channel stayed full (backpressure) until the send timed out, or a
    ``send_nowait`` found it full. The item was not accepted."""


class ChannelEmptyError(ChannelError, TimeoutError):
    """Nothing arrived before the receive timed out, or ``receive_nowait`` found the
    channel empty."""


class PoolDeadlockError(FoundryError):
    """A task running on a pool waited on another task of the same pool while every
    slot was taken by such waiters: nothing could ever complete."""


class ResultTimeoutError(FoundryError, TimeoutError):
    """Waiting for a result timed out. The work itself may still be running."""


class PoolDeadlockTimeoutError(PoolDeadlockError, ResultTimeoutError):
    """A *timed* wait inside a pool that could only have ended by timing out (every slot
    was taken by waiters and it was due first): it times out now, and says why. Code
    that handles ``ResultTimeoutError`` keeps working."""


class WorkTimeoutError(FoundryError, TimeoutError):
    """The work exceeded its own timeout and was stopped."""


class WorkflowTimeoutError(FoundryError, TimeoutError):
    """A workflow ran past its declared ``timeout=``: the deadline is a timer in its
    journal, found by whichever run came next (the one that started it, or another
    worker's after a crash); the run stopped at its next durable call (or left the step
    it was in), undid its completed steps and ended ``timed_out``."""


class CancelledError(FoundryError, concurrent.futures.CancelledError):
    """The work was cancelled before it produced a result. Also a
    :class:`concurrent.futures.CancelledError`, never an :class:`asyncio.CancelledError`
    (the module docstring says why)."""


class ChildCrashedError(FoundryError):
    """A child process died while running the work.

    ``exitcode`` is the raw code (negative for a signal, as ``multiprocessing`` reports
    it: -11 is SIGSEGV) and ``signal_name`` the signal's name when there is one.
    """

    def __init__(self, unit: str, exitcode: int | None, signal_name: str | None) -> None:
        self.unit = unit
        self.exitcode = exitcode
        self.signal_name = signal_name
        how = f"signal {signal_name}" if signal_name else f"exit code {exitcode}"
        super().__init__(
            f"unit {unit!r}: the child process running it died with {how} "
            f"(exitcode={exitcode}); only this task failed, the pool replaced the child. "
            "Fix: the work crashed natively; reproduce it with `foundry profile` or run it "
            "under faulthandler"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.unit, self.exitcode, self.signal_name))


class RemoteError(FoundryError):
    """The work failed elsewhere and its exception type could not be rebuilt here."""

    def __init__(self, type_name: str, message: str, traceback_text: str = "") -> None:
        self.type_name = type_name
        self.message = message
        self.traceback_text = traceback_text
        super().__init__(f"{type_name}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.type_name, self.message, self.traceback_text))


class DeadLetteredError(FoundryError):
    """A durable job was moved to the dead-letter store; ``reason`` says why."""

    def __init__(self, job_id: str, reason: str) -> None:
        self.job_id = job_id
        self.reason = reason
        super().__init__(
            f"job {job_id} was dead-lettered: {reason}. "
            f"Fix: inspect it with `foundry jobs show {job_id}`, then `foundry jobs requeue {job_id}`"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.job_id, self.reason))


class RecordError(FoundryError):
    """A record read from a store (a job, a result, a journal entry) is malformed, or
    disagrees with what this process declares for its unit (another codec): it was
    refused, not decoded. Anyone who can write to the store can write such a record
    (``docs/security.md``)."""


class BackendError(FoundryError):
    """The durable substrate failed."""


class BackendUnavailableError(BackendError):
    """The substrate cannot be reached (connection refused, broker restarting)."""


class ClusterError(BackendError):
    """A cluster engine (Dask distributed, Ray) could not compute a ``parallel`` chunk:
    the driver's own error, named with the engine, the chunk and the fix."""


class ClusterUnavailableError(ClusterError, BackendUnavailableError):
    """The cluster cannot be reached, or its scheduler (Dask) or head node (Ray) went
    away during a run. Every chunk not yet computed fails with it; nothing is re-sent."""


class ClusterWorkerLostError(ClusterError, ChildCrashedError):
    """The cluster worker computing a chunk died (a native crash, out of memory, its
    machine gone) and the cluster gave up re-running it. Only that chunk's items fail.
    Also a :class:`ChildCrashedError`, as a dead local child is (``exitcode`` and
    ``signal_name`` are ``None``: a cluster does not report them)."""

    def __init__(self, unit: str, engine: str, detail: str) -> None:
        self.unit = unit
        self.engine = engine
        self.detail = detail
        self.exitcode = None
        self.signal_name = None
        Exception.__init__(
            self,
            f"parallel {unit!r}: the {engine} worker computing this chunk died, and the cluster gave up "
            f"re-running it ({detail}); only this chunk's items failed. Fix: the work crashed or "
            "exhausted its worker (native crash, out of memory): reproduce it on this machine with "
            "cluster='local://', or give the workers more memory",
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.unit, self.engine, self.detail))


class StorageError(BackendError):
    """The store is reachable but its storage refuses writes: the disk is full, or the
    file or file system is read-only. Unlike an outage it does not pass by itself:
    somebody must free space or fix the permissions (the message says where)."""


class MalformedRecordError(RecordError, BackendError):
    """A record in the store (a job row, a Redis hash, a broker message) is not in
    Foundry's format: written by something else, or altered. ``record`` names it (a job
    id, or a description), ``field`` and ``value`` what is wrong with it. A worker never
    runs such a record: it dead-letters it with this message as the reason. It is a
    :class:`RecordError` (refused, never decoded: what a reader of a hostile record
    catches) and a :class:`BackendError` (the store holds it: what a claim loop retries
    past)."""

    def __init__(self, record: str, field: str, value: Any, problem: str) -> None:
        self.record = record
        self.field = field
        self.value = value
        self.problem = problem
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(
            f"malformed record {record!r}: {field}={shown} {problem}. Fix: the record was not written "
            "by Foundry or was altered; correct or delete it in the store (Foundry does not run it)"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.record, self.field, self.value, self.problem))


class WorkerFailedError(FoundryError):
    """A worker stopped because one of its own threads failed in a way it cannot recover
    from: a queue worker's claimer, acknowledger, runner, heartbeat or its store's
    publisher; a workflow worker's claim loop or keeper (heartbeats, wake-ups). The worker
    gave back what it could; leases of the rest lapse and the jobs are delivered again,
    the workflows resumed. ``foundry worker`` and ``foundry workflows worker`` print it
    and exit non-zero."""


class NonDeterminismError(FoundryError):
    """A workflow replayed against its journal took a different path than it recorded."""


class WorkflowFinishedError(FoundryError):
    """A signal (or other input) was sent to a workflow that already finished; nothing
    was recorded and the workflow's journal is unchanged."""


class LeaseLostError(FoundryError):
    """This worker's lease on a workflow lapsed and another worker claimed it: every
    write of the old run is rejected (fenced by the lease token), and the run stops."""


class LabInputError(FoundryError, ValueError):
    """A queueing model or simulation of ``foundry lab`` was given an input it cannot use
    (zero workers, a negative rate, a simulation of an unstable queue without a horizon).

    Attributes name what was wrong: ``field``, ``value``, ``problem`` and ``fix``.
    """

    def __init__(self, field: str, value: Any, problem: str, fix: str) -> None:
        self.field = field
        self.value = value
        self.problem = problem
        self.fix = fix
        super().__init__(f"lab: {field}={value!r} {problem}. Fix: {fix}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.field, self.value, self.problem, self.fix))


class NotFoundError(FoundryError, LookupError):
    """No such job, workflow, consumer group, unit or offset."""
