"""``Worker``: runs an app's queued jobs, on any machine, as many as you like.

Per queue it keeps ``concurrency`` runner threads and one claimer that leases jobs
while it holds fewer than ``prefetch`` (running + waiting to start; ``prefetch=1``
means one job at a time). One heartbeat thread extends the lease of every job it
holds, so a job runs as long as it needs while its worker lives, and is redelivered
on *its own* lease's lapse when the worker dies. Each job runs on its unit's execution
model: a plain function on a runner thread, a coroutine on the worker's event loop,
an ``isolate=True`` (``processes``) unit on the ``processes`` model's pool of child
processes (``foundry.execute.processes``: a crash or a timeout kills only its child).

Outcomes: success writes the single completion record; a failure is retried with
exponential back-off and jitter while ``retries`` and ``retry_on`` allow, else the job
fails for good (its exception goes to the submitter); an unknown unit, an undecodable
payload or a refused pickle goes to the dead-letter store with the reason.

``stop(grace)`` (SIGTERM in ``foundry worker``): stop claiming, give back the jobs not
started, let running ones finish within ``grace`` seconds, give back the rest for
immediate redelivery. SIGKILL loses nothing: the leases lapse.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from foundry.backends.queue import Claimed, QueueBackend
from foundry.deliver.queue import QueueRuntime, queue_of, release_runtime, runtime_for
from foundry.errors import BackendError, NotFoundError, SubmitError, WorkTimeoutError
from foundry.handle import Handle
from foundry.observe import names
from foundry.runtime import Runner, RuntimeContext, SubmitOptions, UnitSpec
from foundry.serialize import encode_error, get_codec

__all__ = ["JobEvent", "Worker", "backoff_delay"]

log = logging.getLogger("foundry.queue.worker")

T = TypeVar("T")
BATCH_WINDOW = 0.001  # the longest a claim waits for company when jobs trickle in
ACK_WINDOW = 0.003  # ... and an acknowledgement (results show up that much later, commits are fewer)
PURGE_EVERY = 600.0  # seconds between deletions of finished jobs past their result_ttl


class AppLike(Protocol):
    """What a worker needs of an app (``foundry.Foundry`` has it)."""

    @property
    def units(self) -> Mapping[str, Any]: ...

    def context(self) -> RuntimeContext: ...


@dataclass(frozen=True, slots=True)
class JobEvent:
    """What happened to a job in this worker (``Worker(on_event=...)``, the demo, logs)."""

    kind: str  # started | succeeded | retry | failed | dead | released | lost | timeout
    job_id: str
    unit: str
    queue: str
    delivery: int
    attempt: int
    at: float
    detail: str = ""


def backoff_delay(attempt: int, base: float, cap: float) -> float:
    """Delay before retry number ``attempt + 1``: ``base · 2^attempt`` capped at ``cap``,
    with "equal jitter" (uniform in the upper half) so retries of many jobs spread out."""
    delay = min(cap, base * (2.0**attempt))
    return random.uniform(delay / 2.0, delay)


def _matches(retry_on: tuple[type[BaseException] | str, ...], exc: BaseException) -> bool:
    if not retry_on:
        return isinstance(exc, Exception)
    mro = type(exc).__mro__
    for want in retry_on:
        if isinstance(want, type):
            if isinstance(exc, want):
                return True
        elif any(want in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}") for cls in mro):
            return True
    return False


@dataclass(eq=False)
class _Job:
    claimed: Claimed
    queue: _QueueLoop
    lost: bool = False  # its outcome is written or no longer ours to write (released, timed out)
    stale: bool = False  # a heartbeat found the token stale: stop extending, still try to complete
    acking: bool = False  # finished; its completion waits for the ack thread (still leased)
    started: float | None = None
    child: Handle | None = None  # the job's run in a child process (cancel() kills it)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Loop:
    """One asyncio loop thread per worker for ``async def`` units."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="foundry-worker-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float | None) -> Any:
        return asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5.0)
        if not self.thread.is_alive():
            self.loop.close()


