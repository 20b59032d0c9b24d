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
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from foundry.backends.journal import open_journal
from foundry.backends.journal.base import (
    Claim,
    Clock,
    JournalBackend,
    NewWorkflow,
    SystemClock,
    WorkflowStatus,
)
from foundry.deliver.workflow.context import Run, _Control, _Infra
from foundry.errors import (
    BackendUnavailableError,
    CancelledError,
    FoundryError,
    NotFoundError,
    OverloadError,
    SubmitError,
)
from foundry.handle import Handle, Outcome, Status
from foundry.observe import names
from foundry.observe.metrics import Gauge, Registry
from foundry.runtime import UnitSpec
from foundry.serialize import Codec, decode_error, get_codec

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
}


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
        self.stopping = False
        self.json = get_codec("json")
        self._own_journal = own_journal
        self._lock = threading.Lock()
        self._runs: dict[str, Run] = {}
        self._parked: dict[str, float] = {}
        self._slots: dict[str, _Slot] = {}
        self._intake = threading.BoundedSemaphore(max_pending)
        self._pool: ThreadPoolExecutor | None = None
        self._futures: set[Future[Any]] = set()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_close: Callable[[], None] | None = None
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

    def codec(self, name: str) -> Codec:
        return get_codec(name)

    def encode_args(self, unit: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        try:
            return self.json.encode({"args": list(args), "kwargs": kwargs}, unit=unit, what="arguments")
        except SubmitError as exc:
            raise SubmitError(
                f"workflow {unit!r}: its arguments are not JSON-compatible ({exc.__cause__ or exc}); "
                "nothing was started. Fix: pass plain data (ids, numbers, strings, lists, dicts) "
                "and let the steps open connections or files themselves"
            ) from exc

    def decode_args(self, claim: Claim) -> tuple[list[Any], dict[str, Any]]:
        data = self.codec(claim.codec).decode(claim.args) if claim.args else {}
        return list(data.get("args", [])), dict(data.get("kwargs", {}))

    def real_sleep(self, seconds: float) -> None:
        self._closed.wait(seconds)

    def ride_outage(self, call: Callable[[], T]) -> T:
        """``call()`` (a journal call), riding out a short outage such as a database
        restart: ``journal_retries`` tries (8), backing off from 50 ms to 2 s, about 5 s in
        all; then the last :class:`~foundry.errors.BackendUnavailableError` is raised."""
        delay, tries = 0.05, max(1, self.journal_retries)
        for attempt in range(tries):
            try:
                return call()
            except BackendUnavailableError:
                if attempt == tries - 1:
                    raise
                self.real_sleep(delay)
                delay = min(delay * 2, 2.0)
        raise AssertionError("unreachable")  # pragma: no cover

    def nap(self, mark: int, seconds: float) -> None:
        """Sleep ``seconds`` on the journal's clock; on real time, a journal change after
        ``mark`` (``journal.changes.mark()``, taken before the look) ends it early."""
        if isinstance(self.clock, SystemClock):
            self.journal.changes.wait(mark, seconds)
        else:
            self.clock.sleep(seconds)

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
    ) -> Any:
        started = self.journal.start(
            NewWorkflow(
                workflow_id,
                spec.name,
                payload,
                parent_id=parent[0] if parent else None,
                parent_position=parent[1] if parent else None,
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
            outcome = run.execute()
        except _Infra as exc:
            log.warning("workflow %s (%s): journal unavailable, run abandoned: %s", claim.name, claim.id, exc)
            raise exc.error from None
        except _Control:
            outcome = None
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
        return outcome

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
        future.add_done_callback(self._futures.discard)
        return future

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
        payload = self.encode_args(spec.name, args, kwargs)
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
        payload = self.encode_args(spec.name, args, kwargs)
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

    def cancel(self, workflow_id: str) -> bool:
        accepted = self.journal.request_cancel(workflow_id)
        with self._lock:
            if accepted and workflow_id in self._parked:
                self._parked[workflow_id] = 0.0
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
            except Exception:  # the keeper must outlive any one failure
                log.exception("workflow keeper: tick failed")

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
        now = self.clock.time()
        with self._lock:
            due = [i for i, at in self._parked.items() if (full or at <= now) and i not in self._runs]
        for workflow_id in due[:100]:
            if self._closed.is_set() or self.stopping:
                return
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
        deadline = None if timeout is None else time.monotonic() + timeout
        interval = 0.002
        while True:
            if await asyncio.to_thread(self.wait, 0):
                return True
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            await asyncio.sleep(interval if remaining is None else min(interval, remaining))
            interval = min(interval * 2, 0.1)

    def outcome(self) -> Outcome:
        slot = self._slot
        if slot is not None and slot.outcome is not None:
            return slot.outcome
        state = self._rt.ride_outage(self._state)  # a restart between wait() and this read
        if state.status == WorkflowStatus.SUCCEEDED:
            data = state.result
            return Outcome(value=None if data is None else self._rt.codec(state.codec).decode(data))
        error = decode_error(self._rt.json.decode(state.error)) if state.error else None
        if state.status == WorkflowStatus.CANCELLED and not isinstance(error, CancelledError):
            error = CancelledError(f"workflow {state.name!r} ({self.id}) was cancelled")
        if error is None:
            error = FoundryError(f"workflow {state.name!r} ({self.id}) ended {state.status.value}")
        if state.compensation:
            error.add_note(f"compensation: {state.compensation} (see `foundry workflows show {self.id}`)")
        return Outcome(error=error)

    def cancel(self) -> bool:
        return self._rt.cancel(self.id)
