"""The workflow runtime of one process: a journal, the runs it executes, their leases.

It starts workflows (claimed by this process from the first write), runs them on a
bounded thread pool or in the caller's thread, heartbeats the lease of every run in
flight, and resumes the workflows it parked (sleeps, signal waits, children, retry
back-offs) when they are due. Orphans of *other* processes are recovered by a
:class:`~foundry.deliver.workflow.worker.Worker`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from foundry.backends.journal import open_journal
from foundry.backends.journal.base import (
    Claim,
    Clock,
    JournalBackend,
    NewWorkflow,
    Started,
    SystemClock,
    WorkflowStatus,
)
from foundry.config import DEFAULT_WATCHDOG
from foundry.deliver.workflow._plan import _Control, _Infra, new_step_threads
from foundry.deliver.workflow.reset import fork_run, published_state
from foundry.deliver.workflow.run import Run
from foundry.errors import (
    BackendError,
    BackendUnavailableError,
    CancelledError,
    FoundryError,
    MalformedRecordError,
    NotFoundError,
    OverloadError,
    RecordError,
    SubmitError,
    WorkflowTimeoutError,
)
from foundry.handle import Handle, Outcome, Status
from foundry.observe import names
from foundry.observe.metrics import Gauge, Registry
from foundry.observe.tracing import OFF, Tracing, decision_attributes
from foundry.outage import ride_outage
from foundry.payload import DEFAULT_MAX_PAYLOAD, too_large
from foundry.runtime import UnitSpec
from foundry.serialize import (
    DEFAULT_ERROR_TYPES,
    ErrorTypes,
    declared_codec,
    decode_call,
    decode_error,
    encode_error,
    get_codec,
)
from foundry.typed import payloads_for

if TYPE_CHECKING:
    from foundry.observe._otel import Tracer

__all__ = ["WorkflowRuntime", "WorkflowSource", "journal_from"]

log = logging.getLogger("foundry.workflow")

T = TypeVar("T")

# How often a caller waiting for a result looks at the journal when the journal wakes it
# on every finish, even one in another process (only a lost wake-up waits that long).
_SAFETY_POLL = 1.0

_STATUS = {
    WorkflowStatus.PENDING: Status.QUEUED,
    WorkflowStatus.RUNNING: Status.RUNNING,
    WorkflowStatus.WAITING: Status.RUNNING,
    WorkflowStatus.COMPENSATING: Status.RUNNING,
    WorkflowStatus.SUCCEEDED: Status.SUCCEEDED,
    WorkflowStatus.FAILED: Status.FAILED,
    WorkflowStatus.CANCELLED: Status.CANCELLED,
    WorkflowStatus.TIMED_OUT: Status.FAILED,  # its result() raises WorkflowTimeoutError
}


def _describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, even one whose ``str()`` fails."""
    try:
        text = str(exc)
    except Exception:
        text = "<its str() failed>"
    return f"{type(exc).__name__}: {text[:500]}"


def journal_from(
    journal: str | JournalBackend | None, default_url: str, clock: Clock | None
) -> tuple[JournalBackend, bool]:
    """An open backend from a URL (opened here: owned) or an open backend (borrowed)."""
    if journal is None or isinstance(journal, str):
        return open_journal(journal or default_url, clock=clock), True
    return journal, False


class _Slot:
    """The in-process outcome of a run started here (keeps the original exception)."""

    __slots__ = ("event", "outcome")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.outcome: Outcome | None = None


