"""The workflow journal contract: the cut between Foundry's workflow runtime and a database.

Every engine (SQLite, PostgreSQL) implements :class:`JournalBackend` and passes the one
conformance suite (``tests/workflows/test_journal_conformance.py``). A journal holds, per
workflow, one row of state and an append-only list of :class:`Entry` records indexed by
*position* (the n-th durable call the workflow code made). The contract:

* **Start is idempotent on the workflow id.** Starting an id that exists creates nothing
  and returns the existing state with ``created=False`` — the id is the idempotency key.
  ``start(..., owner=...)`` creates the workflow already claimed by ``owner`` (token 1), so
  the caller can run it at once without a second round trip.
* **One run at a time, fenced.** A workflow is *claimable* when it is unfinished, nobody
  holds an unexpired lease on it and its ``wake_at`` has passed. ``claim`` hands it to
  exactly one owner with a fresh ``token`` (an epoch that only grows) and a lease
  deadline; ``heartbeat`` extends the lease. Every write a run makes (``record``,
  ``record_transactional``, ``consume_signal``, ``suspend``, ``release``,
  ``set_compensating``, ``finish``) carries the token and is rejected with
  :class:`~foundry.errors.LeaseLostError` when the token is no longer current: a worker
  that stalled past its lease cannot write into the journal of the run that replaced it.
* **An entry is written once per position.** ``record`` stores a *final* entry (``ok`` or
  ``error``) at most once per position: when a final entry is already there (a previous
  run got there first) nothing changes and that entry is returned with ``written=False``.
  A ``waiting`` entry (a timer, a signal wait, a child, a retry back-off) may be replaced
  by a later ``waiting`` entry or resolved once by a final one.
* **A transactional step commits with its record.** ``record_transactional`` opens one
  database transaction, checks the fence, hands the step a :class:`Tx` on that same
  transaction, writes the entry, and commits once: the step's writes and its journal
  record become durable together or not at all (exactly-once effect for writes to the
  journal's own database). If a final entry already exists, the step is not run.
* **Signals are a durable inbox.** ``signal`` appends to the workflow's inbox (accepted
  while the workflow is unfinished, even before it first runs); ``consume_signal`` takes
  the oldest unconsumed signal of a name and resolves the waiting entry with it in one
  transaction, so a signal is consumed at most once and never lost.
* **Timers live in the store.** ``suspend`` releases the lease and parks the workflow
  until ``wake_at``; a signal, a child's completion or a cancellation request wakes it
  early. No wake-up is lost to a race: every such event bumps ``wakeups``, and a
  ``suspend`` whose ``seen_wakeups`` is stale parks with ``wake_at`` = now.
* **Cancellation is a request.** ``request_cancel`` flags the workflow (and its unfinished
  descendants) and wakes it; the run observes the flag at its next durable call and
  compensates. ``finish(SUCCEEDED)`` refuses (returns ``False``) when a cancellation was
  requested first, so an accepted cancel always ends in ``cancelled``.
* **A suspect runs alone; only a workflow that ran alone is charged with its worker's
  death.** A claim that finds the previous claim's lease lapsed with its owner still set
  (the worker died or hung holding it) returns ``Claim.suspect``: the workflow may be what
  killed that worker, or merely have shared it. A worker runs a suspect with nothing else
  and says so first (``mark_alone``); when the lease of a run marked so lapses, the next
  claim counts a crash, and at ``MAX_CRASHES`` (3) it sets the workflow aside — ended
  ``failed``, its error saying its worker died while it ran alone that many times —
  instead of handing it out again. A lapse of any other run is not counted, so a healthy
  workflow that shared a worker with a poison one is never charged. ``suspend`` clears
  the count (the workflow made progress); ``release(..., suspect=True)`` hands a suspect
  back unrun and still a suspect.
* **Malformed rows are set aside, never run.** A row that is not what Foundry writes
  (see ``_records``: written by something else, or altered) ends its workflow ``failed``
  with a :class:`~foundry.errors.MalformedRecordError` naming the field as its error, when
  a claim meets it or a run reads it; a listing leaves it out with a warning; ``get``
  raises that error for it until it is set aside (then it is read leniently, so that its
  reason shows). The other workflows of a claim are handed out as usual.
* **Finishing a child resolves its parent.** ``finish`` of a workflow started by a parent
  resolves the parent's waiting ``child`` entry and wakes the parent, in the same commit.
* **A workflow's deadline is a timer in the store.** ``start`` of a ``NewWorkflow`` with a
  ``timeout`` stores ``deadline`` = now + timeout (the journal's clock), returned in every
  ``WorkflowState`` and ``Claim``; ``suspend`` never parks a workflow past its deadline
  (``wake_at`` = min(wake_at, deadline)), so whoever claims it next — the worker that
  started the timer, or any other once that one's lease lapsed — finds it expired. The
  run that finds it so ends it ``timed_out`` (a finished status, like ``failed``).
* **Published state is read without touching the run.** ``publish`` (fenced, like every
  write of a run) replaces the workflow's published state (``WorkflowState.published``,
  JSON bytes); reading it is a plain read of the row (``get``): a query never changes the
  workflow, never wakes it and never waits for its worker.
* **A fork copies a prefix of a history.** ``fork`` creates a new workflow (pending, with
  ``origin`` saying where it came from) whose entries are the source's entries before
  ``upto``, in one transaction; the source is unchanged. It is how a finished run is
  reset to a completed step: the new run replays what it copied and runs the rest.

* **The trace context travels with the workflow.** ``NewWorkflow.trace`` (a W3C trace
  context, ``foundry.tracecontext``) is stored with the workflow and handed out on every
  ``Claim`` of it, each resumption included; a row without one (an older Foundry's) or
  with a value that is not a trace context reads as ``None``, never as malformed.

* **Waiters are woken, the journal stays the truth.** ``changes`` (:class:`Changes`) wakes
  a waiter after a commit that may end its wait: a workflow started without an owner, a
  signal, a cancellation request, a release, a suspension that is due at once, a
  finish (its result, and its parent). A waiter takes a ``mark()``, looks at the
  journal, and ``wait(mark, timeout)``s; a wake-up is only a hint to look again, so a
  lost one costs latency, never correctness. ``changes.cross_process`` says whether
  other processes' commits wake it too (SQLite on Linux: the doorbell; PostgreSQL:
  ``NOTIFY`` in the commit and a ``LISTEN`` thread while somebody waits); when not, the
  caller polls as before. ``wait_async`` is the same wait for a coroutine: it holds no
  thread, and the wake-up reaches its loop through ``call_soon_threadsafe``.

Every method may raise :class:`~foundry.errors.BackendUnavailableError` when the database
cannot be reached and :class:`~foundry.errors.BackendError` for other database failures;
callers retry with back-off. Nothing accepted is kept only in memory: the journal, not
the worker, is the source of truth. Times are unix seconds from the backend's ``clock``
(injectable, so tests never sleep); leases assume the workers' clocks agree to well
within a lease.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Protocol

__all__ = [
    "ACTIVE",
    "FINISHED",
    "Beat",
    "Changes",
    "Claim",
    "Clock",
    "Entry",
    "EntryKind",
    "EntryStatus",
    "JournalBackend",
    "ManualClock",
    "NewWorkflow",
    "Recorded",
    "SignalRecord",
    "Started",
    "SystemClock",
    "Tx",
    "WorkflowState",
    "WorkflowStatus",
]


class WorkflowStatus(StrEnum):
    PENDING = "pending"  # created, never claimed
    RUNNING = "running"  # leased to a worker (or orphaned: the lease lapsed)
    WAITING = "waiting"  # parked until wake_at (sleep, signal, child, retry back-off)
    COMPENSATING = "compensating"  # running the undo of completed steps
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"  # its deadline (``timeout=``) passed; its completed steps were undone

    @property
    def finished(self) -> bool:
        return self in FINISHED


FINISHED: frozenset[WorkflowStatus] = frozenset(
    {WorkflowStatus.SUCCEEDED, WorkflowStatus.FAILED, WorkflowStatus.CANCELLED, WorkflowStatus.TIMED_OUT}
)


ACTIVE: tuple[str, ...] = ("pending", "running", "waiting", "compensating")


class EntryKind(StrEnum):
    STEP = "step"
    UNDO = "undo"  # the compensation of the step at ``ref``
    SLEEP = "sleep"
    SIGNAL = "signal"  # wait_for(name): result is the payload, detail "timeout" on timeout
    CHILD = "child"  # detail is the child's workflow id
    CANCEL = "cancel"  # the position at which a cancellation request was observed
    GATHER = "gather"  # a fan-out: detail is its branch count, the branches follow it (ref = its position)
    PATCH = "patch"  # a ``wf.patched(name)`` marker: this run took the new code path
    TIMEOUT = "timeout"  # the position at which the workflow's deadline was found passed


class EntryStatus(StrEnum):
    OK = "ok"
    ERROR = "error"
    WAITING = "waiting"


@dataclass(slots=True)
class Entry:
    """One durable call of a workflow, at ``position``.

    ``result`` is the encoded value (codec of the workflow); ``error`` the JSON of
    :func:`foundry.serialize.encode_error`. ``attempts`` counts executions of the step's
    code in the run(s) that produced this entry; ``wake_at`` is the timer of a waiting
    entry (the sleep's end, a signal wait's deadline, a retry's next attempt).

    A value: nothing changes an entry once it is made (a new state of a position is a new
    entry). It is not a frozen dataclass only because one is made for every step and
    every row read, and a frozen one sets each of its twelve fields through
    ``object.__setattr__`` — a tenth of the instructions of a no-op step.
    """

    position: int
    kind: str
    name: str
    status: str
    result: bytes | None = None
    error: bytes | None = None
    attempts: int = 0
    started_at: float = 0.0
    finished_at: float | None = None
    wake_at: float | None = None
    # undo: the position of the step it compensates; a gather's branch: the gather's
    # position; a failed gather: the branch whose failure it raised
    ref: int | None = None
    detail: str | None = None  # child id, signal seq, "timeout", "running" (a timed attempt in flight)

    @property
    def final(self) -> bool:
        return self.status != EntryStatus.WAITING


@dataclass(frozen=True, slots=True)
class NewWorkflow:
    id: str
    name: str
    args: bytes  # encoded {"args": [...], "kwargs": {...}}
    codec: str = "json"
    parent_id: str | None = None
    parent_position: int | None = None
    timeout: float | None = None  # seconds from its start to its deadline (None: none)
    origin: str | None = None  # what it was forked from (``fork``)
    trace: str | None = None  # the W3C trace context it was started in (foundry.tracecontext.pack)


@dataclass(frozen=True, slots=True)
class WorkflowState:
    """What anyone (in any process) can see of a workflow."""

    id: str
    name: str
    status: WorkflowStatus
    codec: str
    args: bytes
    result: bytes | None
    error: bytes | None
    parent_id: str | None
    parent_position: int | None
    owner: str | None
    token: int
    lease_until: float
    wake_at: float
    cancel_requested: bool
    compensation: str  # "" none, "running", "done", "partial" (an undo failed for good)
    claims: int  # runs so far: 1 + recoveries/resumptions
    position: int  # next position the workflow will write
    current_step: str | None  # what the run is doing / waiting for (heartbeat, suspend)
    step_started_at: float | None
    wakeups: int
    created_at: float
    updated_at: float
    finished_at: float | None
    deadline: float | None = None  # when it times out (its ``timeout=``), journal clock
    published: bytes | None = None  # its published state (``publish``), JSON
    origin: str | None = None  # "<id> from position N": the run it was forked from


@dataclass(frozen=True, slots=True)
class Claim:
    """A workflow leased to one owner; ``token`` fences every write of this run."""

    id: str
    name: str
    token: int
    lease_until: float
    status: WorkflowStatus  # after the claim: running or compensating
    args: bytes
    codec: str
    parent_id: str | None
    parent_position: int | None
    cancel_requested: bool
    wakeups: int
    claims: int
    fresh: bool = False  # created by this very call: its journal is known to be empty
    # Its previous claim ended without an outcome (the worker died or hung holding it): it
    # may be what killed that worker, so a worker runs it alone (``mark_alone``).
    suspect: bool = False
    crashes: int = 0  # deaths of its worker while it ran alone (``MAX_CRASHES`` sets it aside)
    deadline: float | None = None  # when it times out (``WorkflowState.deadline``)
    trace: str | None = None  # as started; None when absent or not a valid trace context


@dataclass(frozen=True, slots=True)
class Started:
    state: WorkflowState
    created: bool  # False: the id named an existing workflow (returned unchanged)
    claim: Claim | None  # set when created with an owner


@dataclass(slots=True)
class Recorded:
    """What :meth:`JournalBackend.record` did (a value, made once per step: not frozen,
    like :class:`Entry`)."""

    entry: Entry  # the entry now stored at that position
    written: bool  # False: an earlier final entry won and is returned instead
    cancel_requested: bool


@dataclass(frozen=True, slots=True)
class Beat:
    alive: bool  # False: the token is stale, another run owns the workflow
    cancel_requested: bool


@dataclass(frozen=True, slots=True)
class SignalRecord:
    seq: int
    workflow_id: str
    name: str
    payload: bytes
    sent_at: float
    consumed_position: int | None


class Tx(Protocol):
    """The open transaction a transactional step runs in (the journal's own database).

    ``execute`` takes qmark placeholders (``?``) on every engine and returns the rows a
    statement produced (``[]`` for statements without rows). ``raw`` is the driver's
    connection (``sqlite3.Connection`` or ``psycopg.Connection``) for anything else;
    never commit or roll back on it: the journal commits once, with the step's record.
    """

    dialect: str  # "sqlite" or "postgres"
    raw: Any

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...


class Clock(Protocol):
    """Time as the journal and the runtime see it (injectable for tests)."""

    def time(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class ManualClock:
    """A clock that only moves when told: ``sleep`` jumps time forward at once
    (trio's autojump clock), ``advance`` moves it from the outside."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def time(self) -> float:
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


class Changes(Protocol):
    """Wake-ups after commits that may end a wait (see the module docstring)."""

    @property
    def cross_process(self) -> bool:
        """Whether other processes' commits wake a waiter here (else only this process's)."""
        ...

    def mark(self) -> int:
        """Take before looking at the journal; pass to :meth:`wait`."""
        ...

    def wait(self, mark: int, timeout: float) -> bool:
        """Sleep until a wake-up after ``mark`` (``True``) or ``timeout`` seconds (``False``)."""
        ...

    async def wait_async(self, mark: int, timeout: float) -> bool:
        """:meth:`wait` for a coroutine, holding no thread while it waits."""
        ...

    def notify(self) -> None:
        """Wake this process's waiters (to make them look at a flag, e.g. on stop)."""
        ...


class JournalBackend(Protocol):
    """A workflow journal on one database. See the module docstring for the contract."""

    dialect: ClassVar[str]
    clock: Clock

    @property
    def url(self) -> str:
        """The journal's URL with its secrets masked (``foundry.config.safe_url``): what
        messages, logs and tools show; the password itself stays with the driver."""
        ...

    @property
    def changes(self) -> Changes:
        """Wake-ups after commits that may end a wait (see the module docstring)."""
        ...

    def start(self, wf: NewWorkflow, *, owner: str | None = None, lease: float = 30.0) -> Started:
        """Create the workflow unless its id exists (idempotent). With ``owner``, a new
        workflow is created already claimed by it (``Started.claim``)."""
        ...

    def claim(
        self, owner: str, *, lease: float, limit: int = 1, names: Collection[str] | None = None
    ) -> list[Claim]:
        """Lease up to ``limit`` claimable workflows (pending, orphaned, or due to wake),
        earliest due first; ``names`` restricts to workflows this owner can run. Never
        blocks on a workflow another transaction is claiming."""
        ...

    def claim_one(self, workflow_id: str, owner: str, *, lease: float) -> Claim | None:
        """Lease this workflow if it is claimable now; ``None`` otherwise."""
        ...

    def heartbeat(
        self,
        workflow_id: str,
        token: int,
        *,
        lease: float,
        current_step: str | None = None,
        step_started_at: float | None = None,
    ) -> Beat:
        """Extend the lease to now + ``lease`` and publish what the run is doing.
        ``alive=False`` when the token is stale or the run already parked, handed back or
        finished the workflow (a late heartbeat never re-leases a released workflow)."""
        ...

    def load(self, workflow_id: str) -> tuple[WorkflowState, list[Entry]]:
        """The workflow and its entries ordered by position; ``NotFoundError`` if absent."""
        ...

    def record(self, workflow_id: str, token: int, entry: Entry) -> Recorded:
        """Write ``entry`` at its position unless a final entry is there (fenced)."""
        ...

    def record_transactional(
        self, workflow_id: str, token: int, position: int, work: Callable[[Tx], Entry]
    ) -> Recorded:
        """Run ``work`` inside one transaction with the entry it returns, commit once.

        When a final entry already exists at ``position`` the work is not run and that
        entry is returned (``written=False``). An exception from ``work`` rolls back
        everything it wrote and propagates unchanged."""
        ...

    def consume_signal(self, workflow_id: str, token: int, position: int, name: str) -> Recorded | None:
        """Take the oldest unconsumed signal ``name`` and resolve the entry at ``position``
        with its payload, atomically; ``None`` when the inbox has none."""
        ...

    def suspend(
        self, workflow_id: str, token: int, *, wake_at: float, seen_wakeups: int, current_step: str
    ) -> None:
        """Release the lease and park the workflow until ``wake_at`` (earlier if woken)."""
        ...

    def mark_alone(self, workflow_id: str, token: int) -> bool:
        """Record, durably and before it runs, that this run of a suspect runs alone in its
        worker: if its lease lapses now, the next claim charges it with the worker's death.
        ``False`` when the token is stale (then do not run it)."""
        ...

    def release(self, workflow_id: str, token: int, *, suspect: bool = False) -> bool:
        """Give the lease back so any worker may resume the workflow now (graceful stop).
        ``suspect=True``: a suspect handed back before it ran, which stays a suspect."""
        ...

    def set_compensating(self, workflow_id: str, token: int) -> None:
        """Mark the workflow as compensating (its undo steps are running)."""
        ...

    def publish(self, workflow_id: str, token: int, state: bytes) -> None:
        """Replace the workflow's published state (fenced); readers see it in ``get``."""
        ...

    def finish(
        self,
        workflow_id: str,
        token: int,
        status: WorkflowStatus,
        *,
        result: bytes | None = None,
        error: bytes | None = None,
        compensation: str = "",
    ) -> bool:
        """Write the single outcome. ``False`` only for ``SUCCEEDED`` when a cancellation
        was requested first (the run must compensate instead). Resolves the parent's
        ``child`` entry and wakes the parent in the same commit."""
        ...

    def signal(self, workflow_id: str, name: str, payload: bytes) -> int:
        """Append to the workflow's inbox and wake it; returns the signal's sequence
        number. ``NotFoundError`` for an unknown id, ``WorkflowFinishedError`` when the
        workflow already finished (nothing is written)."""
        ...

    def request_cancel(self, workflow_id: str) -> bool:
        """Flag the workflow and its unfinished descendants for cancellation and wake
        them; ``False`` when it already finished. ``NotFoundError`` for an unknown id."""
        ...

    def get(self, workflow_id: str) -> WorkflowState | None: ...

    def workflows(
        self,
        *,
        status: str | None = None,
        name: str | None = None,
        parent_id: str | None = None,
        limit: int = 100,
    ) -> list[WorkflowState]:
        """Workflows, newest first."""
        ...

    def signals(self, workflow_id: str) -> list[SignalRecord]:
        """The inbox of a workflow, consumed or not, in arrival order."""
        ...

    def fork(self, source_id: str, wf: NewWorkflow, *, upto: int) -> Started:
        """Create ``wf`` (pending, claimable at once) with a copy of the entries of
        ``source_id`` before position ``upto``, in one transaction; the source is left as
        it is. Idempotent on ``wf.id`` like ``start`` (an existing id: nothing copied,
        ``created=False``). ``NotFoundError`` when the source does not exist."""
        ...

    def purge(self, finished_before: float) -> int:
        """Delete workflows that finished before the given time, with their entries and
        signals; return how many."""
        ...

    def close(self) -> None: ...
