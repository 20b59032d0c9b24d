"""The runner of a ``pool`` unit: deadlines, a bounded intake, and explicit loss.

Each submission becomes one *request* with an id, an idempotency key
(``unit.options(key=...)`` or the request id) and a deadline (``deadline=`` per call or
per unit; 30 s when neither says). The request's attempts go through the unit's engine
(``foundry.backends.pool``); what comes back decides the handle's outcome:

=============  ======================================================================
worker answer  the value, or the exception the function raised (its own type when it
               can be rebuilt here, else :class:`~foundry.errors.RemoteError`)
``LOST``       idempotent unit: a new attempt, same key, on another worker, while
               attempts and deadline last; otherwise :class:`WorkerLostError` ("the
               work may or may not have happened")
``NO_WORKER``  :class:`NoWorkerError` at once (nothing ran)
``DEADLINE``   :class:`DeadlineExceededError` (nothing ran: no worker was free)
``OVERLOAD``   :class:`~foundry.errors.OverloadError` (nothing ran: the pool's waiting
               line is full)
=============  ======================================================================

``handle.cancel()`` takes back a request that no worker has taken yet (it waits in the
embedded or served pool's line): ``True``, and the handle raises
:class:`~foundry.errors.CancelledError`. A request a worker holds, or one already handed
to NATS, cannot be recalled: ``False``, and it runs to its answer.

The intake is bounded: at most ``max_pending`` requests (default 1024) are unanswered
at once; one more is refused with :class:`~foundry.errors.OverloadError` at once,
never queued without limit, whatever ``overflow=`` says (a pool does not block its
callers: the deadline is the only wait).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import Any

from foundry.backends.pool import EngineSpec, PoolEngine, Reply, Sizable, engine_name, open_pool_engine
from foundry.backends.pool.base import CANCELLED, DEADLINE, ERROR, LOST, NO_WORKER, OK, OVERLOAD, Attempt
from foundry.deliver.pool.controller import Controller
from foundry.deliver.pool.metrics import PoolMetrics
from foundry.errors import (
    CancelledError,
    DeadlineExceededError,
    NoWorkerError,
    OverloadError,
    PoolError,
    SubmitError,
    WorkerLostError,
)
from foundry.handle import FutureSource, Handle, new_id
from foundry.runtime import RuntimeContext, SubmitOptions, UnitSpec
from foundry.serialize import decode_error, get_codec

__all__ = ["DEFAULT_DEADLINE", "DEFAULT_INTAKE", "PoolRunner", "attempts_for"]

log = logging.getLogger("foundry.pool")

DEFAULT_DEADLINE = 30.0
DEFAULT_INTAKE = 1024
IDEMPOTENT_RETRIES = 2  # extra attempts of an idempotent unit that declared no retries=


def attempts_for(spec: UnitSpec) -> int:
    """How many workers one request may be handed to: one unless the unit is idempotent."""
    if not spec.traits.idempotent:
        return 1
    return 1 + (spec.traits.retries or IDEMPOTENT_RETRIES)


class _Source(FutureSource):
    """A pool request's handle source: ``cancel`` asks the engine to take it back."""

    __slots__ = ("_cancel",)

    def __init__(self, cancel: Any) -> None:
        super().__init__()
        self.future.set_running_or_notify_cancel()  # the engine decides what can be recalled
        self._cancel = cancel

    def cancel(self) -> bool:
        if self.future.done():
            return False
        return bool(self._cancel())


class _Request:
    __slots__ = ("attempts", "deadline", "future", "id", "key", "number", "payload", "started", "timeout")

    def __init__(
        self, id: str, key: str, payload: bytes, deadline: float, timeout: float, cancel: Any
    ) -> None:
        self.id = id
        self.key = key
        self.payload = payload
        self.deadline = deadline  # monotonic
        self.timeout = timeout  # per attempt
        self.number = 0
        self.attempts: list[str] = []  # what happened to each earlier attempt
        self.started = time.monotonic()
        self.future = _Source(cancel)


