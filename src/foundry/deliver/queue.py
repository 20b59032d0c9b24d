"""The durable queue delivery model: submit persists a job; a worker anywhere runs it.

``make_runner(spec, ctx)`` is the route ``foundry.app`` takes for units whose decision's
delivery is ``queue``. ``submit`` encodes the arguments with the unit's codec (JSON
unless it declared ``codec="pickle"``), refuses payloads over ``max_payload``, derives
the idempotency key (given as ``unit.options(key=...)``, or a hash of the unit and its
arguments when the unit is ``idempotent=True``), enqueues, and returns a
:class:`~foundry.handle.Handle` whose source reads the job from the store — so
``result()`` works in any process (:func:`handle_for` rebuilds a handle from an id).
The :class:`~foundry.deliver.worker.Worker` runs the jobs. See ``docs/queue.md``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, TypeVar

from foundry.backends.queue import (
    Enqueued,
    JobState,
    JobStatus,
    NewJob,
    QueueBackend,
    open_queue_backend,
)
from foundry.errors import (
    BackendUnavailableError,
    CancelledError,
    DeadLetteredError,
    NotFoundError,
    OverloadError,
    PayloadTooLargeError,
    RecordError,
    SubmitError,
)
from foundry.handle import Handle, Outcome, Status
from foundry.observe import names
from foundry.observe.metrics import Registry
from foundry.observe.tracing import decision_attributes, messaging_system
from foundry.outage import ride_outage
from foundry.payload import DEFAULT_MAX_PAYLOAD
from foundry.retry import Backoff
from foundry.runtime import RuntimeContext, SubmitOptions, UnitSpec
from foundry.serialize import ErrorTypes, declared_codec, decode_error, get_codec
from foundry.typed import payloads_for

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "DEFAULT_QUEUE",
    "JobSource",
    "QueueRunner",
    "QueueRuntime",
    "close_handles",
    "handle_for",
    "make_runner",
    "queue_of",
    "runtime_for",
]

DEFAULT_QUEUE = "default"
_WAIT_SLICE = 30.0  # a wait "forever" is many bounded waits on the store
_SUBMIT_RETRY = 10.0  # seconds submit() keeps trying a store that is briefly unreachable
_OUTAGE = Backoff(0.05, 1.0, jitter="none", owner="the queue's store")  # pauses while it is down
_MANY = 500  # jobs per transaction in submit_many
T = TypeVar("T")

_STATUS = {
    JobStatus.QUEUED: Status.QUEUED,
    JobStatus.RUNNING: Status.RUNNING,
    JobStatus.SUCCEEDED: Status.SUCCEEDED,
    JobStatus.FAILED: Status.FAILED,
    JobStatus.DEAD: Status.FAILED,
    JobStatus.CANCELLED: Status.CANCELLED,
}
FINISHED = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.DEAD, JobStatus.CANCELLED})


def queue_of(spec: UnitSpec) -> str:
    """The queue a unit's jobs go to."""
    return spec.traits.queue or DEFAULT_QUEUE


def outcome_of(state: JobState, spec: UnitSpec | None = None, errors: ErrorTypes | None = None) -> Outcome:
    """How a finished job ended, as the submitter sees it (the original exception type
    when the allow-list admits it, :class:`DeadLetteredError` with the reason for dead
    letters).

    ``spec`` is this process's declaration of the job's unit: its result is decoded with
    the codec *declared* there (JSON when the unit is not declared here), never with the
    codec the record names, and its error records are rebuilt with the unit's allow-list
    (``errors`` when the unit is not declared here). A record that disagrees is a
    :class:`~foundry.errors.RecordError` outcome, not decoded."""
    declared = spec.traits.codec if spec is not None else "json"
    allowed = spec.errors if spec is not None else errors
    if state.status is JobStatus.SUCCEEDED:
        if state.result is None:
            return Outcome(value=None)
        what = f"the result of job {state.id}"
        try:
            codec = declared_codec(declared, state.codec, unit=state.unit, what=what)
        except RecordError as exc:
            if spec is None and state.codec == "pickle":
                exc.add_note(
                    f"unit {state.unit!r} is not declared in this process, so nothing says it may use "
                    "pickle. Fix: read the job from an app that declares the unit"
                )
            return Outcome(error=exc)
        try:
            value = codec.decode(state.result)
            if spec is not None and codec.name == "json":
                value = payloads_for(spec.name, spec.fn).load_result(value, what=what)
            return Outcome(value=value)
        except RecordError as exc:
            return Outcome(error=exc)
        except Exception as exc:
            return Outcome(
                error=RecordError(
                    f"unit {state.unit!r}: {what} is not valid {codec.name} ({type(exc).__name__}: "
                    f"{str(exc)[:200]}); it was written by another program or damaged in the store. "
                    f"Fix: inspect it with `foundry jobs show {state.id}`"
                )
            )
    if state.status is JobStatus.CANCELLED:
        how = "before it ran" if state.deliveries == 0 else "while it ran; it was stopped and not retried"
        return Outcome(error=CancelledError(f"unit {state.unit!r}: job {state.id} was cancelled {how}"))
    if state.status is JobStatus.DEAD:
        return Outcome(error=DeadLetteredError(state.id, state.dead_reason or "no reason recorded"))
    record: Any = {}
    if state.error:
        try:
            record = json.loads(state.error)
        except (ValueError, RecursionError):
            record = {"type": "RemoteError", "message": state.error.decode(errors="replace")[:10_000]}
    return Outcome(error=decode_error(record or {"type": "RemoteError", "message": "failed"}, allowed))