class WorkflowRuntime:
    """Runs workflows against one journal. Thread-safe; one per app per process."""

    def __init__(
        self,
        journal: JournalBackend,
        lookup: Callable[[str], UnitSpec],
        *,
        metrics: Registry | None = None,
        names_: Collection[str] | None = None,
        owner: str | None = None,
        lease: float = 30.0,
        inline_wait: float = 1.0,
        poll: float = 0.5,
        concurrency: int = 32,
        max_pending: int = 10_000,
        journal_retries: int = 8,
        own_journal: bool = True,
        errors: ErrorTypes | None = None,
        watchdog: float | None = DEFAULT_WATCHDOG,
        tracing: Tracing = OFF,
    ) -> None:
        if lease <= 0 or poll <= 0 or concurrency < 1 or max_pending < 1:
            raise SubmitError(
                f"workflow runtime: lease={lease}, poll={poll}, concurrency={concurrency} and "
                f"max_pending={max_pending} must all be positive. Fix: e.g. lease=30, poll=0.5"
            )
        self.journal = journal
        self.clock = journal.clock
        self._lookup = lookup
        self.metrics = metrics if metrics is not None else Registry()
        self.names = names_
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.lease = lease
        self.inline_wait = inline_wait
        self.poll = poll
        self.poll_slice = min(0.05, poll)
        self.concurrency = concurrency
        self.journal_retries = journal_retries
        self.watchdog = watchdog  # threshold of the loop watchdog on async steps' loops (None: off)
        self.tracing = tracing  # the app's OpenTelemetry switch: spans per start, run and step
        self.stopping = False
        self.json = get_codec("json")
        self.errors = errors if errors is not None else DEFAULT_ERROR_TYPES  # the app's allow-list
        self._own_journal = own_journal
        self._lock = threading.Lock()
        self._runs: dict[str, Run] = {}
        self._parked: dict[str, float] = {}
        self._slots: dict[str, _Slot] = {}
        self._intake = threading.BoundedSemaphore(max_pending)
        self._pool: ThreadPoolExecutor | None = None
        self._step_threads: ThreadPoolExecutor | None = None
        self._futures: set[Future[Any]] = set()
        self._idle = threading.Condition(self._lock)  # notified as each run on the pool ends
        self._resuming = threading.Lock()  # one resume of parked workflows at a time
        self.solo = False  # a worker runs a suspect alone: resume nothing parked meanwhile
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_close: Callable[[], None] | None = None
        # Called when the keeper thread (heartbeats, wake-ups) meets an error it cannot
        # ride out; a Worker stops on it. Unset (in an app's own process): logged, and
        # the keeper goes on.
        self.on_failure: Callable[[BaseException], None] | None = None
        m = self.metrics
        self._m_steps = m.gauge(
            names.WORKFLOW_STEPS, "workflow step outcomes by state", ("workflow", "state")
        )
        self._m_comp = m.counter(names.WORKFLOW_COMPENSATIONS, "undo steps run", ("workflow",))
        self._m_done = m.counter(names.UNIT_COMPLETED, "units completed", ("unit", "model"))
        self._m_failed = m.counter(names.UNIT_FAILED, "units failed", ("unit", "model"))
        self._m_flight = m.gauge(names.UNIT_IN_FLIGHT, "units in flight", ("unit", "model"))
        self._step_gauges: dict[tuple[str, str], Gauge] = {}

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    # -- helpers the runs use ----------------------------------------------------

    def spec(self, name: str) -> UnitSpec:
        try:
            return self._lookup(name)
        except (NotFoundError, KeyError) as exc:
            raise NotFoundError(
                f"no workflow named {name!r} is declared in this process. Fix: import the module that "
                "declares it (@app.workflow) before starting the worker"
            ) from exc

    def error_types(self, name: str) -> ErrorTypes:
        """The allow-list of workflow or unit ``name`` (the app's when it is not declared
        here): which exception types its error records are rebuilt as."""
        try:
            return self._lookup(name).errors
        except (NotFoundError, KeyError, AttributeError):
            return self.errors

    def encode_args(self, spec: UnitSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        unit = spec.name
        args_data, kwargs_data = payloads_for(unit, spec.fn, skip_first=True).dump_call(args, kwargs)
        try:
            data = self.json.encode({"args": args_data, "kwargs": kwargs_data}, unit=unit, what="arguments")
        except SubmitError as exc:
            raise SubmitError(
                f"workflow {unit!r}: its arguments are not JSON-compatible ({exc.__cause__ or exc}); "
                "nothing was started. Fix: pass plain data (ids, numbers, strings, lists, dicts) "
                "and let the steps open connections or files themselves"
            ) from exc
        limit = spec.traits.max_payload or DEFAULT_MAX_PAYLOAD
        if len(data) > limit:
            raise too_large(
                f"workflow {unit!r}", "its arguments", len(data), limit, stored="nothing was started"
            )
        return data

    def decode_args(self, claim: Claim, spec: UnitSpec) -> tuple[list[Any], dict[str, Any]]:
        """The run's arguments, decoded with the workflow's declared codec (JSON); a record
        that names another codec, or is not ``{"args": [...], "kwargs": {...}}``, is a
        :class:`~foundry.errors.RecordError` (the run then fails with it)."""
        what = f"the arguments of workflow run {claim.id}"
        if not claim.args:
            declared_codec(spec.traits.codec, claim.codec, unit=claim.name, what=what)
            return [], {}
        types = payloads_for(spec.name, spec.fn, skip_first=True)
        return decode_call(
            claim.args, claim.codec, spec.traits.codec, unit=claim.name, what=what, types=types
        )

    def real_sleep(self, seconds: float) -> None:
        self._closed.wait(seconds)

    def ride_outage(self, call: Callable[[], T]) -> T:
        """``call()`` (a journal call), riding out a short outage such as a database
        restart: ``journal_retries`` tries (8), backing off from 50 ms to 2 s, about 5 s in
        all; then the last :class:`~foundry.errors.BackendUnavailableError` is raised."""
        return ride_outage(call, tries=max(1, self.journal_retries), sleep=self.real_sleep)

    def nap(self, mark: int | None, seconds: float) -> None:
        """Sleep ``seconds`` on the journal's clock; on real time, a journal change after
        ``mark`` (``journal.changes.mark()``, taken before the look) ends it early."""
        if isinstance(self.clock, SystemClock) and mark is not None:
            self.journal.changes.wait(mark, seconds)
        else:
            self.clock.sleep(seconds)

    async def anap(self, mark: int | None, seconds: float) -> None:
        """:meth:`nap` on the running loop (no thread is held while it waits)."""
        if isinstance(self.clock, SystemClock):
            if mark is None:
                await asyncio.sleep(max(0.0, seconds))
            else:
                await self.journal.changes.wait_async(mark, seconds)
        else:
            self.clock.sleep(seconds)
            await asyncio.sleep(0)  # let the other branches run

    def step_threads(self) -> ThreadPoolExecutor:
        """The threads synchronous steps run on when their workflow runs on a loop (an
        ``async def`` workflow, the branches of a fan-out); made on first use."""
        with self._lock:
            if self._step_threads is None:
                self._step_threads = new_step_threads(max(32, self.concurrency))
            return self._step_threads

    def count_step(self, workflow: str, state: str) -> None:
        child = self._step_gauges.get((workflow, state))
        if child is None:
            child = self._step_gauges[(workflow, state)] = self._m_steps.labels(workflow, state)
        child.inc()

    def count_compensation(self, workflow: str) -> None:
        self._m_comp.labels(workflow).inc()

    def count_outcome(self, workflow: str, status: WorkflowStatus) -> None:
        family = self._m_done if status == WorkflowStatus.SUCCEEDED else self._m_failed
        family.labels(workflow, "workflow").inc()

    def parked(self, workflow_id: str, wake_at: float) -> None:
        with self._lock:
            self._parked[workflow_id] = wake_at
        self._ensure_thread()

    def create(
        self,
        spec: UnitSpec,
        payload: bytes,
        workflow_id: str,
        *,
        parent: tuple[str, int] | None = None,
        owner: str | None,
    ) -> Started:
        tracer = self.tracing.tracer()
        if tracer is None:
            return self._create(spec, payload, workflow_id, parent, owner, None)
        attributes = {**decision_attributes(spec.name, spec.decision), "foundry.workflow.id": workflow_id}
        with tracer.send(f"start {spec.name}", attributes) as (_, trace):
            return self._create(spec, payload, workflow_id, parent, owner, trace)

    def _create(
        self,
        spec: UnitSpec,
        payload: bytes,
        workflow_id: str,
        parent: tuple[str, int] | None,
        owner: str | None,
        trace: str | None,
    ) -> Started:
        started = self.journal.start(
            NewWorkflow(
                workflow_id,
                spec.name,
                payload,
                parent_id=parent[0] if parent else None,
                parent_position=parent[1] if parent else None,
                timeout=spec.traits.timeout,
                trace=trace,
            ),
            owner=owner,
            lease=self.lease,
        )
        if not started.created and started.state.name != spec.name:
            raise SubmitError(
                f"workflow id {workflow_id!r} already names a {started.state.name!r} workflow, not "
                f"{spec.name!r}. Fix: use another id (an id is the idempotency key of one workflow)"
            )
        return started

    def start_child(self, spec: UnitSpec, payload: bytes, child_id: str, *, parent: tuple[str, int]) -> None:
        """Create a child workflow as a run of its own, claimed by this process and run
        on its pool at once (a worker may take it over if this process dies)."""
        started = self.create(spec, payload, child_id, parent=parent, owner=self.owner)
        if started.claim is not None:
            self.submit(started.claim)
        elif not started.state.status.finished:
            self.adopt(child_id)

    def adopt(self, workflow_id: str) -> None:
        """Run ``workflow_id`` here if it is claimable now (a child whose run ended)."""
        if self.stopping or self._closed.is_set():
            return
        claim = self.journal.claim_one(workflow_id, self.owner, lease=self.lease)
        if claim is not None:
            self.submit(claim)

    def _wake_parent(self, parent_id: str) -> None:
        """A child finished here: resume its parent now if this process parked it."""
        with self._lock:
            if parent_id not in self._parked or parent_id in self._runs:
                return
            self._parked[parent_id] = 0.0
        try:
            self.adopt(parent_id)
        except FoundryError as exc:  # the keeper resumes it at its next tick
            log.debug("workflow %s: could not resume it at once (%s)", parent_id, exc)

    # -- running -------------------------------------------------------------------

    def execute(self, claim: Claim) -> Outcome | None:
        """Run a claimed workflow in this thread until it finishes (its outcome) or is
        parked, handed back or taken over (``None``)."""
        try:
            spec = self.spec(claim.name)
        except NotFoundError:
            self.journal.release(claim.id, claim.token)
            raise
        run = Run(self, claim, spec)
        with self._lock:
            self._runs[claim.id] = run
        self._ensure_thread()
        flight = self._m_flight.labels(claim.name, "workflow")
        flight.inc()
        outcome: Outcome | None = None
        try:
            outcome = run.execute() if run.tracer is None else self._traced(run.tracer, run)
        except _Infra as exc:
            log.warning("workflow %s (%s): journal unavailable, run abandoned: %s", claim.name, claim.id, exc)
            raise exc.error from None
        except _Control:
            outcome = None
        except Exception as exc:  # a bug, or something only this run meets: charged to it alone
            outcome = self._charge(run, exc)
        finally:
            with run.beat_lock:
                run.ended = True
            flight.dec()
            with self._lock:
                self._runs.pop(claim.id, None)
                if outcome is not None:
                    self._parked.pop(claim.id, None)
                    slot = self._slots.pop(claim.id, None)
                else:
                    slot = None
            if slot is not None:
                slot.outcome = outcome
                slot.event.set()
        if outcome is not None and claim.parent_id is not None:
            self._wake_parent(claim.parent_id)
        return outcome

    @staticmethod
    def _traced(tracer: Tracer, run: Run) -> Outcome | None:
        """``run.execute()`` in a *run* span, child of the context the workflow was started
        in (every run of it: the first, and each resumption after a sleep or a crash)."""
        claim = run.claim
        attributes = {
            **decision_attributes(claim.name, run.spec.decision),
            "foundry.workflow.id": claim.id,
            "foundry.workflow.run": claim.claims,
        }
        with tracer.process(f"run {claim.name}", claim.trace, attributes) as span:
            outcome = run.execute()
            if outcome is not None and outcome.error is not None:
                tracer.failed(span, outcome.error)
            return outcome

    def _charge(self, run: Run, exc: Exception) -> Outcome | None:
        """End ``run`` failed because the runtime itself raised ``exc`` while running it,
        rather than abandon it: abandoned, its lease would lapse and the next worker would
        meet the same error, for ever, with the workflow ``running`` all along."""
        claim = run.claim
        log.error(
            "workflow %s (%s): the runtime failed on this run; it is set aside (failed)",
            claim.name,
            claim.id,
            exc_info=exc,
        )
        error = FoundryError(
            f"workflow {claim.name!r} ({claim.id}): the runtime failed while running it "
            f"({_describe(exc)}), so the run was set aside (failed) instead of failing every worker "
            "that claims it. Fix: a bug in Foundry or in what the workflow hands it (an exception "
            "whose str() fails, …); see the worker's log for the traceback, then start it again"
        )
        error.__cause__ = exc
        try:
            record = self.json.encode(encode_error(error))
        except Exception:  # the record of the error must not be what fails
            record = self.json.encode({"type": "foundry.errors.FoundryError", "message": str(error)})
        return run.set_aside(error, record)

    def _run_in_pool(self, claim: Claim, permit: bool) -> None:
        try:
            self.execute(claim)
        except FoundryError as exc:
            log.warning("workflow %s (%s) stopped: %s", claim.name, claim.id, exc)
        except Exception:
            log.exception("workflow %s (%s): unexpected error in the runtime", claim.name, claim.id)
        finally:
            if permit:
                self._intake.release()

    def submit(self, claim: Claim, *, permit: bool = False) -> Future[Any]:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="foundry-workflow")
            future = self._pool.submit(self._run_in_pool, claim, permit)
            self._futures.add(future)
        future.add_done_callback(self._ended)
        return future

    def _ended(self, future: Future[Any]) -> None:
        with self._lock:
            self._futures.discard(future)
            self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no run is on the pool (``False``: some still were after ``timeout``)."""
        with self._lock:
            return self._idle.wait_for(lambda: not self._futures, timeout)

    def active(self) -> int:
        with self._lock:
            return len(self._futures)

    def _slot(self, workflow_id: str) -> _Slot:
        with self._lock:
            return self._slots.setdefault(workflow_id, _Slot())

    def new_id(self, name: str) -> str:
        return f"{name}-{uuid.uuid4().hex[:16]}"

    def start(
        self,
        spec: UnitSpec,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        id: str | None = None,
        local: bool = True,
    ) -> Handle:
        """Create the workflow (idempotent on ``id``); with ``local`` run it here, in the
        background, else leave it to workers. Returns its handle at once."""
        payload = self.encode_args(spec, args, kwargs)
        workflow_id = id or self.new_id(spec.name)
        if not local:
            self.create(spec, payload, workflow_id, owner=None)
            return self.handle(workflow_id, spec.name)
        if not self._intake.acquire(timeout=30.0):
            raise OverloadError(
                f"workflow {spec.name!r}: the local intake stayed full for 30s; nothing was started. "
                "Fix: run workers (`foundry workflows worker`) and use enqueue(), or raise max_pending"
            )
        try:
            started = self.create(spec, payload, workflow_id, owner=self.owner)
            claim = started.claim
            if claim is None and not started.state.status.finished:
                claim = self.journal.claim_one(workflow_id, self.owner, lease=self.lease)
            if claim is not None:
                self._slot(workflow_id)
                self.submit(claim, permit=True)
            else:
                self._intake.release()
        except BaseException:
            self._intake.release()
            raise
        return self.handle(workflow_id, spec.name)

    def run(
        self,
        spec: UnitSpec,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        id: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Start the workflow and run it in this thread; return its result or raise."""
        payload = self.encode_args(spec, args, kwargs)
        workflow_id = id or self.new_id(spec.name)
        started = self.create(spec, payload, workflow_id, owner=self.owner)
        claim = started.claim
        if claim is None and not started.state.status.finished:
            claim = self.journal.claim_one(workflow_id, self.owner, lease=self.lease)
        if claim is not None:
            outcome = self.execute(claim)
            if outcome is not None:
                return Handle._unwrap(outcome)
        return self.handle(workflow_id, spec.name).result(timeout)

    def handle(self, workflow_id: str, name: str | None = None) -> Handle:
        if name is None:
            state = self.journal.get(workflow_id)
            if state is None:
                raise NotFoundError(
                    f"no workflow with id {workflow_id!r} in journal {self.journal.url}. "
                    "Fix: check the id with `foundry workflows list`"
                )
            name = state.name
        with self._lock:
            slot = self._slots.get(workflow_id)
        return Handle(workflow_id, name, WorkflowSource(self, workflow_id, slot))

    def signal(self, workflow_id: str, name: str, payload: Any = None) -> int:
        data = self.json.encode(payload, unit=workflow_id, what=f"the payload of signal {name!r}")
        seq = self.journal.signal(workflow_id, name, data)
        with self._lock:
            if workflow_id in self._parked:
                self._parked[workflow_id] = 0.0  # resume it at the next tick
        return seq

    def query(self, workflow_id: str) -> dict[str, Any]:
        """The state the workflow published (``wf.publish``), read from the journal: it
        does not touch the run, wherever it runs or waits; ``{}`` when it published none."""
        state = self.journal.get(workflow_id)
        if state is None:
            raise NotFoundError(
                f"no workflow with id {workflow_id!r} in journal {self.journal.url}. "
                "Fix: check the id with `foundry workflows list`"
            )
        return published_state(state)

    def reset(
        self,
        workflow_id: str,
        *,
        step: str | None = None,
        position: int | None = None,
        new_id: str | None = None,
        local: bool = True,
    ) -> Handle:
        """Run a finished workflow again from a completed step (by ``step`` name or
        ``position``) as a new workflow (``new_id``) that keeps the entries before it;
        with ``local`` it runs here, else on the workers. The old run stays as it was."""
        state = self.journal.get(workflow_id)
        timeout = None
        if state is not None:
            try:
                timeout = self.spec(state.name).traits.timeout
            except NotFoundError:
                timeout = None
        started = fork_run(
            self.journal, workflow_id, step=step, position=position, new_id=new_id, timeout=timeout
        )
        if local and started.created:
            claim = self.journal.claim_one(started.state.id, self.owner, lease=self.lease)
            if claim is not None:
                self._slot(claim.id)
                self.submit(claim)
        return self.handle(started.state.id, started.state.name)

    def cancel(self, workflow_id: str) -> bool:
        accepted = self.journal.request_cancel(workflow_id)
        with self._lock:
            if accepted and workflow_id in self._parked:
                self._parked[workflow_id] = 0.0
            run = self._runs.get(workflow_id)
        if accepted and run is not None:  # running here: it need not wait for a heartbeat
            run.cancel_requested = True
        return accepted

    # -- background: heartbeats and wake-ups ---------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is not None or self._closed.is_set():
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._background, name="foundry-workflow-keeper", daemon=True
                )
                self._thread.start()

    def _background(self) -> None:
        beat_every = self.lease / 3.0
        tick = min(self.poll, beat_every)
        next_beat = time.monotonic() + beat_every  # a fresh claim holds a whole lease
        ticks = 0
        while not self._closed.wait(tick):
            ticks += 1
            try:
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + beat_every
                    self._beat()
                self._resume(full=ticks % 10 == 0)
            except BackendError as exc:  # an outage: the next tick tries again
                log.warning("workflow keeper: tick failed (%s); trying again", exc)
            except Exception as exc:
                if self.on_failure is None:  # in an app's own process: keep beating
                    log.exception("workflow keeper: tick failed")
                    continue
                self.on_failure(exc)  # a worker stops rather than live on without heartbeats
                return

    def _beat(self) -> None:
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            with run.beat_lock:  # a run that ended (even by a crash) is never re-leased
                if run.ended:
                    continue
                try:
                    beat = self.journal.heartbeat(
                        run.claim.id,
                        run.token,
                        lease=self.lease,
                        current_step=run.current[0],
                        step_started_at=run.current[1],
                    )
                except FoundryError as exc:
                    log.warning("workflow %s: heartbeat failed: %s", run.claim.id, exc)
                    continue
            if not beat.alive:
                run.lost = True
            if beat.cancel_requested:
                run.cancel_requested = True

    def _resume(self, *, full: bool) -> None:
        with self._resuming:  # settle() waits for a resume in progress (claimed, not yet submitted)
            self._resume_due(full=full)

    def _resume_due(self, *, full: bool) -> None:
        now = self.clock.time()
        with self._lock:
            due = [i for i, at in self._parked.items() if (full or at <= now) and i not in self._runs]
        for workflow_id in due[:100]:
            if self._closed.is_set() or self.stopping or self.solo:
                return
            try:
                claim = self.journal.claim_one(workflow_id, self.owner, lease=self.lease)
                if claim is not None:
                    with self._lock:
                        self._parked.pop(workflow_id, None)
                    self.submit(claim)
                elif full:
                    state = self.journal.get(workflow_id)
                    if state is None or state.status.finished or (state.owner not in (None, self.owner)):
                        with self._lock:
                            self._parked.pop(workflow_id, None)
            except MalformedRecordError as exc:  # its row, not the journal: forget it, go on
                log.warning("workflow %s: %s; no longer watched here", workflow_id, exc)
                with self._lock:
                    self._parked.pop(workflow_id, None)

    # -- tests on a manual clock (foundry.testing) ------------------------------------

    def next_wake(self) -> float | None:
        """When the first workflow parked here is due on the journal's clock (``None``:
        none is parked, or only on signals without a timeout)."""
        with self._lock:
            wake = min(self._parked.values(), default=math.inf)
        return None if math.isinf(wake) else wake

    def settle(self, timeout: float = 30.0) -> bool:
        """Resume every workflow parked here that is due on the journal's clock, and wait
        until no run is in flight and none is due (``False``: still busy after
        ``timeout``). What a test on a manual clock calls after moving it."""
        deadline = time.monotonic() + timeout
        while True:
            self._resume(full=False)
            if self.wait_idle(max(0.0, deadline - time.monotonic())):
                now = self.clock.time()
                with self._lock:
                    due = any(at <= now and i not in self._runs for i, at in self._parked.items())
                if not due:
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)  # a due workflow not claimable yet (its lease is being given back)

    # -- closing ---------------------------------------------------------------------

    def close(self, timeout: float = 10.0) -> None:
        """Stop: runs in flight hand their workflow back at their next durable call (or
        their lease lapses), then the journal is closed. Parked workflows stay parked."""
        if self._closed.is_set():
            return
        self.stopping = True
        deadline = time.monotonic() + timeout
        with self._lock:
            futures = list(self._futures)
            pool = self._pool
        for future in futures:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                future.result(remaining)
            except Exception:
                pass
        self._closed.set()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if self._step_threads is not None:
            self._step_threads.shutdown(wait=False, cancel_futures=True)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.1, deadline - time.monotonic()))
        if self._own_journal:
            self.journal.close()
        if self.on_close is not None:
            self.on_close()