class PoolRunner:
    """Runs one ``pool`` unit on its engine (module docstring)."""

    def __init__(self, spec: UnitSpec, ctx: RuntimeContext) -> None:
        self.spec = spec
        self.ctx = ctx
        traits = spec.traits
        self.url = ctx.settings.pool
        self.codec = get_codec(traits.codec)
        self.deadline = traits.deadline or DEFAULT_DEADLINE
        self.timeout = traits.timeout
        self.intake = traits.max_pending or DEFAULT_INTAKE
        self.max_attempts = attempts_for(spec)
        self.min_workers, self.max_workers = worker_bounds(spec)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._open = 0
        self._closed = False
        self._engine: PoolEngine | None = None
        self._controller: Controller | None = None
        self.metrics = PoolMetrics(ctx.metrics, spec.name, self._stats, lambda: self._open)

    # -- the engine, made on first use ----------------------------------------------------

    @property
    def engine(self) -> PoolEngine:
        engine = self._engine
        if engine is not None:
            return engine
        with self._lock:
            if self._engine is None:
                if self._closed:
                    raise PoolError(
                        self.spec.name,
                        "",
                        "",
                        0,
                        f"unit {self.spec.name!r}: its pool is closed. Fix: use a new app",
                    )
                check_importable(self.spec, self.url)
                spec = EngineSpec(
                    app=self.ctx.app_name,
                    unit=self.spec.name,
                    codec=self.spec.traits.codec,
                    module=self.spec.module,
                    qualname=self.spec.qualname,
                    workers=self.min_workers,
                    home=str(self.ctx.settings.home),
                )
                self._engine = open_pool_engine(self.url, spec)
                if isinstance(self._engine, Sizable) and self.max_workers > self.min_workers:
                    self._controller = Controller(
                        self.spec.name,
                        self._engine,
                        minimum=self.min_workers,
                        maximum=self.max_workers,
                        target=self.spec.traits.latency,
                        est=self.spec.traits.est,
                        metrics=self.metrics,
                    )
                    self._controller.start()
            return self._engine

    @property
    def controller(self) -> Controller | None:
        return self._controller

    def _stats(self) -> Any:
        engine = self._engine
        return engine.stats() if engine is not None else None

    # -- submitting ----------------------------------------------------------------------

    def submit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        name = self.spec.name
        if options.delay is not None or options.eta is not None or options.priority:
            raise SubmitError(
                f"unit {name!r}: delay, eta and priority need a durable queue; a work pool runs a request "
                "now or refuses it. Fix: declare the unit durable=True, or drop them"
            )
        payload = self.codec.encode([list(args), kwargs], unit=name)
        engine = self.engine
        request_id = new_id("pool")
        budget = options.deadline or self.deadline
        timeout = options.timeout or self.timeout or budget
        request = _Request(
            request_id,
            options.key or request_id,
            payload,
            time.monotonic() + budget,
            timeout,
            lambda: engine.cancel(request_id),
        )
        with self._lock:
            if self._closed:
                raise PoolError(name, request_id, request.key, 0, f"unit {name!r}: its pool is closed")
            if self._open >= self.intake:
                self.metrics.rejected.inc()
                raise OverloadError(
                    f"unit {name!r}: {self._open} requests are already waiting for an answer (max_pending="
                    f"{self.intake}); this one was refused, nothing ran. Fix: retry later, add workers "
                    "(max_workers=), or raise max_pending= if the latency that costs is acceptable"
                )
            self._open += 1
        self.metrics.arrived()
        self._attempt(engine, request)
        return Handle(request_id, name, request.future)

    async def asubmit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        return self.submit(args, kwargs, options)  # never blocks: a full intake refuses at once

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.submit(args, kwargs, _NO_OPTIONS).result()

    def _attempt(self, engine: PoolEngine, request: _Request) -> None:
        request.number += 1
        left = request.deadline - time.monotonic()
        attempt = Attempt(
            request=request.id,
            key=request.key,
            unit=self.spec.name,
            number=request.number,
            body=request.payload,
            codec=self.spec.traits.codec,
            wait=max(0.0, left),
            timeout=max(0.0, min(request.timeout, left)),
        )
        engine.send(attempt, lambda reply: self._answered(engine, request, reply))

    def _answered(self, engine: PoolEngine, request: _Request, reply: Reply) -> None:
        if reply.queued:
            self.metrics.queue_wait.observe(reply.queued)
        if reply.kind == LOST and request.number < self.max_attempts and not self._closed:
            left = request.deadline - time.monotonic()
            if left > 0:
                request.attempts.append(f"attempt {request.number}: {reply.detail}")
                self.metrics.retried.inc()
                log.info(
                    "unit %r: %s lost (%s); retrying with key %r",
                    self.spec.name,
                    request.id,
                    reply.detail,
                    request.key,
                )
                self._attempt(engine, request)
                return
        try:
            outcome = self._outcome(request, reply)
        except Exception as exc:  # a result that does not decode is this request's failure
            outcome = exc
        future = request.future.future
        if future.done():  # answered already (it cannot be twice: answer_once); keep the count right
            log.debug("unit %r: a second outcome for %s was dropped", self.spec.name, request.id)
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
        self.metrics.finished(time.monotonic() - request.started, ok=reply.kind == OK)
        with self._lock:
            self._open -= 1
            if self._open == 0:
                self._idle.notify_all()

    def _outcome(self, request: _Request, reply: Reply) -> Any:
        name = self.spec.name
        if reply.kind == OK:
            return self.codec.decode(reply.body)
        if reply.kind == ERROR:
            return decode_error(json.loads(reply.body))
        history = "; ".join([*request.attempts, f"attempt {request.number}: {reply.detail}"])
        args = (name, request.id, request.key, request.number)
        if reply.kind == NO_WORKER:
            return NoWorkerError(
                *args,
                f"unit {name!r}: no worker serves it ({reply.detail}); request {request.id} did not run. "
                f"Fix: {self._start_hint()}",
            )
        if reply.kind == CANCELLED:
            return CancelledError(
                f"unit {name!r}: request {request.id} was cancelled before a worker took it; it did not run"
            )
        if reply.kind == OVERLOAD:
            self.metrics.rejected.inc()
            return OverloadError(
                f"unit {name!r}: the pool refused request {request.id}: {reply.detail}; it did not run. "
                "Fix: retry later, add workers (max_workers=, or another `foundry pool serve`), or lower "
                "the load"
            )
        if reply.kind == DEADLINE:
            return DeadlineExceededError(
                *args,
                f"unit {name!r}: no worker was free within the deadline for request {request.id} "
                f"({history}); it did not run. Fix: add workers (max_workers=), lower the load, or give "
                "a longer deadline=",
            )
        self.metrics.lost.inc()
        if request.deadline - time.monotonic() <= 0:
            return DeadlineExceededError(
                *args,
                f"unit {name!r}: no answer for request {request.id} (key {request.key!r}) within its "
                f"deadline ({history}); the work may or may not have happened. Fix: give a longer "
                "deadline=, or make the work faster",
            )
        if self.spec.traits.idempotent:
            return WorkerLostError(
                *args,
                f"unit {name!r}: request {request.id} (key {request.key!r}) lost its worker on every one "
                f"of {request.number} attempts ({history}). Fix: look at why the workers die "
                "(foundry_child_exits_total), or declare more retries=",
            )
        return WorkerLostError(
            *args,
            f"unit {name!r}: the worker running request {request.id} (key {request.key!r}) was lost "
            f"({reply.detail}); the work may or may not have happened, and it was not retried because "
            "the unit is not declared idempotent. Fix: check whether it took effect before running it "
            "again, or declare idempotent=True if running it twice is safe",
        )

    def _start_hint(self) -> str:
        engine = engine_name(self.url)
        if engine == "local":
            return "make the unit's module importable in a fresh process, or raise min_workers="
        if engine == "served":
            return (
                "serve it on this machine: foundry pool serve MODULE:app (with the app's FOUNDRY_HOME), "
                "or use pool=local:// to start workers in the app"
            )
        return f"start workers for it on a host: foundry pool serve MODULE:app --url {self.url}"

    # -- closing -------------------------------------------------------------------------

    def close(self, timeout: float = 10.0) -> None:
        """Refuse new requests, let the open ones finish within ``timeout``, stop the workers."""
        end = time.monotonic() + max(0.0, timeout)
        with self._lock:
            self._closed = True
            while self._open and time.monotonic() < end:
                self._idle.wait(min(0.1, max(0.0, end - time.monotonic())))
            engine, controller = self._engine, self._controller
        if controller is not None:
            controller.stop()
        if engine is not None:
            engine.close(max(0.0, end - time.monotonic()))
        self.metrics.close()


