"""One run of a workflow: the ``wf`` its function receives, replay against the journal,
retries, durable waits, child workflows and compensation.

A run re-executes the workflow function from the top. The n-th durable call
(``wf.step``, ``wf.sleep``, ``wf.wait_for``, ``wf.child``) is *position* n: when the
journal already has a final entry there, the call returns (or raises) what was
recorded without running anything; otherwise it runs and records. A recorded entry
whose kind or name differs from the call the code makes now is a
:class:`~foundry.errors.NonDeterminismError` naming both and the position.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from foundry.backends.journal.base import Claim, Entry, EntryKind, EntryStatus, WorkflowStatus
from foundry.errors import (
    BackendError,
    CancelledError,
    LeaseLostError,
    NonDeterminismError,
    ResultTimeoutError,
    SubmitError,
    WorkTimeoutError,
)
from foundry.handle import Outcome
from foundry.runtime import UnitSpec
from foundry.serialize import decode_error, encode_error
from foundry.traits import parse_duration

if TYPE_CHECKING:
    from foundry.deliver.workflow.runtime import WorkflowRuntime

__all__ = ["WorkflowContext"]

_MISSING: Any = object()
FOREVER = math.inf


# -- control flow: BaseExceptions, so `except Exception` in workflow code cannot eat them --


class _Control(BaseException):
    """Ends this run without recording an outcome; the journal says how to go on."""


class _Suspend(_Control):
    def __init__(self, wake_at: float, what: str) -> None:
        super().__init__(what)
        self.wake_at = wake_at
        self.what = what


class _Release(_Control):
    """The worker is stopping: give the lease back so another worker resumes at once."""


class _Lost(_Control):
    """Another run owns the workflow now (our lease lapsed); stop without writing."""


class _Infra(_Control):
    """The journal failed past our retries; stop, the lease will lapse and a run resumes."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(slots=True)
class _Completed:
    """A completed step with an undo, remembered for compensation."""

    position: int
    name: str
    undo: Callable[..., Any]
    result: Any
    transactional: bool
    retries: int
    backoff: Any


@dataclass(frozen=True, slots=True)
class StepCall:
    """One ``wf.step(...)`` call: the code, its arguments and its options."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    name: str
    retries: int = 0
    backoff: Any = 1.0
    max_backoff: float = 300.0
    timeout: float | None = None
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    undo: Callable[..., Any] | None = None
    undo_retries: int = 3
    transactional: bool = False


def _name_of(fn: Any) -> str:
    target = getattr(fn, "func", fn)  # functools.partial
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    return str(name or type(target).__name__)


def backoff_delay(backoff: Any, attempt: int, cap: float) -> float:
    """Seconds before retry number ``attempt`` (1-based): exponential from ``backoff``."""
    if callable(backoff):
        return max(0.0, float(backoff(attempt)))
    base = parse_duration(backoff, field_name="backoff") if isinstance(backoff, str) else float(backoff)
    return float(min(cap, base * (2 ** (attempt - 1))))


def _call(fn: Callable[..., Any], args: tuple[Any, ...], timeout: float | None, what: str) -> Any:
    """Run a step's code; ``timeout`` bounds it in real time."""
    code = getattr(fn, "__code__", None)
    is_async = (
        bool(code.co_flags & inspect.CO_COROUTINE) if code is not None else inspect.iscoroutinefunction(fn)
    )
    if is_async:
        if timeout is None:
            return asyncio.run(fn(*args))
        try:
            return asyncio.run(asyncio.wait_for(fn(*args), timeout))
        except TimeoutError as exc:
            raise WorkTimeoutError(f"{what} exceeded timeout={timeout}s and was cancelled") from exc
    if timeout is None:
        return fn(*args)
    box: list[Any] = []
    done = threading.Event()

    def target() -> None:
        try:
            box.append((True, fn(*args)))
        except BaseException as exc:
            box.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=target, name=f"foundry-step-{what}", daemon=True).start()
    if not done.wait(timeout):
        raise WorkTimeoutError(
            f"{what} exceeded timeout={timeout}s; the attempt counts as failed. Its thread cannot be "
            "stopped and was abandoned. Fix: raise timeout=, or make the step async (it is then cancelled)"
        )
    ok, value = box[0]
    if ok:
        return value
    raise value