class WorkflowSource:
    """A :class:`~foundry.handle.Source` over the journal (any process can hold one)."""

    __slots__ = ("_rt", "_slot", "id")

    def __init__(self, rt: WorkflowRuntime, workflow_id: str, slot: _Slot | None) -> None:
        self._rt = rt
        self.id = workflow_id
        self._slot = slot

    def _state(self) -> Any:
        state = self._rt.journal.get(self.id)
        if state is None:
            raise NotFoundError(
                f"workflow {self.id!r} is no longer in journal {self._rt.journal.url} (purged?)"
            )
        return state

    def status(self) -> Status:
        return _STATUS[self._state().status]

    def wait(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        interval = 0.002
        changes = self._rt.journal.changes
        while True:
            slot = self._slot
            if slot is not None and slot.outcome is not None:
                return True
            mark = changes.mark() if slot is None and timeout != 0 else 0  # before the look
            outage = False
            try:
                if self._state().status.finished:
                    return True
            except BackendUnavailableError:  # a journal restart: keep waiting within the timeout
                interval = max(interval, 0.05)
                outage = True
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            if slot is not None:  # woken at once by a run in this process; the journal meanwhile
                if slot.event.wait(0.25 if remaining is None else min(0.25, remaining)):
                    return True
            else:  # woken by the finish's commit, in any process when the journal can tell
                step = _SAFETY_POLL if changes.cross_process and not outage else interval
                changes.wait(mark, step if remaining is None else min(step, remaining))
                interval = min(interval * 2, 0.1)

    async def wait_async(self, timeout: float | None) -> bool:
        """:meth:`wait` for ``await handle``: woken by the journal's notifications (the
        finish's commit, in any process when the journal can tell), holding no thread
        while it waits; the journal is read on a thread so the loop never blocks on it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        interval = 0.002
        changes = self._rt.journal.changes
        while True:
            slot = self._slot
            if slot is not None and slot.outcome is not None:
                return True
            mark = changes.mark()  # before the look: a finish after it ends the wait below
            outage = False
            try:
                if (await asyncio.to_thread(self._state)).status.finished:
                    return True
            except BackendUnavailableError:
                outage = True
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            # A run in this process rings on its finish; another process's reaches us when
            # the journal tells across processes, else the look backs off to 100 ms.
            local = slot is not None
            step = _SAFETY_POLL if (changes.cross_process or local) and not outage else interval
            await changes.wait_async(mark, step if remaining is None else min(step, remaining))
            interval = min(interval * 2, 0.1)

    def outcome(self) -> Outcome:
        slot = self._slot
        if slot is not None and slot.outcome is not None:
            return slot.outcome
        state = self._rt.ride_outage(self._state)  # a restart between wait() and this read
        if state.status == WorkflowStatus.SUCCEEDED:
            return self._value(state)
        error = None
        if state.error:
            try:
                record: Any = self._rt.json.decode(state.error)
            except (ValueError, RecursionError):
                record = {"type": "RemoteError", "message": bytes(state.error).decode(errors="replace")}
            error = decode_error(record, self._rt.error_types(state.name))
        if state.status == WorkflowStatus.CANCELLED and not isinstance(error, CancelledError):
            error = CancelledError(f"workflow {state.name!r} ({self.id}) was cancelled")
        if state.status == WorkflowStatus.TIMED_OUT and not isinstance(error, WorkflowTimeoutError):
            error = WorkflowTimeoutError(f"workflow {state.name!r} ({self.id}) ran past its timeout")
        if error is None:
            error = FoundryError(f"workflow {state.name!r} ({self.id}) ended {state.status.value}")
        if state.compensation:
            error.add_note(f"compensation: {state.compensation} (see `foundry workflows show {self.id}`)")
        return Outcome(error=error)

    def _value(self, state: Any) -> Outcome:
        """The result of a finished run, decoded with the declared codec (JSON) only."""
        if state.result is None:
            return Outcome(value=None)
        what = f"the result of workflow run {self.id}"
        try:
            codec = declared_codec("json", state.codec, unit=state.name, what=what)
            value = codec.decode(state.result)
            try:
                spec = self._rt.spec(state.name)
            except NotFoundError:  # not declared here: the JSON data as stored
                return Outcome(value=value)
            return Outcome(value=payloads_for(spec.name, spec.fn).load_result(value, what=what))
        except RecordError as exc:
            return Outcome(error=exc)
        except Exception as exc:
            return Outcome(
                error=RecordError(
                    f"workflow {state.name!r}: {what} is not valid JSON ({type(exc).__name__}: "
                    f"{str(exc)[:200]}); it was written by another program or damaged in the store. "
                    f"Fix: inspect it with `foundry workflows show {self.id}`"
                )
            )

    def cancel(self) -> bool:
        return self._rt.cancel(self.id)