class JobSource:
    """A :class:`~foundry.handle.Source` over a job in the store (any process can hold one).

    ``spec`` is this process's declaration of the unit (``None``: not declared here):
    what the job's record is decoded and checked against (:func:`outcome_of`)."""

    __slots__ = ("_backend", "_errors", "_final", "_outcome", "_spec", "id", "unit")

    def __init__(
        self,
        backend: QueueBackend,
        job_id: str,
        unit: str,
        spec: UnitSpec | None = None,
        errors: ErrorTypes | None = None,
    ) -> None:
        self._backend = backend
        self.id = job_id
        self.unit = unit
        self._spec = spec
        self._errors = errors
        self._final: JobState | None = None
        self._outcome: Outcome | None = None

    def _state(self) -> JobState:
        if self._final is not None:
            return self._final
        state = self._backend.get(self.id)
        if state is None:
            raise NotFoundError(
                f"unit {self.unit!r}: job {self.id} is not in queue {self._backend.url} (never submitted "
                "there, or purged after its result_ttl: a finished job is kept for its unit's result_ttl=, "
                "7 days by default). Fix: check the id and the queue URL, or declare a longer result_ttl="
            )
        if state.status in FINISHED:
            self._final = state
        return state

    def status(self) -> Status:
        return _STATUS[self._state().status]

    def wait(self, timeout: float | None) -> bool:
        if self._final is not None:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:  # a broker restart: keep waiting within the timeout
                state = ride_outage(
                    lambda: self._backend.wait(self.id, _slice(deadline)),
                    within=None if deadline is None else deadline - time.monotonic(),
                    policy=_OUTAGE,
                )
            except BackendUnavailableError:
                return False
            if state is None:
                self._state()  # raises NotFoundError
            elif state.status in FINISHED:
                self._final = state
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    async def wait_async(self, timeout: float | None) -> bool:
        return await asyncio.to_thread(self.wait, timeout)

    def outcome(self) -> Outcome:
        if self._outcome is not None:
            return self._outcome
        state = self._state()
        if state.unit != self.unit:
            return Outcome(
                error=RecordError(
                    f"unit {self.unit!r}: job {self.id}'s record in the store now names unit {state.unit!r}; "
                    "it was not decoded (a job id belongs to one unit: the record was rewritten). "
                    "Fix: check who can write to the store (docs/security.md)"
                )
            )
        outcome = outcome_of(state, self._spec, self._errors)
        if self._final is not None:  # finished: keep the decoded outcome, not the bytes it came from
            self._outcome = outcome
            self._final = replace(state, result=None, payload=None)
        return outcome

    def cancel(self) -> bool:
        """Cancel the job: at once while it is queued; while it runs, a request its worker
        acts on (the job then ends cancelled). ``False`` when it had finished already."""
        if not self._backend.cancel(self.id).accepted:
            return False
        self._final = None
        self._outcome = None
        self._state()
        return True