class WorkflowContext:
    """The ``wf`` argument of a workflow function: its only door to the outside world.

    Everything that must happen once, or that is not deterministic (I/O, time, random
    numbers), goes through a durable call; the rest of the function must be
    deterministic, because a resumed run re-executes it against the journal.
    """

    def __init__(self, run: Run) -> None:
        self._run = run

    @property
    def id(self) -> str:
        """The workflow id (its idempotency key)."""
        return self._run.claim.id

    @property
    def name(self) -> str:
        return self._run.claim.name

    @property
    def parent_id(self) -> str | None:
        return self._run.claim.parent_id

    @property
    def run_number(self) -> int:
        """1 for the first run, +1 for each resumption (recovery, wake-up)."""
        return self._run.claim.claims

    @property
    def is_replaying(self) -> bool:
        """True while the code is re-walking positions the journal already has."""
        return any(p >= self._run.pos for p in self._run.history)

    @property
    def cancel_requested(self) -> bool:
        return self._run.cancel_requested

    def step(
        self,
        fn: Callable[..., Any],
        *args: Any,
        name: str | None = None,
        retries: int = 0,
        backoff: float | str | Callable[[int], float] = 1.0,
        max_backoff: float = 300.0,
        timeout: float | str | None = None,
        retry_on: tuple[type[BaseException], ...] = (Exception,),
        undo: Callable[..., Any] | None = None,
        undo_retries: int = 3,
        transactional: bool = False,
    ) -> Any:
        """Run ``fn(*args)`` once for this workflow and return its (journaled) result.

        ``retries`` more attempts follow a failure in ``retry_on``, ``backoff`` seconds
        apart, doubling up to ``max_backoff`` (a long back-off parks the workflow in the
        journal instead of holding a worker). ``timeout`` bounds one attempt. When a later
        step fails for good, ``undo(result)`` runs (reverse order, journaled, retried
        ``undo_retries`` times; bind more arguments with ``functools.partial``). With
        ``transactional=True`` the step is called ``fn(tx, *args)`` with a
        :class:`~foundry.backends.journal.base.Tx` on the journal's database and its
        writes commit in the same transaction as its record — exactly once; its undo is
        called ``undo(tx, result)`` the same way. Every
        other step is at-least-once: a crash after its code ran and before its record
        committed runs it again.
        """
        seconds = None if timeout is None else parse_duration(timeout, unit=self.name, field_name="timeout")
        call = StepCall(
            fn,
            args,
            name or _name_of(fn),
            retries,
            backoff,
            max_backoff,
            seconds,
            retry_on,
            undo,
            undo_retries,
            transactional,
        )
        return self._run.step(call)

    def sleep(self, duration: float | str) -> None:
        """Durable sleep: the wake-up time is journaled; a long sleep frees the worker."""
        self._run.sleep(parse_duration(duration, unit=self.name, field_name="sleep"))

    def wait_for(self, signal: str, timeout: float | str | None = None, default: Any = _MISSING) -> Any:
        """Wait for the next signal ``signal`` (``app.signal(id, signal, payload)``) and
        return its payload. Signals sent earlier wait in the durable inbox. On timeout,
        return ``default`` or raise :class:`~foundry.errors.ResultTimeoutError`."""
        seconds = None if timeout is None else parse_duration(timeout, unit=self.name, field_name="timeout")
        return self._run.wait_for(signal, seconds, default)

    def child(self, workflow: Any, *args: Any, id: str | None = None, **kwargs: Any) -> Any:
        """Run another declared workflow as a child and return its result (or raise its
        error). The child has its own journal and compensation; its id defaults to
        ``"<parent id>/<position>"`` so a resumed parent finds the same child."""
        name = workflow if isinstance(workflow, str) else str(workflow.name)
        return self._run.child(name, args, kwargs, id)

    def now(self) -> float:
        """The current time, journaled (the same value on every replay)."""
        return float(self.step(self._run.rt.clock.time, name="wf.now"))

    def uuid(self) -> str:
        """A random id, journaled (the same value on every replay)."""
        return str(self.step(lambda: uuid.uuid4().hex, name="wf.uuid"))

    def __repr__(self) -> str:
        return f"<wf {self.name} {self.id} position={self._run.pos}>"