class _QueueLoop:
    """The claimer and runner threads of one queue."""

    def __init__(self, worker: Worker, queue: str, concurrency: int, prefetch: int) -> None:
        self.worker = worker
        self.queue = queue
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)  # room to claim (the claimer waits here)
        self.work = threading.Condition(self.lock)  # jobs to run (the runners wait here)
        self.buffer: deque[_Job] = deque()
        self.held: dict[str, _Job] = {}
        self.idle = False  # burst mode: nothing left to do here
        self.threads: list[threading.Thread] = []
        self.acks: list[tuple[_Job, bytes, str]] = []  # finished, completion not yet written
        self.ack_cond = threading.Condition()
        self.acking = 0

    def start(self) -> None:
        name = f"foundry-worker-{self.queue}"
        self.threads.append(threading.Thread(target=self._claim_loop, name=f"{name}-claim", daemon=True))
        self.threads.append(threading.Thread(target=self._ack_loop, name=f"{name}-ack", daemon=True))
        for i in range(self.concurrency):
            self.threads.append(threading.Thread(target=self._run_loop, name=f"{name}-{i}", daemon=True))
        for t in self.threads:
            t.start()

    # -- claiming ------------------------------------------------------------------

    def _claim_loop(self) -> None:
        w = self.worker
        pause = 0.05
        while not w.stopping.is_set():
            with self.cond:
                # Refill in batches: claim when a runner may be idle, or half the window is free.
                while not w.stopping.is_set() and not (
                    len(self.held) < self.prefetch
                    and (not self.buffer or self.prefetch - len(self.held) >= self.prefetch // 2)
                ):
                    self.cond.wait(0.5)
                room = self.prefetch - len(self.held)
            if w.stopping.is_set():
                break
            try:
                got = w.backend.claim(self.queue, w.name, lease=w.lease, limit=room, timeout=w.poll)
            except BackendError as exc:
                if w.stopping.is_set():
                    break
                log.warning(
                    "worker %s: claim on %r failed (%s); retrying in %.2fs", w.name, self.queue, exc, pause
                )
                w.stopping.wait(pause)
                pause = min(pause * 2, 2.0)
                continue
            pause = 0.05
            if got:
                self.idle = False
                with self.cond:
                    for claimed in got:
                        job = _Job(claimed, self)
                        self.held[claimed.id] = job
                        self.buffer.append(job)
                    self.work.notify(len(got))
                if w.stopping.is_set():
                    self.give_back_waiting()
                elif len(got) < room:
                    # The queue ran dry mid-batch: jobs trickle in. Let the next few gather
                    # (at most BATCH_WINDOW) rather than pay a transaction per job.
                    w.stopping.wait(BATCH_WINDOW)
            elif w.burst:
                self._check_idle()

    # -- acknowledging -------------------------------------------------------------

    def ack(self, job: _Job, data: bytes, model: str) -> None:
        """Queue a completion; the ack thread writes it with the others that finished
        meanwhile (one transaction where the engine has ``complete_many``). A job whose
        completion is not written yet is still leased to us: if we die first, it is
        redelivered — at-least-once, never lost."""
        job.acking = True
        with self.ack_cond:
            # At most ``prefetch`` completions wait to be written: with the ``prefetch`` jobs
            # held, that bounds what a crash of this worker can make run twice.
            while len(self.acks) + self.acking >= self.prefetch and not self.worker.hard.is_set():
                self.ack_cond.wait(0.1)
            self.acks.append((job, data, model))
            # Wake the ack thread only when it has something to decide: the first
            # completion (it starts its ACK_WINDOW) or a full batch. A wake-up per job
            # costs a futex call and a GIL hand-off each.
            if len(self.acks) == 1 or len(self.acks) == min(self.concurrency, self.prefetch):
                self.ack_cond.notify_all()

    def _ack_loop(self) -> None:
        w = self.worker
        many = getattr(w.backend, "complete_many", None)
        while True:
            with self.ack_cond:
                while not self.acks and not w.hard.is_set():
                    self.ack_cond.wait(0.5)
                if not self.acks:
                    return
                # A few more are about to finish: one transaction for them all.
                self.ack_cond.wait_for(
                    lambda: len(self.acks) >= min(self.concurrency, self.prefetch) or w.hard.is_set(),
                    ACK_WINDOW,
                )
                batch, self.acks = self.acks[:256], self.acks[256:]
                self.acking = len(batch)
            items = [(job.claimed.id, job.claimed.token, data) for job, data, _ in batch]
            results: list[bool | None]
            if callable(many):
                written = w.persist("completions", functools.partial(many, items))
                results = list(written) if written is not None else [None] * len(batch)
            else:
                results = [w.persist("completion", functools.partial(w.backend.complete, *i)) for i in items]
            for (job, _, model), ok in zip(batch, results, strict=True):
                w.acked(job, model, ok)
            with self.ack_cond:
                self.acking = 0
                self.ack_cond.notify_all()

    def flush(self, timeout: float) -> None:
        """Wait until every queued completion is written (or ``timeout``)."""
        with self.ack_cond:
            self.ack_cond.wait_for(lambda: not self.acks and not self.acking, timeout)

    def _check_idle(self) -> None:
        with self.cond:
            busy = bool(self.held)
        with self.ack_cond:
            busy = busy or bool(self.acks) or bool(self.acking)
        if busy:
            return
        try:
            stats = self.worker.backend.stats(self.queue)
        except BackendError:
            return
        self.idle = stats.depth == 0 and stats.scheduled == 0 and stats.running == 0
        if self.idle:
            self.worker.wake.set()

    # -- running -------------------------------------------------------------------

    def _run_loop(self) -> None:
        w = self.worker
        while True:
            with self.work:
                while not self.buffer and not w.stopping.is_set():
                    self.work.wait(0.5)
                if not self.buffer:
                    return
                job = self.buffer.popleft()
            try:
                if not job.lost:
                    w.execute(job)
            except BaseException:  # pragma: no cover - execute() records every outcome itself
                log.exception("worker %s: job %s crashed the runner", w.name, job.claimed.id)
            finally:
                self.done(job)

    def done(self, job: _Job) -> None:
        """The job no longer counts against prefetch (wake the claimer when it may refill)."""
        with self.cond:
            self.held.pop(job.claimed.id, None)
            if not self.buffer or self.prefetch - len(self.held) >= self.prefetch // 2:
                self.cond.notify()

    def give_back_waiting(self) -> None:
        """Release the jobs claimed but not started (graceful stop)."""
        with self.cond:
            waiting = list(self.buffer)
            self.buffer.clear()
            for job in waiting:
                self.held.pop(job.claimed.id, None)
            self.cond.notify_all()
            self.work.notify_all()
        for job in waiting:
            self.worker.give_back(job)

    def running(self) -> list[_Job]:
        with self.cond:
            return [j for j in self.held.values() if j.started is not None]


class Worker:
    """Runs the queued jobs of ``app``. ``run()`` blocks; ``start()`` runs in threads.

    ``queues``: names, or ``{name: concurrency}`` (default: the queues of the app's
    queue units). ``concurrency`` per queue; ``prefetch`` jobs held at most per queue
    (running + waiting; default ``2 × concurrency``, ``1`` = one at a time); ``lease``
    seconds per job, extended every ``lease / 3`` by heartbeat; ``grace`` seconds for
    running jobs on ``stop``; ``burst`` stops when the queues are empty; ``backoff`` is
    the first retry delay of units that declare none; ``url`` a queue URL other than
    the app's.
    """

    def __init__(
        self,
        app: AppLike,
        *,
        queues: Iterable[str] | Mapping[str, int] | None = None,
        concurrency: int = 8,
        prefetch: int | None = None,
        lease: float = 30.0,
        grace: float = 30.0,
        burst: bool = False,
        backoff: float = 1.0,
        max_backoff: float = 600.0,
        poll: float = 1.0,
        url: str | None = None,
        name: str | None = None,
        on_event: Callable[[JobEvent], None] | None = None,
    ) -> None:
        if concurrency < 1 or (prefetch is not None and prefetch < 1) or lease <= 0 or grace < 0:
            raise SubmitError(
                f"worker: concurrency={concurrency}, prefetch={prefetch}, lease={lease} and grace={grace} "
                "must be positive (prefetch at least 1). Fix: e.g. concurrency=8, prefetch=1, lease=30"
            )
        self.app = app
        self.ctx = app.context()
        if queues is None:
            found = sorted(
                {queue_of(u.spec) for u in app.units.values() if u.decision.delivery == "queue"}
            ) or ["default"]
            plan: dict[str, int] = dict.fromkeys(found, concurrency)
        elif isinstance(queues, Mapping):
            plan = {str(q): int(n) for q, n in queues.items()}
        else:
            plan = dict.fromkeys(queues, concurrency)
        if not plan or any(not q or n < 1 for q, n in plan.items()):
            raise SubmitError(
                f"worker: queues={plan!r} must name at least one queue, each with concurrency >= 1"
            )
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.lease = lease
        self.grace = grace
        self.burst = burst
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.poll = poll
        self.on_event = on_event
        self.runtime: QueueRuntime = runtime_for(self.ctx, url)
        self.backend: QueueBackend = self.runtime.backend
        self.loops = [_QueueLoop(self, q, n, prefetch or 2 * n) for q, n in plan.items()]
        for q in plan:
            self.runtime.watch(q)
        self.stopping = threading.Event()
        self.wake = threading.Event()
        self._finished = threading.Event()
        self.hard = threading.Event()
        self._async: _Loop | None = None
        self._async_lock = threading.Lock()
        self._beat: threading.Thread | None = None
        self._started = False
        self._specs: dict[str, UnitSpec] = {}
        self._children: dict[str, Runner] = {}  # unit -> its processes-model runner
        m = self.ctx.metrics
        self._m_done = m.counter(names.UNIT_COMPLETED, "units completed", ("unit", "model"))
        self._m_failed = m.counter(names.UNIT_FAILED, "units failed", ("unit", "model"))
        self._m_flight = m.gauge(names.UNIT_IN_FLIGHT, "units in flight", ("unit", "model"))
        self._m_duration = m.histogram(names.UNIT_DURATION, "seconds per unit", ("unit", "model"))
        self._m_retries = m.counter(names.JOB_RETRIES, "job retries scheduled", ("unit",))
        self._m_dead = m.counter(names.JOB_DEAD, "jobs moved to dead letters", ("unit",))
        self._m_redelivered = m.counter(names.JOB_REDELIVERIES, "jobs delivered more than once", ("unit",))

    @property
    def queues(self) -> list[str]:
        return [loop.queue for loop in self.loops]

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> Worker:
        if self._started:
            return self
        self._started = True
        for loop in self.loops:
            loop.start()
        self._beat = threading.Thread(target=self._heartbeat, name="foundry-worker-beat", daemon=True)
        self._beat.start()
        return self

    def run(self, until: threading.Event | None = None) -> None:
        """Work until :meth:`stop`, ``until`` is set, or (``burst``) the queues are empty;
        then stop gracefully."""
        self.start()
        while not self.stopping.is_set() and not (until is not None and until.is_set()):
            if self.burst and all(loop.idle for loop in self.loops):
                break
            self.wake.wait(0.1)
            self.wake.clear()
        self.stop()

    def stop(self, grace: float | None = None) -> None:
        """Stop claiming, release what has not started, give running jobs ``grace``
        seconds, release the rest for immediate redelivery. Idempotent."""
        if self._finished.is_set():
            return
        self.stopping.set()
        self.wake.set()
        bump = getattr(getattr(self.backend, "signals", None), "bump_all", None)
        if callable(bump):
            bump()  # wake claimers blocked in the store
        for loop in self.loops:
            loop.give_back_waiting()
        deadline = time.monotonic() + (self.grace if grace is None else grace)
        while time.monotonic() < deadline and any(loop.running() for loop in self.loops):
            time.sleep(0.01)
        for loop in self.loops:
            for job in loop.running():
                self.give_back(job)
                if job.child is not None:
                    job.child.cancel()
        for loop in self.loops:
            loop.flush(max(1.0, deadline - time.monotonic()))
        self.hard.set()
        for loop in self.loops:
            for t in loop.threads:
                t.join(self.poll + 2.0 if t.name.endswith("-claim") else 0.1)
        if self._beat is not None:
            self._beat.join(2.0)
        if self._async is not None:
            self._async.close()
        for runner in self._children.values():
            runner.close(5.0)
        self._finished.set()
        release_runtime(self.runtime)

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the store, retried ----------------------------------------------------------

    def persist(self, what: str, op: Callable[[], T]) -> T | None:
        """Run a store write until it answers; ``None`` when the worker is shutting down
        hard first (the lease then lapses and the job is redelivered: at-least-once)."""
        pause = 0.05
        while True:
            try:
                return op()
            except BackendError as exc:
                if self.hard.is_set():
                    return None
                log.warning("worker %s: %s failed (%s); retrying in %.2fs", self.name, what, exc, pause)
                self.hard.wait(pause)
                pause = min(pause * 2, 2.0)

    def give_back(self, job: _Job) -> None:
        with job.lock:
            if job.lost:
                return
            job.lost = True
        c = job.claimed
        try:
            self.backend.release(c.id, c.token)
        except BackendError as exc:  # the lease will lapse instead
            log.warning("worker %s: release of %s failed (%s); its lease will lapse", self.name, c.id, exc)
        self._event("released", c)

    def _heartbeat(self) -> None:
        every = max(0.05, self.lease / 3.0)
        last = time.monotonic()
        purged = last
        while not self.hard.wait(min(every, 0.05)):  # timeouts are checked often, leases every lease/3
            now = time.monotonic()
            beat = now - last >= every
            if beat:
                last = now
            if now - purged >= PURGE_EVERY:  # results past their result_ttl
                purged = now
                try:
                    self.backend.purge()
                except BackendError as exc:
                    log.warning("worker %s: purge failed (%s)", self.name, exc)
            for loop in self.loops:
                with loop.cond:
                    jobs = list(loop.held.values())
                for job in jobs:
                    c = job.claimed
                    if job.lost or job.stale:
                        continue
                    if c.timeout is not None and job.started is not None and now - job.started > c.timeout:
                        self._time_out(job)
                        continue
                    if not beat:
                        continue
                    try:
                        alive = self.backend.heartbeat(c.id, c.token, lease=self.lease)
                    except BackendError as exc:
                        log.warning("worker %s: heartbeat failed (%s)", self.name, exc)
                        continue
                    if not alive:
                        job.stale = True
                        self._event("lost", c, "the lease was taken over or the job finished elsewhere")

    def _time_out(self, job: _Job) -> None:
        """A running job past its timeout: kill its child, or (a thread cannot be
        stopped) fail the attempt now and discard the thread's late result."""
        if job.child is not None:
            return  # the processes model kills the child at its timeout itself
        if not self._take(job):
            return
        error = WorkTimeoutError(
            f"unit {job.claimed.unit!r}: job {job.claimed.id} ran past its timeout of "
            f"{job.claimed.timeout}s; "
            "the attempt was failed (the thread running it cannot be stopped and its result will be "
            "discarded). Fix: raise timeout=, or declare isolate=True so a timeout kills the work"
        )
        try:
            spec: UnitSpec | None = self.ctx.lookup(job.claimed.unit)
        except (NotFoundError, KeyError):
            spec = None
        self._write_failure(job, error, spec)

    # -- running one job -------------------------------------------------------------

    def _event(self, kind: str, c: Claimed, detail: str = "") -> None:
        if self.on_event is None and not log.isEnabledFor(logging.DEBUG):
            return
        event = JobEvent(kind, c.id, c.unit, c.queue, c.deliveries, c.attempts + 1, time.time(), detail)
        log.debug("job %s %s %s", c.id, kind, detail)
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:
                log.exception("worker %s: on_event raised", self.name)

    @staticmethod
    def _take(job: _Job) -> bool:
        """Claim the right to write the job's outcome (exactly one writer per delivery)."""
        with job.lock:
            if job.lost:
                return False
            job.lost = True
            return True

    def _dead(self, job: _Job, reason: str, error: BaseException) -> None:
        c = job.claimed
        data = json.dumps(encode_error(error)).encode()
        if not self._take(job):
            return
        if self.persist("dead-letter", lambda: self.backend.fail(c.id, c.token, data, dead_reason=reason)):
            self._m_dead.labels(c.unit).inc()
            self._event("dead", c, reason)

    def _spec(self, job: _Job) -> UnitSpec | None:
        c = job.claimed
        spec = self._specs.get(c.unit)
        if spec is not None:
            return spec
        try:
            spec = self._specs[c.unit] = self.ctx.lookup(c.unit)
            return spec
        except (NotFoundError, KeyError) as exc:
            known = ", ".join(sorted(self.app.units)) or "none"
            self._dead(
                job,
                f"unknown unit {c.unit!r}: the worker's app {self.ctx.app_name!r} declares no unit by that "
                f"name (it declares: {known}); run a worker with the app that declares it, then "
                f"`foundry jobs requeue {c.id}`",
                exc,
            )
            return None

    def _arguments(self, job: _Job, spec: UnitSpec) -> tuple[list[Any], dict[str, Any]] | None:
        c = job.claimed
        if c.codec == "pickle" and spec.traits.codec != "pickle":
            error = SubmitError(f"unit {c.unit!r} did not declare codec='pickle'")
            self._dead(
                job,
                f"payload codec 'pickle' refused: unit {c.unit!r} did not declare codec='pickle', and "
                "unpickling untrusted bytes runs code",
                error,
            )
            return None
        try:
            data = get_codec(c.codec).decode(c.payload)
            args, kwargs = data["args"], data["kwargs"]
            if not isinstance(args, list | tuple) or not isinstance(kwargs, dict):
                raise TypeError(f"args is {type(args).__name__}, kwargs is {type(kwargs).__name__}")
        except Exception as exc:
            self._dead(
                job,
                f"undecodable payload ({c.codec}, {len(c.payload)} bytes): {type(exc).__name__}: {exc}; "
                'expected {"args": [...], "kwargs": {...}} as written by submit()',
                exc,
            )
            return None
        return list(args), dict(kwargs)

    def _invoke(self, job: _Job, spec: UnitSpec, args: list[Any], kwargs: dict[str, Any]) -> Any:
        c = job.claimed
        if spec.traits.isolate or spec.decision.execution == "processes":
            handle = self._process_runner(spec).submit(tuple(args), kwargs, SubmitOptions(timeout=c.timeout))
            job.child = handle
            return handle.result()
        if spec.is_async:
            return self._loop().run(spec.fn(*args, **kwargs), c.timeout)
        return spec.fn(*args, **kwargs)

    def _process_runner(self, spec: UnitSpec) -> Runner:
        with self._async_lock:
            runner = self._children.get(spec.name)
            if runner is None:
                from foundry.execute.processes import make_runner

                runner = self._children[spec.name] = make_runner(spec, self.ctx)
            return runner

    def _loop(self) -> _Loop:
        with self._async_lock:
            if self._async is None:
                self._async = _Loop()
            return self._async

    def execute(self, job: _Job) -> None:
        """Run one claimed job and record its outcome (never raises)."""
        c = job.claimed
        spec = self._spec(job)
        if spec is None:
            return
        decoded = self._arguments(job, spec)
        if decoded is None:
            return
        args, kwargs = decoded
        model = spec.decision.model
        if c.deliveries > 1 + c.attempts:
            self._m_redelivered.labels(c.unit).inc()
        job.started = time.monotonic()
        self._event("started", c)
        flight = self._m_flight.labels(c.unit, model)
        flight.inc()
        try:
            value = self._invoke(job, spec, args, kwargs)
        except BaseException as exc:
            exc = self._as_timeout(job, spec, exc)
            self._record_failure(job, exc, spec)
        else:
            self._record_success(job, spec, value)
        finally:
            flight.dec()
            self._m_duration.labels(c.unit, model).observe(time.monotonic() - job.started)

    @staticmethod
    def _as_timeout(job: _Job, spec: UnitSpec, exc: BaseException) -> BaseException:
        """A job stopped by its own timeout fails with :class:`WorkTimeoutError`."""
        c = job.claimed
        if c.timeout is None or isinstance(exc, WorkTimeoutError) or job.started is None:
            return exc
        killed = job.child is not None and time.monotonic() - job.started > c.timeout
        cancelled = job.child is None and spec.is_async and isinstance(exc, TimeoutError)
        if not (killed or cancelled):
            return exc
        how = "its child process was killed" if killed else "it was cancelled"
        return WorkTimeoutError(
            f"unit {c.unit!r}: job {c.id} ran past its timeout of {c.timeout}s and {how}. "
            "Fix: raise timeout=, or make the work shorter"
        )

    def _record_success(self, job: _Job, spec: UnitSpec, value: Any) -> None:
        c = job.claimed
        try:
            data = get_codec(c.codec).encode(value, unit=c.unit, what="the result")
        except SubmitError as exc:
            self._record_failure(job, exc, spec, retry=False)
            return
        if not self._take(job):
            return  # released on stop, or timed out: its outcome is no longer ours to write
        job.queue.ack(job, data, spec.decision.model)

    def acked(self, job: _Job, model: str, written: bool | None) -> None:
        c = job.claimed
        if written:
            self._m_done.labels(c.unit, model).inc()
            self._event("succeeded", c)
        elif written is False:
            self._event("lost", c, "a completion was already recorded; this one was dropped")

    def _record_failure(
        self, job: _Job, exc: BaseException, spec: UnitSpec | None, *, retry: bool = True
    ) -> None:
        if self._take(job):
            self._write_failure(job, exc, spec, retry=retry)

    def _write_failure(
        self, job: _Job, exc: BaseException, spec: UnitSpec | None, *, retry: bool = True
    ) -> None:
        c = job.claimed
        retry_on: tuple[type[BaseException] | str, ...] = spec.traits.retry_on if spec else ()
        base = (spec.traits.backoff if spec and spec.traits.backoff is not None else None) or self.backoff
        data = json.dumps(encode_error(exc)).encode()
        model = spec.decision.model if spec else "queue"
        detail = f"{type(exc).__name__}: {exc}"
        if retry and c.attempts < c.max_retries and _matches(retry_on, exc):
            delay = backoff_delay(c.attempts, base, self.max_backoff)
            at = time.time() + delay
            if self.persist("retry", lambda: self.backend.fail(c.id, c.token, data, retry_at=at)):
                self._m_retries.labels(c.unit).inc()
                self._event("retry", c, f"{detail}; retry {c.attempts + 1}/{c.max_retries} in {delay:.2f}s")
            return
        if self.persist("failure", lambda: self.backend.fail(c.id, c.token, data)):
            self._m_failed.labels(c.unit, model).inc()
            self._event("timeout" if isinstance(exc, WorkTimeoutError) else "failed", c, detail)