class QueueRuntime:
    """One backend per app per process, shared by its runners and workers."""

    def __init__(self, backend: QueueBackend, metrics: Registry, *, own: bool = True) -> None:
        self.backend = backend
        self.metrics = metrics
        self._own = own
        self._lock = threading.Lock()
        self._watched: dict[str, Callable[[], None]] = {}
        self.refs = 0

    def watch(self, queue: str) -> None:
        """Publish the queue's depth and oldest age as collected gauges (read on demand)."""
        with self._lock:
            if queue in self._watched:
                return

            def depth() -> list[tuple[dict[str, str], float]]:
                return [({"queue": queue}, float(self.backend.stats(queue).depth))]

            def age() -> list[tuple[dict[str, str], float]]:
                return [({"queue": queue}, self.backend.stats(queue).oldest_age)]

            undo_depth = self.metrics.collect(names.QUEUE_DEPTH, "jobs claimable now", depth)
            undo_age = self.metrics.collect(
                names.QUEUE_OLDEST_AGE, "seconds the oldest claimable job has waited", age
            )

            def undo() -> None:
                undo_depth()
                undo_age()

            self._watched[queue] = undo

    def close(self) -> None:
        with self._lock:
            undo, self._watched = list(self._watched.values()), {}
        for fn in undo:
            fn()
        if self._own:
            self.backend.close()


_SHARED: dict[tuple[int, str], QueueRuntime] = {}
_SHARED_LOCK = threading.Lock()


def runtime_for(ctx: RuntimeContext, url: str | None = None) -> QueueRuntime:
    """The app's shared queue runtime on ``url`` (default: the app's queue URL); each call
    takes a reference that :func:`release_runtime` gives back."""
    target = url or ctx.settings.queue
    key = (id(ctx.metrics), target)
    with _SHARED_LOCK:
        rt = _SHARED.get(key)
        if rt is None:
            backend = open_queue_backend(target, home=ctx.settings.home)
            rt = _SHARED[key] = QueueRuntime(backend, ctx.metrics)
        rt.refs += 1
        return rt


def release_runtime(rt: QueueRuntime) -> None:
    with _SHARED_LOCK:
        rt.refs -= 1
        if rt.refs > 0:
            return
        for key, value in list(_SHARED.items()):
            if value is rt:
                del _SHARED[key]
    rt.close()