class Run:
    """The state of one run (one claim) of one workflow."""

    def __init__(self, rt: WorkflowRuntime, claim: Claim, spec: UnitSpec) -> None:
        self.rt = rt
        self.claim = claim
        self.spec = spec
        self.token = claim.token
        self.codec = rt.codec(claim.codec)
        self.history: dict[int, Entry] = {}
        self.pos = 0
        self.completed: list[_Completed] = []
        self.cancel_requested = claim.cancel_requested
        self.lost = False
        self.ended = False  # set (under beat_lock) when the run stops: no heartbeat after it
        self.beat_lock = threading.Lock()
        self.current: tuple[str | None, float | None] = (None, None)

    # -- plumbing ----------------------------------------------------------------

    def _where(self, pos: int) -> str:
        return f"workflow {self.claim.name!r} ({self.claim.id}) at position {pos}"

    def journal(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call the journal, riding out short outages; a lost lease ends the run."""
        try:
            return self.rt.ride_outage(lambda: method(*args, **kwargs))
        except LeaseLostError as exc:
            self.lost = True
            raise _Lost(str(exc)) from exc
        except BackendError as exc:  # another failure, or an outage longer than the retries
            raise _Infra(exc) from exc

    def _live(self) -> None:
        if self.lost:
            raise _Lost("lease lost")
        if self.rt.stopping:
            raise _Release()

    def _next(self, kind: str, name: str) -> tuple[int, Entry | None]:
        """Take the next position; check the journal's entry there against this call."""
        pos = self.pos
        self.pos += 1
        entry = self.history.get(pos)
        if entry is not None:
            if entry.kind == EntryKind.CANCEL:
                raise CancelledError(f"{self._where(pos)}: the workflow was cancelled")
            if entry.kind != kind or entry.name != name:
                raise NonDeterminismError(
                    f"{self._where(pos)}: the code now calls {kind} {name!r}, but the journal recorded "
                    f"{entry.kind} {entry.name!r} there. The workflow's code changed since this run was "
                    "journaled. Fix: deploy the code that started it (keep old paths until its runs "
                    "finish), or cancel it and start a new workflow"
                )
            return pos, entry  # final: replay it; waiting: its wait loop watches for cancellation
        self._live()
        if self.cancel_requested:
            self._cancel_at(pos, kind, name)
        return pos, None

    def _cancel_at(self, pos: int, kind: str, name: str) -> None:
        now = self.rt.clock.time()
        self.journal(
            self.rt.journal.record,
            self.claim.id,
            self.token,
            Entry(pos, EntryKind.CANCEL, name, EntryStatus.OK, started_at=now, finished_at=now, detail=kind),
        )
        raise CancelledError(f"{self._where(pos)}: the workflow was cancelled before {kind} {name!r}")

    def _record(self, entry: Entry) -> Entry:
        rec = self.journal(self.rt.journal.record, self.claim.id, self.token, entry)
        self.cancel_requested = self.cancel_requested or rec.cancel_requested
        return rec.entry  # type: ignore[no-any-return]

    def _replay(self, entry: Entry) -> Any:
        if entry.status == EntryStatus.ERROR:
            raise decode_error(self.rt.json.decode(entry.error or b"{}"))
        return None if entry.result is None else self.codec.decode(entry.result)

    def _wait_until(self, pos: int, kind: str, name: str, wake_at: float) -> None:
        """Block until ``wake_at`` in this thread when it is near, else park the workflow."""
        clock = self.rt.clock
        while True:
            self._live()
            if self.cancel_requested:
                self._cancel_at(pos, kind, name)
            remaining = wake_at - clock.time()
            if remaining <= 0:
                return
            if remaining > self.rt.inline_wait:
                raise _Suspend(wake_at, f"{kind} {name}")
            clock.sleep(min(remaining, self.rt.poll_slice))

    # -- steps -------------------------------------------------------------------

    def step(self, call: StepCall) -> Any:
        name = call.name
        if call.transactional and call.timeout is not None:
            raise SubmitError(
                f"workflow {self.claim.name!r}: step {name!r} has transactional=True and timeout=; a "
                "transaction cannot be abandoned safely. Fix: bound it with the database's statement "
                "timeout instead"
            )
        pos, entry = self._next(EntryKind.STEP, name)
        if entry is not None and entry.final:
            self.rt.count_step(self.claim.name, "replayed")
            value = self._replay(entry)
        else:
            value = self._execute(pos, entry, call)
        if call.undo is not None:
            self.completed.append(
                _Completed(
                    pos,
                    _name_of(call.undo),
                    call.undo,
                    value,
                    call.transactional,
                    call.undo_retries,
                    call.backoff,
                )
            )
        return value

    def _execute(self, pos: int, entry: Entry | None, call: StepCall) -> Any:
        name = call.name
        clock = self.rt.clock
        attempts = entry.attempts if entry is not None else 0
        started = entry.started_at if entry is not None else clock.time()
        if entry is not None and entry.wake_at is not None:  # a parked retry back-off
            self._wait_until(pos, EntryKind.STEP, name, entry.wake_at)
        what = f"step {name!r} ({self._where(pos)})"
        while True:
            attempts += 1
            self.current = (name, clock.time())
            try:
                if call.transactional:
                    return self._transactional(pos, call, attempts, started, what)
                value = _call(call.fn, call.args, call.timeout, what)
                data = self.encode(value, f"the result of {what}")
            except _Control:
                raise
            except SubmitError as exc:  # an unserializable result: a bug, not worth a retry
                self._fail(pos, name, attempts, started, exc)
                raise
            except Exception as exc:
                if (
                    isinstance(exc, NonDeterminismError)
                    or not isinstance(exc, call.retry_on)
                    or attempts > call.retries
                ):
                    self._fail(pos, name, attempts, started, exc)
                    raise
                self.rt.count_step(self.claim.name, "retried")
                delay = backoff_delay(call.backoff, attempts, call.max_backoff)
                if delay > self.rt.inline_wait:
                    wake_at = clock.time() + delay
                    self._record(
                        Entry(
                            pos,
                            EntryKind.STEP,
                            name,
                            EntryStatus.WAITING,
                            error=self._encode_error(exc),
                            attempts=attempts,
                            started_at=started,
                            wake_at=wake_at,
                        )
                    )
                    raise _Suspend(wake_at, f"retry {name}") from exc
                self._wait_until(pos, EntryKind.STEP, name, clock.time() + delay)
                continue
            finally:
                self.current = (None, None)
            stored = self._record(
                Entry(
                    pos,
                    EntryKind.STEP,
                    name,
                    EntryStatus.OK,
                    result=data,
                    attempts=attempts,
                    started_at=started,
                    finished_at=clock.time(),
                )
            )
            self.rt.count_step(self.claim.name, "completed")
            return self._replay(stored)

    def _transactional(self, pos: int, call: StepCall, attempts: int, started: float, what: str) -> Any:
        def work(tx: Any) -> Entry:
            data = self.encode(call.fn(tx, *call.args), f"the result of {what}")
            return Entry(
                pos,
                EntryKind.STEP,
                call.name,
                EntryStatus.OK,
                result=data,
                attempts=attempts,
                started_at=started,
                finished_at=self.rt.clock.time(),
                detail="transactional",
            )

        rec = self.journal(self.rt.journal.record_transactional, self.claim.id, self.token, pos, work)
        self.cancel_requested = self.cancel_requested or rec.cancel_requested
        self.rt.count_step(self.claim.name, "completed" if rec.written else "replayed")
        return self._replay(rec.entry)

    def encode(self, value: Any, what: str) -> bytes:
        """Encode a value for the journal; a value it cannot carry is a clear SubmitError."""
        try:
            return self.codec.encode(value, unit=self.claim.name, what=what)
        except SubmitError as exc:
            raise SubmitError(
                f"workflow {self.claim.name!r}: {what} is a {type(value).__name__}, which is not "
                f"JSON-compatible ({exc.__cause__ or exc}). Fix: return plain data (ids, numbers, "
                "strings, lists, dicts) and keep live objects (connections, clients, files) out of "
                "the journal"
            ) from exc

    def _encode_error(self, exc: BaseException) -> bytes:
        return self.rt.json.encode(encode_error(exc))

    def _fail(self, pos: int, name: str, attempts: int, started: float, exc: BaseException) -> None:
        self.rt.count_step(self.claim.name, "failed")
        self._record(
            Entry(
                pos,
                EntryKind.STEP,
                name,
                EntryStatus.ERROR,
                error=self._encode_error(exc),
                attempts=attempts,
                started_at=started,
                finished_at=self.rt.clock.time(),
            )
        )

    # -- durable waits ---------------------------------------------------------

    def sleep(self, seconds: float) -> None:
        pos, entry = self._next(EntryKind.SLEEP, "sleep")
        if entry is not None and entry.final:
            return
        clock = self.rt.clock
        if entry is None:
            now = clock.time()
            entry = Entry(
                pos,
                EntryKind.SLEEP,
                "sleep",
                EntryStatus.WAITING,
                started_at=now,
                wake_at=now + seconds,
                detail=f"{seconds:g}s",
            )
            self._record(entry)
        wake_at = entry.wake_at if entry.wake_at is not None else 0.0
        self._wait_until(pos, EntryKind.SLEEP, "sleep", wake_at)
        self._record(
            Entry(
                pos,
                EntryKind.SLEEP,
                "sleep",
                EntryStatus.OK,
                started_at=entry.started_at,
                finished_at=clock.time(),
                wake_at=wake_at,
                detail=entry.detail,
            )
        )

    def wait_for(self, signal: str, timeout: float | None, default: Any) -> Any:
        pos, entry = self._next(EntryKind.SIGNAL, signal)
        if entry is not None and entry.final:
            return self._signal_value(entry, timeout, default)
        clock = self.rt.clock
        if entry is None:
            now = clock.time()
            deadline = FOREVER if timeout is None else now + timeout
            entry = Entry(
                pos, EntryKind.SIGNAL, signal, EntryStatus.WAITING, started_at=now, wake_at=deadline
            )
            self._record(entry)
        deadline = entry.wake_at if entry.wake_at is not None else FOREVER
        j = self.rt.journal
        while True:
            mark = j.changes.mark()  # before the look: a signal sent after it ends the nap below
            got = self.journal(j.consume_signal, self.claim.id, self.token, pos, signal)
            if got is not None:
                return self._signal_value(got.entry, timeout, default)
            self._live()
            if self.cancel_requested:
                self._cancel_at(pos, EntryKind.SIGNAL, signal)
            now = clock.time()
            if now >= deadline:
                stored = self._record(
                    Entry(
                        pos,
                        EntryKind.SIGNAL,
                        signal,
                        EntryStatus.OK,
                        started_at=entry.started_at,
                        finished_at=now,
                        wake_at=deadline,
                        detail="timeout",
                    )
                )
                return self._signal_value(stored, timeout, default)
            if deadline - now > self.rt.inline_wait:
                raise _Suspend(deadline, f"signal {signal}")
            self.rt.nap(mark, min(deadline - now, self.rt.poll_slice))

    def _signal_value(self, entry: Entry, timeout: float | None, default: Any) -> Any:
        if entry.detail == "timeout":
            if default is _MISSING:
                raise ResultTimeoutError(
                    f"{self._where(entry.position)}: no signal {entry.name!r} arrived within {timeout}s. "
                    "Fix: send it with app.signal(id, name, payload) or `foundry workflows signal`, "
                    "or pass default= to wait_for"
                )
            return default
        return self._replay(entry)

    # -- children --------------------------------------------------------------

    def child(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], child_id: str | None) -> Any:
        pos, entry = self._next(EntryKind.CHILD, name)
        if entry is not None and entry.final:
            return self._replay(entry)
        rt = self.rt
        if entry is None:
            spec = rt.spec(name)
            payload = rt.encode_args(spec.name, args, kwargs)
            child_id = child_id or f"{self.claim.id}/{pos}"
            now = rt.clock.time()
            entry = Entry(
                pos,
                EntryKind.CHILD,
                name,
                EntryStatus.WAITING,
                started_at=now,
                wake_at=FOREVER,
                detail=child_id,
            )
            self._record(entry)
            rt.create(spec, payload, child_id, parent=(self.claim.id, pos), owner=None)
        child_id = entry.detail or f"{self.claim.id}/{pos}"
        while True:
            self._live()
            state = self.journal(rt.journal.get, child_id)
            if state is None:  # created by a run that died before starting it: start it now
                spec = rt.spec(name)
                payload = rt.encode_args(name, args, kwargs)
                rt.create(spec, payload, child_id, parent=(self.claim.id, pos), owner=None)
                continue
            if state.status.finished:
                ok = state.status == WorkflowStatus.SUCCEEDED
                stored = self._record(
                    Entry(
                        pos,
                        EntryKind.CHILD,
                        name,
                        EntryStatus.OK if ok else EntryStatus.ERROR,
                        result=state.result if ok else None,
                        error=None if ok else state.error,
                        started_at=entry.started_at,
                        finished_at=state.finished_at,
                        detail=child_id,
                    )
                )
                return self._replay(stored)
            claim = self.journal(rt.journal.claim_one, child_id, rt.owner, lease=rt.lease)
            if claim is not None:
                try:
                    rt.execute(claim)  # the child runs here, in this thread, then we look again
                except BackendError as exc:  # the journal failed under the child: not our failure
                    raise _Infra(exc) from exc
                continue
            raise _Suspend(FOREVER, f"child {child_id}")

    # -- the whole run ---------------------------------------------------------

    def execute(self) -> Outcome | None:
        """Run (or resume) the workflow; the outcome, or ``None`` when it was parked,
        handed back, or taken over."""
        rt = self.rt
        try:
            if not self.claim.fresh:
                _, entries = self.journal(rt.journal.load, self.claim.id)
                self.history = {e.position: e for e in entries}
            args, kwargs = rt.decode_args(self.claim)
            failure: Exception
            try:
                value = self.spec.fn(WorkflowContext(self), *args, **kwargs)
            except _Control:
                raise
            except NonDeterminismError as exc:
                return self._finish_failed(exc, compensation="")
            except Exception as exc:
                failure = exc
            else:
                tail = self.history.get(self.pos)
                if tail is not None and tail.kind == EntryKind.CANCEL:  # cancelled as it returned
                    failure = CancelledError(f"{self._where(self.pos)}: the workflow was cancelled")
                    self.pos += 1
                elif tail is not None or any(p > self.pos for p in self.history):
                    later = tail or self.history[min(p for p in self.history if p > self.pos)]
                    return self._finish_failed(
                        NonDeterminismError(
                            f"{self._where(self.pos)}: the code returned, but the journal recorded "
                            f"{later.kind} {later.name!r} at position {later.position}. The workflow's code "
                            "changed since this run was journaled. Fix: deploy the code that started it, "
                            "or cancel it and start a new workflow"
                        ),
                        compensation="",
                    )
                else:
                    try:
                        data = self.encode(value, "the workflow's result")
                    except SubmitError as exc:
                        failure = exc
                    else:
                        outcome = self._succeed(data)
                        if outcome is not None:
                            return outcome
                        failure = CancelledError(f"{self._where(self.pos - 1)}: the workflow was cancelled")
            try:
                compensation = self._compensate()
            except NonDeterminismError as exc:
                return self._finish_failed(exc, compensation="partial")
            status = (
                WorkflowStatus.CANCELLED if isinstance(failure, CancelledError) else WorkflowStatus.FAILED
            )
            self.journal(
                rt.journal.finish,
                self.claim.id,
                self.token,
                status,
                error=self._encode_error(failure),
                compensation=compensation,
            )
            rt.count_outcome(self.claim.name, status)
            return Outcome(error=failure)
        except _Suspend as parked:
            self.journal(
                rt.journal.suspend,
                self.claim.id,
                self.token,
                wake_at=parked.wake_at,
                seen_wakeups=self.claim.wakeups,
                current_step=parked.what,
            )
            rt.parked(self.claim.id, parked.wake_at)
            return None
        except _Release:
            try:
                self.journal(rt.journal.release, self.claim.id, self.token)
            except _Control:
                pass
            return None
        except _Lost:
            return None

    def _succeed(self, data: bytes) -> Outcome | None:
        """Record success; ``None`` when a cancellation won the race (a cancel entry is
        then recorded at the end so a resumed run compensates too)."""
        rt = self.rt
        if self.journal(rt.journal.finish, self.claim.id, self.token, WorkflowStatus.SUCCEEDED, result=data):
            rt.count_outcome(self.claim.name, WorkflowStatus.SUCCEEDED)
            return Outcome(value=self.codec.decode(data))
        self.cancel_requested = True
        pos = self.pos
        self.pos += 1
        now = rt.clock.time()
        self._record(Entry(pos, EntryKind.CANCEL, "return", EntryStatus.OK, started_at=now, finished_at=now))
        return None

    def _finish_failed(self, exc: Exception, *, compensation: str) -> Outcome:
        self.journal(
            self.rt.journal.finish,
            self.claim.id,
            self.token,
            WorkflowStatus.FAILED,
            error=self._encode_error(exc),
            compensation=compensation,
        )
        self.rt.count_outcome(self.claim.name, WorkflowStatus.FAILED)
        return Outcome(error=exc)

    # -- compensation ----------------------------------------------------------

    def _compensate(self) -> str:
        """Undo every completed step in reverse order, each journaled at the next
        position. Returns "" (nothing to undo), "done", or "partial" (an undo failed)."""
        if not self.completed:
            return ""
        rt = self.rt
        if self.claim.status != WorkflowStatus.COMPENSATING:
            self.journal(rt.journal.set_compensating, self.claim.id, self.token)
        state = "done"
        for done in reversed(self.completed):
            pos = self.pos
            self.pos += 1
            entry = self.history.get(pos)
            if entry is not None:
                if entry.kind != EntryKind.UNDO or entry.name != done.name or entry.ref != done.position:
                    raise NonDeterminismError(
                        f"{self._where(pos)}: compensation now undoes step {done.position} with "
                        f"{done.name!r}, but the journal recorded {entry.kind} {entry.name!r} "
                        f"(ref {entry.ref}) there. Fix: deploy the code that started this workflow"
                    )
                if entry.status == EntryStatus.ERROR:
                    state = "partial"
                if entry.final:
                    continue
            if self.lost:
                raise _Lost("lease lost")
            if not self._undo(pos, done):
                state = "partial"
        return state

    def _undo(self, pos: int, done: _Completed) -> bool:
        rt = self.rt
        clock = rt.clock
        started = clock.time()
        attempts = 0
        while True:
            attempts += 1
            self.current = (f"undo {done.name}", clock.time())
            try:
                if done.transactional:

                    def work(tx: Any, attempts: int = attempts) -> Entry:
                        done.undo(tx, done.result)
                        return self._undo_entry(pos, done, EntryStatus.OK, attempts, started, None)

                    self.journal(rt.journal.record_transactional, self.claim.id, self.token, pos, work)
                else:
                    done.undo(done.result)
                    self._record(self._undo_entry(pos, done, EntryStatus.OK, attempts, started, None))
                rt.count_compensation(self.claim.name)
                return True
            except _Control:
                raise
            except Exception as exc:
                if attempts > done.retries:
                    self._record(self._undo_entry(pos, done, EntryStatus.ERROR, attempts, started, exc))
                    rt.count_step(self.claim.name, "undo_failed")
                    return False
                clock.sleep(min(backoff_delay(done.backoff, attempts, 60.0), rt.inline_wait))
            finally:
                self.current = (None, None)

    def _undo_entry(
        self,
        pos: int,
        done: _Completed,
        status: str,
        attempts: int,
        started: float,
        exc: BaseException | None,
    ) -> Entry:
        return Entry(
            pos,
            EntryKind.UNDO,
            done.name,
            status,
            error=None if exc is None else self._encode_error(exc),
            attempts=attempts,
            started_at=started,
            finished_at=self.rt.clock.time(),
            ref=done.position,
            detail="transactional" if done.transactional else None,
        )