_NO_OPTIONS = SubmitOptions()


def worker_bounds(spec: UnitSpec) -> tuple[int, int]:
    """``(min, max)`` workers: ``workers=N`` pins both; otherwise ``min_workers`` (1) and
    ``max_workers`` (the usable CPUs, at least ``min``)."""
    traits = spec.traits
    if traits.workers is not None:
        return traits.workers, traits.workers
    from foundry.execute.instrument import usable_cpus

    low = traits.min_workers or 1
    high = traits.max_workers or max(low, usable_cpus())
    return low, max(low, high)


def check_importable(spec: UnitSpec, url: str) -> None:
    """A worker finds the function by module and qualified name: refuse at submit time
    what no worker could import."""
    fix = (
        "define the function at the top level of an importable module (not a lambda, not inside "
        "another function, not in `python -c` or an interactive session)"
    )
    module, qualname = spec.module, spec.qualname
    if not module or not qualname or "<" in qualname:
        raise SubmitError(
            f"unit {spec.name!r} runs on pool workers, which find its function by name, but "
            f"{module or '?'}.{qualname or '?'} is a lambda, a closure or nested. Fix: {fix}"
        )
    main = sys.modules.get("__main__")
    if module == "__main__" and getattr(main, "__file__", None) is None:
        raise SubmitError(
            f"unit {spec.name!r}: its function {qualname} lives in a __main__ without a file, so no "
            f"worker can import it. Fix: {fix}"
        )
    if module == "__main__" and engine_name(url) != "local":
        raise SubmitError(
            f"unit {spec.name!r}: its function is in the __main__ script, which served workers "
            f"(pool {url}) do not have. Fix: {fix}, and serve it with `foundry pool serve`"
        )
