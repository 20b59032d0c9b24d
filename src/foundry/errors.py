"""Every error Foundry raises, in one tree.

    FoundryError                      root; catch this to catch anything of ours
    ├── DeclarationError (ValueError) a unit was declared wrongly; raised at declaration time
    │   └── UnknownTraitError         a keyword Foundry does not know (typo?)
    ├── ConfigError (ValueError)      a backend URL, foundry.toml or FOUNDRY_* value is wrong
    ├── SubmitError (ValueError)      these arguments cannot be carried by the chosen model
    │   └── PayloadTooLargeError      the encoded payload exceeds the backend's limit
    ├── OverloadError                 a bounded intake is full and the policy is "reject"
    ├── ChannelError                  a message channel (foundry.execute.channels) refused
    │   ├── ChannelClosedError        ... because *your* code closed this end, then used it
    │   ├── BrokenChannelError        ... sending, but every receiver is gone (nobody would read it)
    │   ├── EndOfChannel              ... receiving, every sender closed and the buffer is drained
    │   ├── ChannelFullError (OverloadError, TimeoutError)  still full when the send timed out
    │   └── ChannelEmptyError (TimeoutError)  still empty when the receive timed out
    ├── PoolDeadlockError             a pooled task waited on its own pool with every slot taken
    │   └── PoolDeadlockTimeoutError (ResultTimeoutError)  ... in a timed wait: it times out now
    ├── WorkTimeoutError (TimeoutError)  the work itself exceeded its declared timeout
    ├── ResultTimeoutError (TimeoutError) the *wait* for a result timed out; the work may go on
    ├── CancelledError                the work was cancelled before it produced a result
    ├── ChildCrashedError             a child process died (signal or exit code) while running it
    ├── RemoteError                   the work failed in another process and its type could not
    │                                 be rebuilt here; carries the original type name and traceback
    ├── DeadLetteredError             a durable job gave up (retries exhausted, poison, bad input)
    ├── BackendError                  the substrate (SQLite, Redis, RabbitMQ, PostgreSQL, NATS) failed
    │   └── BackendUnavailableError   ... because it cannot be reached; usually transient
    ├── NonDeterminismError           a workflow's code no longer matches its journal
    ├── WorkflowFinishedError         a signal was sent to a workflow that already finished
    ├── LeaseLostError                another worker took over this durable work (our lease lapsed);
    │                                 our writes are fenced off and this run stops
    ├── LabInputError (ValueError)    a `foundry lab` model was given an input it cannot use
    └── NotFoundError (LookupError)   no such job, workflow, group, unit or offset

Messages follow one rule: name the unit of work, the field, the value, and the fix.
Errors raised for a lower-level library's failure chain it with ``raise ... from exc``.
"""

from __future__ import annotations

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
    "ConfigError",
    "DeadLetteredError",
    "DeclarationError",
    "EndOfChannel",
    "FoundryError",
    "LabInputError",
    "LeaseLostError",
    "NonDeterminismError",
    "NotFoundError",
    "OverloadError",
    "PayloadTooLargeError",
    "PoolDeadlockError",
    "PoolDeadlockTimeoutError",
    "RemoteError",
    "ResultTimeoutError",
    "SubmitError",
    "UnknownTraitError",
    "WorkTimeoutError",
    "WorkflowFinishedError",
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


class CancelledError(FoundryError):
    """The work was cancelled before it produced a result."""


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


class BackendError(FoundryError):
    """The durable substrate failed."""


class BackendUnavailableError(BackendError):
    """The substrate cannot be reached (connection refused, broker restarting)."""


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