def derived_key(unit: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The idempotency key of an ``idempotent=True`` unit: a hash of the unit and its arguments."""
    try:
        canonical = json.dumps(
            [unit, list(args), kwargs], sort_keys=True, separators=(",", ":"), default=repr
        )
    except (TypeError, ValueError):
        canonical = repr((unit, args, sorted(kwargs.items())))
    return f"{unit}:auto:{hashlib.sha256(canonical.encode()).hexdigest()}"


class QueueRunner:
    """The :class:`~foundry.runtime.Runner` of one queue-delivered unit."""

    def __init__(self, spec: UnitSpec, ctx: RuntimeContext, *, max_deliveries: int = 5) -> None:
        self.spec = spec
        self.queue = queue_of(spec)
        self.codec = get_codec(spec.traits.codec)
        self.types = payloads_for(spec.name, spec.fn)  # its annotations: checked at submit (foundry.typed)
        self.max_payload = spec.traits.max_payload or DEFAULT_MAX_PAYLOAD
        self.max_deliveries = max_deliveries
        self.runtime = runtime_for(ctx)
        self.backend = self.runtime.backend
        self.runtime.watch(self.queue)
        self._closed = False
        self._depth_checked = 0.0
        self._depth = 0
        self._tracing = ctx.tracing
        self._span_attributes: dict[str, Any] | None = None  # made with the first traced submit

    def _payload(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        name = self.spec.name
        args_data, kwargs_data = self.types.dump_call(args, kwargs, convert=self.codec.name == "json")
        payload = self.codec.encode({"args": args_data, "kwargs": kwargs_data}, unit=name, what="arguments")
        if len(payload) > self.max_payload:
            raise PayloadTooLargeError(
                f"unit {name!r}: the encoded arguments are {len(payload)} bytes, over max_payload="
                f"{self.max_payload} bytes; nothing was enqueued. Fix: pass a reference (a path, URL or "
                "row id) instead of the data, or declare a larger max_payload= on the unit"
            )
        return payload

    def _check_intake(self) -> None:
        bound = self.spec.traits.max_pending
        if bound is None:
            return
        deadline = time.monotonic() + 30.0
        while True:
            now = time.monotonic()
            if now - self._depth_checked > 0.1:
                stats = self.backend.stats(self.queue)
                self._depth, self._depth_checked = stats.depth + stats.scheduled, now
            if self._depth < bound:
                return
            if self.spec.traits.overflow == "reject" or now > deadline:
                raise OverloadError(
                    f"unit {self.spec.name!r}: queue {self.queue!r} holds {self._depth} jobs, at max_pending="
                    f"{bound}; the job was not enqueued. Fix: add workers, or raise max_pending"
                )
            time.sleep(0.05)

    def submit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        tracer = self._tracing.tracer()
        if tracer is None:
            return self._submit(self._new_job(args, kwargs, options))
        with tracer.send(f"send {self.spec.name}", self._send_attributes()) as (span, trace):
            job = self._new_job(args, kwargs, options, trace)
            span.set_attribute("messaging.message.id", job.id)
            return self._submit(job)

    def _submit(self, job: NewJob) -> Handle:
        self._check_intake()
        done = self._enqueue(job)
        return Handle(done.id, self.spec.name, JobSource(self.backend, done.id, self.spec.name, self.spec))

    def _send_attributes(self) -> dict[str, Any]:
        """The attributes of this unit's send spans (``docs/tracing.md``)."""
        if self._span_attributes is None:
            self._span_attributes = {
                **decision_attributes(self.spec.name, self.spec.decision),
                "messaging.system": messaging_system(self.backend.url),
                "messaging.destination.name": self.queue,
                "messaging.operation": "publish",
                "messaging.operation.type": "send",
            }
        return self._span_attributes

    def enqueue_keyed(self, args: tuple[Any, ...], kwargs: dict[str, Any], key: str) -> Enqueued:
        """Enqueue one job under idempotency ``key`` (stored as ``<unit>:<key>``) and say
        whether this call created it (``created=False``: the key names a job already).
        Never waits for room: at ``max_pending`` it raises :class:`OverloadError` at once.
        A scheduler's tick (``foundry.deliver.scheduler``)."""
        tracer = self._tracing.tracer()
        job = self._new_job(
            args, kwargs, SubmitOptions(key=key), None if tracer is None else tracer.current()
        )
        bound = self.spec.traits.max_pending
        if bound is not None:
            stats = self.backend.stats(self.queue)
            if stats.depth + stats.scheduled >= bound:
                raise OverloadError(
                    f"unit {self.spec.name!r}: queue {self.queue!r} holds {stats.depth + stats.scheduled} "
                    f"jobs, at max_pending={bound}; job {key!r} was not enqueued. Fix: add workers, or raise "
                    "max_pending"
                )
        return self._enqueue(job)

    def submit_many(
        self, calls: Iterable[tuple[tuple[Any, ...], dict[str, Any]]], options: SubmitOptions
    ) -> list[Handle]:
        """Enqueue many calls, ``_MANY`` per transaction (and per batch of broker
        messages): what a loop of :meth:`submit` pays per job, this pays per chunk. Each
        chunk is all-or-nothing: a bad item raises with the earlier chunks in and none of
        its own chunk. With ``max_pending`` the chunk is no larger than the bound, so the
        queue holds at most twice the bound."""
        tracer = self._tracing.tracer()
        if tracer is None:
            return self._submit_many(calls, options, None)
        with tracer.send(f"send {self.spec.name}", self._send_attributes()) as (span, trace):
            handles = self._submit_many(calls, options, trace)
            span.set_attribute("messaging.batch.message_count", len(handles))
            return handles

    def _submit_many(
        self,
        calls: Iterable[tuple[tuple[Any, ...], dict[str, Any]]],
        options: SubmitOptions,
        trace: str | None,
    ) -> list[Handle]:
        name = self.spec.name
        size = min(_MANY, self.spec.traits.max_pending or _MANY)
        handles: list[Handle] = []
        chunk: list[NewJob] = []
        for args, kwargs in calls:
            chunk.append(self._new_job(args, kwargs, options, trace))
            if len(chunk) == size:
                handles.extend(self._enqueue_chunk(chunk, name))
                chunk = []
        if chunk:
            handles.extend(self._enqueue_chunk(chunk, name))
        return handles

    def _enqueue_chunk(self, chunk: list[NewJob], name: str) -> list[Handle]:
        self._check_intake()
        done = self._retrying(lambda: self.backend.enqueue_many(chunk))
        return [Handle(d.id, name, JobSource(self.backend, d.id, name, self.spec)) for d in done]

    def _new_job(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions, trace: str | None = None
    ) -> NewJob:
        if self._closed:
            raise SubmitError(
                f"unit {self.spec.name!r}: its runner is closed. Fix: submit before app.close()"
            )
        name, traits = self.spec.name, self.spec.traits
        payload = self._payload(args, kwargs)
        if options.key is not None:
            key: str | None = f"{name}:{options.key}"
        elif traits.idempotent:
            key = derived_key(name, args, kwargs)
        else:
            key = None
        if options.eta is not None and options.delay is not None:
            raise SubmitError(f"unit {name!r}: give delay= or eta=, not both. Fix: keep one of them")
        eta = options.eta if options.eta is not None else None
        if options.delay is not None:
            eta = time.time() + options.delay
        return NewJob(
            id=uuid.uuid4().hex,
            queue=self.queue,
            unit=name,
            payload=payload,
            codec=self.codec.name,
            key=key,
            priority=options.priority,
            eta=eta,
            max_retries=traits.retries,
            max_deliveries=self.max_deliveries,
            timeout=options.timeout if options.timeout is not None else traits.timeout,
            trace=trace,
            **({} if traits.result_ttl is None else {"result_ttl": traits.result_ttl}),
        )

    def _enqueue(self, job: NewJob) -> Enqueued:
        return self._retrying(lambda: self.backend.enqueue(job))

    @staticmethod
    def _retrying(enqueue: Callable[[], T]) -> T:
        """Enqueue, retrying a store that is briefly unreachable (a restart) for up to
        ``_SUBMIT_RETRY`` seconds. Safe: a retry carries the same job ids, so a first
        attempt whose commit did happen is found, not duplicated."""
        return ride_outage(enqueue, within=_SUBMIT_RETRY, policy=_OUTAGE)

    async def asubmit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        return await asyncio.to_thread(self.submit, args, kwargs, options)

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Submit and wait for the result (a worker must be running somewhere)."""
        return self.submit(args, kwargs, SubmitOptions()).result()

    def close(self, timeout: float = 10.0) -> None:
        if not self._closed:
            self._closed = True
            release_runtime(self.runtime)


def make_runner(spec: UnitSpec, ctx: RuntimeContext) -> QueueRunner:
    return QueueRunner(spec, ctx)


def _slice(deadline: float | None) -> float:
    """How long one wait on the store may block: a slice, never past ``deadline``."""
    return _WAIT_SLICE if deadline is None else max(0.0, min(_WAIT_SLICE, deadline - time.monotonic()))


_HANDLE_RUNTIMES: dict[tuple[int, str], QueueRuntime] = {}


def handle_for(ctx: RuntimeContext, job_id: str, *, url: str | None = None) -> Handle:
    """A handle on job ``job_id`` of the app's queue (or the queue at ``url``), whoever
    submitted it (``app.job(job_id)``). The connection it opens is given back when the app
    closes (registered in ``ctx.closers``)."""
    key = (id(ctx.metrics), url or ctx.settings.queue)
    ctx.closers.add("foundry.deliver.queue handles", lambda: close_handles(ctx))
    with _SHARED_LOCK:
        rt = _HANDLE_RUNTIMES.get(key)
    if rt is None:
        rt = runtime_for(ctx, url)
        with _SHARED_LOCK:
            kept = _HANDLE_RUNTIMES.setdefault(key, rt)
        if kept is not rt:
            release_runtime(rt)
            rt = kept
    state = rt.backend.get(job_id)
    if state is None:
        raise NotFoundError(
            f"no job {job_id!r} in queue {rt.backend.url} (never submitted there, or purged after its "
            "result_ttl: a finished job is kept for its unit's result_ttl=, 7 days by default). Fix: check "
            "the id, and that this process uses the submitter's queue URL, or declare a longer result_ttl="
        )
    try:
        spec: UnitSpec | None = ctx.lookup(state.unit)
    except (NotFoundError, KeyError, AttributeError):
        spec = None  # not declared here: its result is read as JSON, its errors by the app's list
    return Handle(job_id, state.unit, JobSource(rt.backend, job_id, state.unit, spec, ctx.errors))


def close_handles(ctx: RuntimeContext) -> None:
    """Give back the runtimes :func:`handle_for` opened for the app of ``ctx``."""
    mine = id(ctx.metrics)
    with _SHARED_LOCK:
        taken = [key for key in _HANDLE_RUNTIMES if key[0] == mine]
        runtimes = [_HANDLE_RUNTIMES.pop(key) for key in taken]
    for rt in runtimes:
        release_runtime(rt)
