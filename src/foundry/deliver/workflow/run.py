"""One run of a workflow: replay against the journal, retries, timeouts, durable waits,
children, fan-outs, patches, published state and compensation.

A run re-executes the workflow function from the top. The n-th durable call is
*position* n: when the journal already has a final entry there, the call returns (or
raises) what was recorded without running anything; otherwise it runs and records. A
recorded entry whose kind or name differs from the call the code makes now is a
:class:`~foundry.errors.NonDeterminismError` naming both and the position.

Each durable call is a plan (``_plan``): the journal's side written once here, carried
out by ``drive`` in a ``def`` workflow and by ``adrive`` in an ``async def`` one.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Coroutine
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from foundry.backends.journal import set_aside_error
from foundry.backends.journal.base import Claim, Entry, EntryKind, EntryStatus, WorkflowStatus
from foundry.deliver.workflow._plan import (
    FOREVER,
    RUNNING,
    Invoke,
    Nap,
    Plan,
    StepCall,
    _Control,
    _EndOfHistory,
    _Expired,
    _Infra,
    _Lost,
    _Release,
    _SetAside,
    _Suspend,
    drive,
    invoke_sync,
    is_async_fn,
    name_of,
    run_coroutine,
)
from foundry.errors import (
    BackendError,
    CancelledError,
    LeaseLostError,
    MalformedRecordError,
    NonDeterminismError,
    RecordError,
    ResultTimeoutError,
    SubmitError,
    WorkflowTimeoutError,
    WorkTimeoutError,
)
from foundry.handle import Outcome
from foundry.observe.stall import Target
from foundry.observe.watchdog import watching
from foundry.payload import DEFAULT_MAX_PAYLOAD, too_large
from foundry.retry import Backoff
from foundry.runtime import UnitSpec
from foundry.serialize import ErrorTypes, decode_error, encode_error, get_codec
from foundry.typed import Payloads, payloads_for

if TYPE_CHECKING:
    from foundry.deliver.workflow._host import RunHost

__all__ = ["MISSING", "Run"]

MISSING: Any = object()
# Values that come back from their encoding (JSON or pickle) as an equal value of the same
# type: a step that just recorded one returns it as it is, as its replay would.
_SCALARS = frozenset({int, float, str, bool, type(None)})
_UNDO_BACKOFF_CAP = 60.0
_LEAN_CACHE = 64  # the step functions a run remembers the name and types of (plain_step)


@dataclass(slots=True)
class _Completed:
    """A completed step with an undo, remembered for compensation."""

    position: int
    name: str
    undo: Callable[..., Any]
    result: Any
    transactional: bool
    retries: int
    call: StepCall  # the step it undoes (its back-off policy paces the undo's retries)


class Run:
    """The state of one run (one claim) of one workflow. ``replay_only`` (``foundry
    workflows replay``): check the code against the journal, never run or write."""

    def __init__(self, rt: RunHost, claim: Claim, spec: UnitSpec, *, replay_only: bool = False) -> None:
        self.rt = rt
        self.claim = claim
        self.spec = spec
        self.token = claim.token
        self.codec = get_codec(spec.traits.codec)  # declared (JSON); decode_args checks the record's
        self.errors = spec.errors
        self.deadline = claim.deadline
        self.history: dict[int, Entry] = {}
        self.history_end = 0  # one past the last position the journal had when the run began
        self.pos = 0
        self.completed: list[_Completed] = []
        self.patches: dict[str, bool] = {}
        self.published: dict[str, Any] = {}
        self.stored_published: bytes | None = None  # what the journal holds (written once per change)
        self.has_children = False
        self.cancel_requested = claim.cancel_requested
        self.replay_only = replay_only
        self.lost = False
        self.ended = False  # set (under beat_lock) when the run stops: no heartbeat after it
        self.beat_lock = threading.Lock()
        self.current: tuple[str | None, float | None] = (None, None)
        self.tracer = None if replay_only else rt.tracing.tracer()  # None: this run is not traced
        # (step function, name=) -> (step name, result types; None: general path), plain_step's
        self.lean_steps: dict[tuple[Callable[..., Any], str | None], tuple[str, Payloads | None]] = {}

    def load(self, entries: list[Entry]) -> None:
        self.history = {e.position: e for e in entries}
        self.history_end = max(self.history, default=-1) + 1

    # -- plumbing ----------------------------------------------------------------

    def where(self, pos: int) -> str:
        return f"workflow {self.claim.name!r} ({self.claim.id}) at position {pos}"

    def journal(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call the journal, riding out short outages; a lost lease ends the run."""
        if self.replay_only:
            raise AssertionError(f"{self.where(self.pos)}: a replay must not touch the journal")
        try:
            return self.rt.ride_outage(functools.partial(method, *args, **kwargs))
        except LeaseLostError as exc:
            self.lost = True
            raise _Lost(str(exc)) from exc
        except MalformedRecordError as exc:  # not an outage: the same row fails every run
            raise _SetAside(exc) from exc
        except BackendError as exc:  # another failure, or an outage longer than the retries
            raise _Infra(exc) from exc

    def live(self) -> None:
        """About to do something the journal has no record of yet."""
        if self.replay_only:
            raise _EndOfHistory()
        if self.lost:
            raise _Lost("lease lost")
        if self.rt.stopping:
            raise _Release()

    def expired(self) -> bool:
        return self.deadline is not None and self.rt.clock.time() >= self.deadline

    def checkpoint(self, pos: int, kind: str, name: str, *, branch: bool = False) -> None:
        """Before new work at ``pos``: stop if the run must (its lease, the worker), and
        end the workflow here if it was cancelled or its deadline passed — recorded at
        ``pos``, unless it is a fan-out's branch (the fan-out records it once)."""
        self.live()
        if self.cancel_requested:
            if branch:
                raise CancelledError(f"{self.where(pos)}: the workflow was cancelled")
            self._cancel_at(pos, kind, name)
        if self.expired():
            if branch:
                raise self.timeout_error(pos)
            self._timeout_at(pos, kind, name)

    def next(self, kind: str, name: str) -> tuple[int, Entry | None]:
        """Take the next position; check the journal's entry there against this call."""
        pos = self.pos
        self.pos += 1
        entry = self.history.get(pos)
        if entry is not None:
            if entry.kind == EntryKind.CANCEL:
                raise CancelledError(f"{self.where(pos)}: the workflow was cancelled")
            if entry.kind == EntryKind.TIMEOUT:
                raise self.timeout_error(pos)
            if entry.kind != kind or entry.name != name:
                raise self.mismatch(pos, f"{kind} {name!r}", entry)
            return pos, entry  # final: replay it; waiting: its wait loop watches for cancellation
        self.checkpoint(pos, kind, name)
        return pos, None

    def mismatch(self, pos: int, call: str, entry: Entry) -> NonDeterminismError:
        return NonDeterminismError(
            f"{self.where(pos)}: the code now calls {call}, but the journal recorded "
            f"{entry.kind} {entry.name!r} there. The workflow's code changed since this run was "
            "journaled. Fix: keep the old path behind `if wf.patched(...)` until its runs finish "
            "(check with `foundry workflows replay`), deploy the code that started it, or cancel it "
            "and start a new workflow"
        )

    def _cancel_at(self, pos: int, kind: str, name: str) -> None:
        now = self.rt.clock.time()
        self.record(
            Entry(pos, EntryKind.CANCEL, name, EntryStatus.OK, started_at=now, finished_at=now, detail=kind)
        )
        raise CancelledError(f"{self.where(pos)}: the workflow was cancelled before {kind} {name!r}")

    def timeout_error(self, pos: int) -> WorkflowTimeoutError:
        timeout = self.spec.traits.timeout
        return WorkflowTimeoutError(
            f"{self.where(pos)}: the workflow ran past its timeout={timeout:g}s (its deadline is in the "
            "journal), so it stopped here and its completed steps are undone. Fix: raise timeout= on "
            "@app.workflow, or make the slow step faster (give it its own timeout= and retries=)"
            if timeout is not None
            else f"{self.where(pos)}: the workflow ran past its deadline, so it stopped here and its "
            "completed steps are undone"
        )

    def _timeout_at(self, pos: int, kind: str, name: str) -> None:
        now = self.rt.clock.time()
        self.record(
            Entry(pos, EntryKind.TIMEOUT, name, EntryStatus.OK, started_at=now, finished_at=now, detail=kind)
        )
        raise self.timeout_error(pos)

    def record(self, entry: Entry) -> Entry:
        rec = self.journal(self.rt.journal.record, self.claim.id, self.token, entry)
        self.cancel_requested = self.cancel_requested or rec.cancel_requested
        stored: Entry = rec.entry
        self.history[stored.position] = stored
        return stored

    def replay(self, entry: Entry, errors: ErrorTypes | None = None, types: Payloads | None = None) -> Any:
        """What a final entry recorded: its value, decoded with the declared codec (and
        rebuilt by ``types``, the return annotation of the step's code), or its error,
        rebuilt by ``errors`` (the allow-list of the code that raised it)."""
        if entry.status == EntryStatus.ERROR:
            try:
                record: Any = self.rt.json.decode(entry.error or b"{}")
            except (ValueError, RecursionError):
                text = bytes(entry.error or b"").decode(errors="replace")
                record = {"type": "RemoteError", "message": text}
            raise decode_error(record, errors or self.errors)
        if entry.result is None:
            return None
        try:
            value = self.codec.decode(entry.result)
        except Exception as exc:
            raise RecordError(
                f"{self.where(entry.position)}: the journal's {entry.kind} {entry.name!r} holds a value "
                f"that is not valid {self.codec.name} ({type(exc).__name__}: {str(exc)[:200]}); it was "
                "written by another program or damaged in the store. Fix: cancel this run and start a "
                "new one"
            ) from None
        return self.rebuilt(entry, value, types)

    def rebuilt(self, entry: Entry, value: Any, types: Payloads | None) -> Any:
        """The decoded ``value`` of ``entry`` rebuilt by ``types`` (see :meth:`replay`)."""
        if types is None:
            return value
        return types.load_result(
            value, what=_Label("the journal's ", entry.kind, entry.name, self, entry.position)
        )

    @staticmethod
    def step_types(call: StepCall) -> Payloads:
        """The annotations of a step's code (a unit's function, or the plain function)."""
        return _types_of(call.fn, call.name)

    def step_errors(self, call: StepCall) -> ErrorTypes:
        """The allow-list for a step's errors: the workflow's, plus the step's own (a unit's
        list, or the module of a plain function) and its ``retry_on`` types."""
        own: ErrorTypes | None = getattr(call.fn, "error_types", None)
        base = own if isinstance(own, ErrorTypes) else self.errors
        target = getattr(call.fn, "func", call.fn)  # functools.partial
        module = getattr(target, "__module__", None)
        return base.scoped(
            types=(t for t in call.retry_on if isinstance(t, type)),
            modules=(self.spec.module, module) if isinstance(module, str) else (self.spec.module,),
        )

    def _as_replayed(self, exc: Exception, record: bytes, errors: ErrorTypes) -> Exception:
        """``exc`` as a replay will raise it: itself when ``errors`` rebuilds its type, else the
        :class:`RemoteError` a replay would give, so the workflow takes the same path on its
        first run and on every replay."""
        rebuilt = decode_error(self.rt.json.decode(record), errors)
        if type(rebuilt) is type(exc) or not isinstance(rebuilt, Exception):
            return exc
        rebuilt.__cause__ = exc
        return rebuilt

    def encode(self, value: Any, what: object, types: Payloads | None = None) -> bytes:
        """Encode a value for the journal (by ``types``' return annotation, when given); a
        value it cannot carry (not JSON, not of the declared type, or larger than the
        workflow's ``max_payload``) is a clear SubmitError naming it by ``what`` (a string,
        or a :class:`_Label`)."""
        if types is not None:
            value = types.dump_result(value, what=what)
        try:
            data = self.codec.encode(value, unit=self.claim.name, what=what)
        except SubmitError as exc:
            raise SubmitError(
                f"workflow {self.claim.name!r}: {what} is a {type(value).__name__}, which is not "
                f"JSON-compatible ({exc.__cause__ or exc}). Fix: return plain data (ids, numbers, "
                "strings, lists, dicts) and keep live objects (connections, clients, files) out of "
                "the journal"
            ) from exc
        limit = self.spec.traits.max_payload or DEFAULT_MAX_PAYLOAD
        if len(data) > limit:
            raise too_large(
                f"workflow {self.claim.name!r}",
                str(what),
                len(data),
                limit,
                stored="it was not journaled",
                fix="return a reference (a path, URL or row id) to where the data is, or declare a larger "
                "max_payload= on the workflow",
            )
        return data

    def encode_error(self, exc: BaseException) -> bytes:
        return self.rt.json.encode(encode_error(exc))

    def watch(self, call: StepCall) -> Callable[[Coroutine[Any, Any, Any]], Coroutine[Any, Any, Any]] | None:
        """The loop watchdog around an async step run on a loop of its own: a stall names
        the workflow and the step; ``None`` when the app's ``watchdog`` setting is off."""
        threshold = self.rt.watchdog
        if threshold is None:
            return None
        target = Target(self.claim.name, call.fn, self.spec.traits, phase=call.name)
        metrics = self.rt.metrics

        def watch(work: Coroutine[Any, Any, Any]) -> Coroutine[Any, Any, Any]:
            return watching(work, threshold=threshold, registry=metrics, name="workflow", units=[target])

        return watch

    def remember(self, pos: int, call: StepCall, value: Any) -> None:
        """A completed step with an undo: compensated if the workflow fails later."""
        if call.undo is not None:
            self.completed.append(
                _Completed(
                    pos, name_of(call.undo), call.undo, value, call.transactional, call.undo_retries, call
                )
            )

    def wait_until(
        self, pos: int, kind: str, name: str, wake_at: float, *, branch: bool = False
    ) -> Plan[None]:
        """Wait until ``wake_at`` in this run when it is near, else park the workflow."""
        clock = self.rt.clock
        while True:
            self.checkpoint(pos, kind, name, branch=branch)
            remaining = wake_at - clock.time()
            if remaining <= 0:
                return
            if remaining > self.rt.inline_wait:
                raise _Suspend(self.capped(wake_at), f"{kind} {name}")
            yield Nap(None, min(remaining, self.rt.poll_slice))

    def capped(self, wake_at: float) -> float:
        """A wake-up no later than the workflow's deadline."""
        return wake_at if self.deadline is None else min(wake_at, self.deadline)

    # -- steps -------------------------------------------------------------------

    def step_span(self, pos: int, call: StepCall, attempt: int) -> Callable[[], AbstractContextManager[Any]]:
        """The span of one attempt of the step at ``pos`` (child of the run's span), made
        where the attempt runs."""
        tracer = self.tracer
        assert tracer is not None
        attributes = {
            "foundry.workflow.id": self.claim.id,
            "foundry.workflow.step": call.name,
            "foundry.workflow.position": pos,
            "foundry.workflow.attempt": attempt,
        }
        return functools.partial(tracer.child, f"step {call.name}", attributes)

    def step(self, call: StepCall) -> Plan[Any]:
        if call.transactional and call.timeout is not None:
            raise SubmitError(
                f"workflow {self.claim.name!r}: step {call.name!r} has transactional=True and timeout=; a "
                "transaction cannot be abandoned safely. Fix: bound it with the database's statement "
                "timeout instead"
            )
        pos, entry = self.next(EntryKind.STEP, call.name)
        value = yield from self.step_body(pos, entry, call)
        self.remember(pos, call, value)
        return value

    def plain_step(self, fn: Callable[..., Any], args: tuple[Any, ...], name: str | None) -> Any:
        """``wf.step(fn, *args, name=name)`` with every other option at its default, in a
        ``def`` workflow: what :meth:`step` and :meth:`_attempts` do for a new step of that
        kind — the same checks, the same entry committed before it returns, the same
        metrics — in this frame, without the plan's generators, the ``Invoke``, or the
        labels of error messages that are not raised. An ``async def`` step, a traced run,
        a workflow deadline (it bounds the attempt) and an entry already at the position
        (a replay, or an attempt an earlier run left waiting) take the general path."""
        try:
            known = self.lean_steps.get((fn, name))
        except TypeError:  # an unhashable callable: nothing to remember it by
            known = (name or name_of(fn), None)
        if known is None:
            known = self._lean_step(fn, name)
        step, types = known
        if types is None or self.tracer is not None or self.deadline is not None:
            return drive(self.step(StepCall(fn, args, step)), self.rt)
        pos, entry = self.next(EntryKind.STEP, step)
        if entry is not None:
            return drive(self.step_body(pos, entry, StepCall(fn, args, step)), self.rt)
        clock = self.rt.clock
        started = clock.time()
        self.current = (step, started)
        failure: Exception | None = None
        try:
            value = fn(*args)
            label = _Label("the result of ", EntryKind.STEP, step, self, pos)
            value = types.dump_result(value, what=label)
            data = self.encode(value, label)
        except Exception as exc:
            failure = exc
        finally:
            self.current = (None, None)
        if failure is not None:  # no retries: the first failure is final
            record = self._fail(pos, step, 1, started, failure, None)
            if isinstance(failure, SubmitError):  # an unserializable result: raised as it is
                raise failure
            replayed = self._as_replayed(failure, record, self.step_errors(StepCall(fn, args, step)))
            if replayed is failure:
                raise failure
            raise replayed from failure
        stored = self.record(
            Entry(
                pos,
                EntryKind.STEP,
                step,
                EntryStatus.OK,
                result=data,
                attempts=1,
                started_at=started,
                finished_at=clock.time(),
            )
        )
        self.rt.count_step(self.claim.name, "completed")
        if stored.result is data and type(value) in _SCALARS:
            return self.rebuilt(stored, value, types)  # what a replay decodes from data
        return self.replay(stored, None, types)

    def _lean_step(self, fn: Callable[..., Any], name: str | None) -> tuple[str, Payloads | None]:
        """The step name and result types of ``fn`` for :meth:`plain_step` (``None``
        types: an ``async def`` step, which takes the general path), remembered for the
        run — for a few dozen functions, not for a fresh lambda at every step."""
        step = name or name_of(fn)
        known = (step, None if is_async_fn(fn) else _types_of(fn, step))
        if len(self.lean_steps) < _LEAN_CACHE:
            self.lean_steps[(fn, name)] = known
        return known

    def step_body(
        self, pos: int, entry: Entry | None, call: StepCall, *, branch: bool = False, ref: int | None = None
    ) -> Plan[Any]:
        """Replay the step at ``pos`` or run it (attempts, retries, its timer); a fan-out's
        branch has ``ref`` (the gather's position) and leaves cancellation to the gather."""
        if entry is not None and entry.final:
            self.rt.count_step(self.claim.name, "replayed")
            errors = self.step_errors(call) if entry.status == EntryStatus.ERROR else None
            return self.replay(entry, errors, self.step_types(call))
        return (yield from self._attempts(pos, entry, call, branch, ref))

    def _attempts(
        self, pos: int, entry: Entry | None, call: StepCall, branch: bool, ref: int | None
    ) -> Plan[Any]:
        self.live()
        rt, clock, name = self.rt, self.rt.clock, call.name
        what = f"step {name!r} ({self.where(pos)})"
        types = self.step_types(call)
        attempts = entry.attempts if entry is not None else 0
        started = entry.started_at if entry is not None else clock.time()
        if entry is not None:
            ref = entry.ref
        carried: float | None = None  # the timer of an attempt whose run ended while it ran
        failure: Exception | None = None
        if entry is not None and entry.wake_at is not None:
            if entry.detail == RUNNING:
                if clock.time() >= entry.wake_at:  # its timer survived the run that started it
                    failure = WorkTimeoutError(
                        f"{what} was still running at its timeout={call.timeout}s when the run that "
                        "started it ended (the worker died or stopped); the attempt counts as failed"
                    )
                else:  # run that attempt again, against the same timer
                    attempts -= 1
                    carried = entry.wake_at
            else:  # a parked retry back-off
                yield from self.wait_until(pos, EntryKind.STEP, name, entry.wake_at, branch=branch)
        while True:
            if failure is None:
                attempts += 1
                self.current = (name, clock.time())
                step_until = carried
                if step_until is None and call.timeout is not None:
                    step_until = clock.time() + call.timeout
                carried = None
                try:
                    if call.transactional:
                        return self._transactional(pos, call, attempts, started, what, ref)
                    if step_until is not None:  # the timer lives in the journal, not in this run
                        self.record(
                            Entry(
                                pos,
                                EntryKind.STEP,
                                name,
                                EntryStatus.WAITING,
                                attempts=attempts,
                                started_at=started,
                                wake_at=step_until,
                                ref=ref,
                                detail=RUNNING,
                            )
                        )
                    until = step_until if self.deadline is None else min(step_until or FOREVER, self.deadline)
                    watch = self.watch(call) if is_async_fn(call.fn) else None
                    span = None if self.tracer is None else self.step_span(pos, call, attempts)
                    value = yield Invoke(call, None if until == FOREVER else until, what, watch, span)
                    value = types.dump_result(value, what=f"the result of {what}")
                    data = self.encode(value, f"the result of {what}")
                except _Expired:
                    if self.expired() and (step_until is None or self.deadline <= step_until):  # type: ignore[operator]
                        if branch:
                            raise self.timeout_error(pos) from None
                        self._timeout_at(pos, EntryKind.STEP, name)
                    failure = WorkTimeoutError(
                        f"{what} exceeded timeout={call.timeout}s; the attempt counts as failed. A "
                        "synchronous step's thread cannot be stopped and was left behind (it may still "
                        "finish its side effect); an async step was cancelled. Fix: raise timeout=, or "
                        "make the step async"
                    )
                except SubmitError as exc:  # an unserializable result: a bug, not worth a retry
                    self._fail(pos, name, attempts, started, exc, ref)
                    raise
                except Exception as exc:
                    failure = exc
                finally:
                    self.current = (None, None)
                if failure is None:
                    stored = self.record(
                        Entry(
                            pos,
                            EntryKind.STEP,
                            name,
                            EntryStatus.OK,
                            result=data,
                            attempts=attempts,
                            started_at=started,
                            finished_at=clock.time(),
                            ref=ref,
                        )
                    )
                    rt.count_step(self.claim.name, "completed")
                    if stored.result is data and type(value) in _SCALARS:
                        return self.rebuilt(stored, value, types)  # what a replay decodes from data
                    return self.replay(stored, None, types)
            error: Exception = failure
            failure = None
            if (
                isinstance(error, NonDeterminismError)
                or not isinstance(error, call.retry_on)
                or attempts > call.retries
            ):
                record = self._fail(pos, name, attempts, started, error, ref)
                replayed = self._as_replayed(error, record, self.step_errors(call))
                if replayed is error:
                    raise error
                raise replayed from error
            rt.count_step(self.claim.name, "retried")
            delay = call.delay(attempts)
            if delay > rt.inline_wait:
                wake_at = clock.time() + delay
                self.record(
                    Entry(
                        pos,
                        EntryKind.STEP,
                        name,
                        EntryStatus.WAITING,
                        error=self.encode_error(error),
                        attempts=attempts,
                        started_at=started,
                        wake_at=wake_at,
                        ref=ref,
                    )
                )
                raise _Suspend(self.capped(wake_at), f"retry {name}") from error
            yield from self.wait_until(pos, EntryKind.STEP, name, clock.time() + delay, branch=branch)

    def _transactional(
        self, pos: int, call: StepCall, attempts: int, started: float, what: str, ref: int | None
    ) -> Any:
        def work(tx: Any) -> Entry:
            data = self.encode(call.fn(tx, *call.args), f"the result of {what}", self.step_types(call))
            return Entry(
                pos,
                EntryKind.STEP,
                call.name,
                EntryStatus.OK,
                result=data,
                attempts=attempts,
                started_at=started,
                finished_at=self.rt.clock.time(),
                ref=ref,
                detail="transactional",
            )

        rec = self.journal(self.rt.journal.record_transactional, self.claim.id, self.token, pos, work)
        self.cancel_requested = self.cancel_requested or rec.cancel_requested
        self.history[pos] = rec.entry
        self.rt.count_step(self.claim.name, "completed" if rec.written else "replayed")
        return self.replay(rec.entry, self.step_errors(call), self.step_types(call))

    def _fail(
        self, pos: int, name: str, attempts: int, started: float, exc: BaseException, ref: int | None
    ) -> bytes:
        """Record the step's failure; the error record written."""
        self.rt.count_step(self.claim.name, "failed")
        record = self.encode_error(exc)
        self.record(
            Entry(
                pos,
                EntryKind.STEP,
                name,
                EntryStatus.ERROR,
                error=record,
                attempts=attempts,
                started_at=started,
                finished_at=self.rt.clock.time(),
                ref=ref,
            )
        )
        return record

    # -- durable waits ---------------------------------------------------------

    def sleep(self, seconds: float) -> Plan[None]:
        pos, entry = self.next(EntryKind.SLEEP, "sleep")
        if entry is not None and entry.final:
            return
        self.live()
        clock = self.rt.clock
        if entry is None:
            now = clock.time()
            entry = self.record(
                Entry(
                    pos,
                    EntryKind.SLEEP,
                    "sleep",
                    EntryStatus.WAITING,
                    started_at=now,
                    wake_at=now + seconds,
                    detail=f"{seconds:g}s",
                )
            )
        wake_at = entry.wake_at if entry.wake_at is not None else 0.0
        yield from self.wait_until(pos, EntryKind.SLEEP, "sleep", wake_at)
        self.record(
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

    def wait_for(self, signal: str, timeout: float | None, default: Any) -> Plan[Any]:
        pos, entry = self.next(EntryKind.SIGNAL, signal)
        if entry is not None and entry.final:
            return self._signal_value(entry, timeout, default)
        self.live()
        clock = self.rt.clock
        if entry is None:
            now = clock.time()
            deadline = FOREVER if timeout is None else now + timeout
            entry = self.record(
                Entry(pos, EntryKind.SIGNAL, signal, EntryStatus.WAITING, started_at=now, wake_at=deadline)
            )
        deadline = entry.wake_at if entry.wake_at is not None else FOREVER
        j = self.rt.journal
        while True:
            mark = j.changes.mark()  # before the look: a signal sent after it ends the nap below
            got = self.journal(j.consume_signal, self.claim.id, self.token, pos, signal)
            if got is not None:
                self.history[pos] = got.entry
                return self._signal_value(got.entry, timeout, default)
            self.checkpoint(pos, EntryKind.SIGNAL, signal)
            now = clock.time()
            if now >= deadline:
                stored = self.record(
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
                raise _Suspend(self.capped(deadline), f"signal {signal}")
            yield Nap(mark, min(deadline - now, self.rt.poll_slice))

    def _signal_value(self, entry: Entry, timeout: float | None, default: Any) -> Any:
        if entry.detail == "timeout":
            if default is MISSING:
                raise ResultTimeoutError(
                    f"{self.where(entry.position)}: no signal {entry.name!r} arrived within {timeout}s. "
                    "Fix: send it with app.signal(id, name, payload) or `foundry workflows signal`, "
                    "or pass default= to wait_for"
                )
            return default
        return self.replay(entry)

    # -- children --------------------------------------------------------------

    def child(
        self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], child_id: str | None
    ) -> Plan[Any]:
        pos, entry = self.next(EntryKind.CHILD, name)
        patience = self.rt.clock.time() + self.rt.inline_wait
        return (
            yield from self.child_body(
                pos, entry, name, args, kwargs, child_id, lambda: self.rt.clock.time() < patience
            )
        )

    def child_body(
        self,
        pos: int,
        entry: Entry | None,
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        child_id: str | None,
        patient: Callable[[], bool],
        *,
        ref: int | None = None,
        branch: bool = False,
    ) -> Plan[Any]:
        """Start the child at ``pos`` as a run of its own (here, on this runtime's pool,
        unless a worker takes it first) and wait for it: inline while ``patient()``, then
        parked until its end wakes this workflow."""
        self.has_children = True
        rt = self.rt
        if entry is not None and entry.final:
            return self.replay(entry, rt.error_types(name))
        self.live()
        if entry is None:
            spec = rt.spec(name)
            payload = rt.encode_args(spec, args, kwargs)
            child_id = child_id or f"{self.claim.id}/{pos}"
            entry = self.record(
                Entry(
                    pos,
                    EntryKind.CHILD,
                    name,
                    EntryStatus.WAITING,
                    started_at=rt.clock.time(),
                    wake_at=FOREVER,
                    ref=ref,
                    detail=child_id,
                )
            )
            rt.start_child(spec, payload, child_id, parent=(self.claim.id, pos))
        child_id = entry.detail or f"{self.claim.id}/{pos}"
        looked = False
        while True:
            mark = rt.journal.changes.mark()
            state = self.journal(rt.journal.get, child_id)
            if state is None:  # created by a run that died before starting it: start it now
                spec = rt.spec(name)
                rt.start_child(
                    spec, rt.encode_args(spec, args, kwargs), child_id, parent=(self.claim.id, pos)
                )
                continue
            if state.status.finished:
                ok = state.status == WorkflowStatus.SUCCEEDED
                stored = self.record(
                    Entry(
                        pos,
                        EntryKind.CHILD,
                        name,
                        EntryStatus.OK if ok else EntryStatus.ERROR,
                        result=state.result if ok else None,
                        error=None if ok else state.error,
                        started_at=entry.started_at,
                        finished_at=state.finished_at,
                        ref=ref,
                        detail=child_id,
                    )
                )
                return self.replay(stored, rt.error_types(name))
            self.checkpoint(pos, EntryKind.CHILD, name, branch=branch)
            if not looked:  # its run ended without an outcome (a crash): run it here
                looked = True
                rt.adopt(child_id)
            if not patient():
                raise _Suspend(self.capped(FOREVER), f"child {child_id}")
            yield Nap(mark, rt.poll_slice)

    # -- versioning and published state -----------------------------------------

    def patched(self, name: str) -> bool:
        """Whether this run takes the new code path of patch ``name`` (see the context)."""
        known = self.patches.get(name)
        if known is not None:
            return known
        entry = self.history.get(self.pos)
        if entry is not None:
            taken = entry.kind == EntryKind.PATCH and entry.name == name
            if taken:
                self.pos += 1
        else:
            pos, _ = self.next(EntryKind.PATCH, name)
            now = self.rt.clock.time()
            self.record(Entry(pos, EntryKind.PATCH, name, EntryStatus.OK, started_at=now, finished_at=now))
            taken = True
        self.patches[name] = taken
        return taken

    def deprecate_patch(self, name: str) -> None:
        """Step over the marker of patch ``name`` where runs recorded it; record nothing."""
        entry = self.history.get(self.pos)
        if entry is not None and entry.kind == EntryKind.PATCH and entry.name == name:
            self.pos += 1
        self.patches[name] = True

    def publish(self, values: dict[str, Any]) -> None:
        """Merge ``values`` into the published state and write it, unless this is a replay
        of positions the journal has (the earlier run published them already)."""
        self.published.update(values)
        if self.replay_only or self.pos < self.history_end:
            return
        self.live()
        data = self.encode(self.published, "the published state")
        if data == self.stored_published:
            return  # what the run before this one published last, at this same point
        self.journal(self.rt.journal.publish, self.claim.id, self.token, data)
        self.stored_published = data

    # -- the whole run ---------------------------------------------------------

    def call_workflow(self, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Call the workflow function: a ``def`` in this thread, an ``async def`` on a loop of
        its own (watched by the loop watchdog as a whole)."""
        from foundry.deliver.workflow.context import AsyncWorkflowContext, WorkflowContext

        fn = self.spec.fn
        if not inspect.iscoroutinefunction(fn):
            return fn(WorkflowContext(self), *args, **kwargs)
        work = fn(AsyncWorkflowContext(self), *args, **kwargs)
        threshold = self.rt.watchdog
        if threshold is not None:
            target = Target(self.claim.name, fn, self.spec.traits)
            work = watching(
                work, threshold=threshold, registry=self.rt.metrics, name="workflow", units=[target]
            )
        return run_coroutine(work)

    def execute(self) -> Outcome | None:
        """Run (or resume) the workflow; the outcome, or ``None`` when it was parked,
        handed back, or taken over."""
        rt = self.rt
        try:
            if not self.claim.fresh:
                state, entries = self.journal(rt.journal.load, self.claim.id)
                self.load(entries)
                self.stored_published = state.published
            try:
                args, kwargs = rt.decode_args(self.claim, self.spec)
            except RecordError as exc:  # refused, not decoded: the run fails with the reason
                return self._finish_failed(exc, compensation="")
            failure: Exception
            try:
                value = self.call_workflow(args, kwargs)
            except _Control:
                raise
            except NonDeterminismError as exc:
                return self._finish_failed(exc, compensation="")
            except Exception as exc:
                failure = exc
            else:
                ended = self._returned(value)
                if isinstance(ended, Outcome):
                    return ended
                failure = ended
            if self.has_children:
                self._cancel_children()
            try:
                compensation = self._compensate()
            except NonDeterminismError as exc:
                return self._finish_failed(exc, compensation="partial")
            status = _status_of(failure)
            self.journal(
                rt.journal.finish,
                self.claim.id,
                self.token,
                status,
                error=self.encode_error(failure),
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
        except _SetAside as bad:
            error = bad.error
            if isinstance(error, MalformedRecordError):
                return self.set_aside(error, set_aside_error(error))
            return self.set_aside(error, self.encode_error(error))

    def _returned(self, value: Any) -> Outcome | Exception:
        """The workflow function returned ``value``: its outcome, or the failure that ends
        it instead (a cancellation or a deadline recorded at the end, or code that no
        longer matches the journal)."""
        tail = self.history.get(self.pos)
        if tail is not None and tail.kind == EntryKind.CANCEL:  # cancelled as it returned
            self.pos += 1
            return CancelledError(f"{self.where(self.pos - 1)}: the workflow was cancelled")
        if tail is not None and tail.kind == EntryKind.TIMEOUT:
            self.pos += 1
            return self.timeout_error(self.pos - 1)
        if tail is not None or any(p > self.pos for p in self.history):
            later = tail or self.history[min(p for p in self.history if p > self.pos)]
            return self._finish_failed(
                NonDeterminismError(
                    f"{self.where(self.pos)}: the code returned, but the journal recorded "
                    f"{later.kind} {later.name!r} at position {later.position}. The workflow's code "
                    "changed since this run was journaled. Fix: keep the old path behind "
                    "`if wf.patched(...)`, deploy the code that started it, or cancel it and start a "
                    "new workflow"
                ),
                compensation="",
            )
        if self.expired():  # it came back too late: the deadline wins, as a cancel does
            pos = self.pos
            self.pos += 1
            try:
                self._timeout_at(pos, EntryKind.TIMEOUT, "return")
            except WorkflowTimeoutError as exc:
                return exc
        try:
            data = self.encode(value, "the workflow's result", payloads_for(self.spec.name, self.spec.fn))
        except SubmitError as exc:
            return exc
        outcome = self._succeed(data)
        if outcome is not None:
            return outcome
        return CancelledError(f"{self.where(self.pos - 1)}: the workflow was cancelled")

    def set_aside(self, error: Exception, record: bytes) -> Outcome | None:
        """End this run failed with the error ``record`` (of ``error``) and no
        compensation: what it read in the journal is malformed, or the runtime failed on
        it. ``None`` when the journal would not take even that (the lease then lapses)."""
        try:
            self.journal(
                self.rt.journal.finish,
                self.claim.id,
                self.token,
                WorkflowStatus.FAILED,
                error=record,
                compensation="",
            )
        except _Control:
            return None
        self.rt.count_outcome(self.claim.name, WorkflowStatus.FAILED)
        return Outcome(error=error)

    def _succeed(self, data: bytes) -> Outcome | None:
        """Record success; ``None`` when a cancellation won the race (a cancel entry is
        then recorded at the end so a resumed run compensates too)."""
        rt = self.rt
        if self.journal(rt.journal.finish, self.claim.id, self.token, WorkflowStatus.SUCCEEDED, result=data):
            rt.count_outcome(self.claim.name, WorkflowStatus.SUCCEEDED)
            value = self.codec.decode(data)  # (what every later reader gets: the journal's copy)
            types = payloads_for(self.spec.name, self.spec.fn)
            return Outcome(value=types.load_result(value, what=f"the result of workflow run {self.claim.id}"))
        self.cancel_requested = True
        pos = self.pos
        self.pos += 1
        now = rt.clock.time()
        self.record(Entry(pos, EntryKind.CANCEL, "return", EntryStatus.OK, started_at=now, finished_at=now))
        return None

    def _finish_failed(self, exc: Exception, *, compensation: str) -> Outcome:
        self.journal(
            self.rt.journal.finish,
            self.claim.id,
            self.token,
            WorkflowStatus.FAILED,
            error=self.encode_error(exc),
            compensation=compensation,
        )
        self.rt.count_outcome(self.claim.name, WorkflowStatus.FAILED)
        return Outcome(error=exc)

    def _cancel_children(self) -> None:
        """A parent that ends without success leaves no child running: each unfinished one
        is asked to cancel (it compensates itself)."""
        j = self.rt.journal
        for child in self.journal(j.workflows, parent_id=self.claim.id, limit=100_000):
            if not child.status.finished and not child.cancel_requested:
                self.journal(j.request_cancel, child.id)

    # -- compensation ----------------------------------------------------------

    def _compensate(self) -> str:
        """Undo every completed step in reverse order, each journaled at the next
        position. Returns "" (nothing to undo), "done", or "partial" (an undo failed)."""
        if not self.completed:
            return ""
        rt = self.rt
        if self.claim.status != WorkflowStatus.COMPENSATING and not self.replay_only:
            self.journal(rt.journal.set_compensating, self.claim.id, self.token)
        state = "done"
        for done in reversed(self.completed):
            pos = self.pos
            self.pos += 1
            entry = self.history.get(pos)
            if entry is not None:
                if entry.kind != EntryKind.UNDO or entry.name != done.name or entry.ref != done.position:
                    raise NonDeterminismError(
                        f"{self.where(pos)}: compensation now undoes step {done.position} with "
                        f"{done.name!r}, but the journal recorded {entry.kind} {entry.name!r} "
                        f"(ref {entry.ref}) there. Fix: deploy the code that started this workflow"
                    )
                if entry.status == EntryStatus.ERROR:
                    state = "partial"
                if entry.final:
                    continue
            if self.replay_only:
                raise _EndOfHistory()
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
                    invoke_sync(
                        Invoke(StepCall(done.undo, (done.result,), done.name), None, f"undo {done.name!r}"),
                        rt,
                    )
                    self.record(self._undo_entry(pos, done, EntryStatus.OK, attempts, started, None))
                rt.count_compensation(self.claim.name)
                return True
            except _Control:
                raise
            except Exception as exc:
                if attempts > done.retries:
                    self.record(self._undo_entry(pos, done, EntryStatus.ERROR, attempts, started, exc))
                    rt.count_step(self.claim.name, "undo_failed")
                    return False
                policy = done.call.backoff
                delay = (
                    Backoff(policy.base, min(policy.cap, _UNDO_BACKOFF_CAP), owner=self.claim.name).delay(
                        attempts
                    )
                    if isinstance(policy, Backoff)
                    else done.call.delay(attempts)
                )
                clock.sleep(min(delay, rt.inline_wait))
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
            error=None if exc is None else self.encode_error(exc),
            attempts=attempts,
            started_at=started,
            finished_at=self.rt.clock.time(),
            ref=done.position,
            detail="transactional" if done.transactional else None,
        )


def _types_of(fn: Callable[..., Any], name: str) -> Payloads:
    """The annotations of a step's code ``fn`` (a unit's function, or the plain function)."""
    code = getattr(fn, "fn", fn)
    return payloads_for(name, code if callable(code) else fn)


class _Label:
    """``the result of step 'name' (workflow … at position n)``: the words an error about a
    value names it by, written out only when an error message is (most steps raise none,
    and two f-strings per step are a share of a no-op step)."""

    __slots__ = ("kind", "lead", "name", "pos", "run")

    def __init__(self, lead: str, kind: str, name: str, run: Run, pos: int) -> None:
        self.lead = lead
        self.kind = kind
        self.name = name
        self.run = run
        self.pos = pos

    def __str__(self) -> str:
        return f"{self.lead}{self.kind} {self.name!r} ({self.run.where(self.pos)})"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def _status_of(failure: BaseException) -> WorkflowStatus:
    if isinstance(failure, CancelledError):
        return WorkflowStatus.CANCELLED
    if isinstance(failure, WorkflowTimeoutError):
        return WorkflowStatus.TIMED_OUT
    return WorkflowStatus.FAILED
