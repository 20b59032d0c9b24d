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

**A suspect runs alone.** A job whose previous delivery ended without an outcome (its
worker died or hung while holding it: ``Claimed.suspect``) may be the one that killed
that worker — or may merely have been beside it. So this worker runs it with nothing
else: it gives back the jobs it holds but has not started, lets its running jobs finish
and their completions be written, marks the delivery ``mark_alone`` in the store, runs
it, writes its outcome, and only then starts anything else. If the worker dies now, the
store charges this job alone; a healthy job that shared a worker with a poison job is
never charged for it (see ``foundry.backends.queue.base``). Ordinary jobs pay nothing
for this: no extra write, and completions stay batched.

**Cancel a running job.** ``cancel`` of a running job records a request in the store
(``foundry.backends.queue.base``); this worker's cancel watcher learns of it
(``backend.cancel_requests``: woken by the engine's notification, at most a second late
otherwise) and stops the work the way its model allows: an ``isolate=True`` job's child
is killed; an ``async def`` job's task is cancelled; a job on a runner thread is asked
to stop — :func:`foundry.execute.checkpoint` raises :class:`~foundry.errors.CancelledError`
in it at its next call (a thread cannot be stopped from outside: one that never calls
it runs to its end). A claimed job that has not started is not started. Whatever
the work then does, the store ends the job ``cancelled``, once: never retried,
never dead-lettered, and a result that arrives after the request is dropped.

**No zombie.** Every thread of the worker (claimer, acknowledger, runners, heartbeat,
cancel watcher) runs under a guard: an exception it cannot handle stops the whole
worker, which gives back what it can, records :class:`~foundry.errors.WorkerFailedError`
in ``failure`` and raises it from ``run()`` (``foundry worker`` exits non-zero) — a
worker never looks healthy while one of its threads is dead. So does a backend whose
own background task died (``backend.failure``), and, with ``burst``, a store that
refuses writes (:class:`~foundry.errors.StorageError`: a full disk, a read-only file).

``stop(grace)`` (SIGTERM in ``foundry worker``): stop claiming, give back the jobs not
started, let running ones finish within ``grace`` seconds, give back the rest for
immediate redelivery. ``hurry()`` (a second SIGTERM or Ctrl-C) ends the grace at once.
SIGKILL loses nothing: the leases lapse.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import functools
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from foundry.backends.queue import Claimed, JobProgress, QueueBackend, check_queue_name
from foundry.deliver.limits import Limiter, ParkingRoom, Scope, limit_of
from foundry.deliver.queue import QueueRuntime, queue_of, release_runtime, runtime_for
from foundry.errors import (
    BackendError,
    CancelledError,
    NotFoundError,
    RecordError,
    StorageError,
    SubmitError,
    WorkerFailedError,
    WorkTimeoutError,
)
from foundry.execute.progress import WRITE_EVERY, ProgressSink, report_to, reporting
from foundry.execute.threads import Interrupt, swap_interrupt
from foundry.handle import Handle
from foundry.observe import names
from foundry.observe.tracing import decision_attributes, messaging_system
from foundry.payload import DEFAULT_MAX_PAYLOAD, RESULT_FIX, too_large
from foundry.retry import Backoff
from foundry.runtime import RuntimeContext, SubmitOptions, UnitSpec
from foundry.serialize import Codec, decode_call, encode_error, get_codec
from foundry.typed import payloads_for

if TYPE_CHECKING:
    from foundry.execute.asyncio_loop import LoopThread
    from foundry.execute.processes import ProcessRunner
    from foundry.observe._otel import Tracer
    from foundry.observe.metrics import Counter, Gauge, Histogram

__all__ = ["JobEvent", "Worker", "retries_on"]

log = logging.getLogger("foundry.queue.worker")

T = TypeVar("T")
BATCH_WINDOW = 0.001  # the longest a claim waits for company when jobs trickle in
ACK_WINDOW = 0.003  # ... and an acknowledgement (results show up that much later, commits are fewer)
PURGE_EVERY = 600.0  # seconds between deletions of finished jobs past their result_ttl
# An async job's own loop cancels it at its timeout; the watcher steps in only this much
# later (a loop blocked by other code cannot), so a busy machine does not race the two.
ASYNC_TIMEOUT_GRACE = 2.0


class AppLike(Protocol):
    """What a worker needs of an app (``foundry.Foundry`` has it)."""

    @property
    def units(self) -> Mapping[str, Any]: ...

    def context(self) -> RuntimeContext: ...


@dataclass(frozen=True, slots=True)
class JobEvent:
    """What happened to a job in this worker (``Worker(on_event=...)``, the demo, logs)."""

    kind: str  # started | succeeded | retry | failed | dead | released | lost | timeout | alone | cancelled
    job_id: str
    unit: str
    queue: str
    delivery: int
    attempt: int
    at: float
    detail: str = ""


def retries_on(retry_on: tuple[type[BaseException] | str, ...], exc: BaseException) -> bool:
    """Whether a unit's ``retry_on`` (types, or class names) admits ``exc`` for a retry
    (empty: every ``Exception``). The worker's rule, and foundry.testing's eager jobs'."""
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


class _Job:
    """One claimed delivery in this worker (a slots class: one is made per job)."""

    __slots__ = (
        "acking",
        "cancelled",
        "child",
        "claimed",
        "interrupt",
        "lock",
        "lost",
        "progress",
        "progress_lock",
        "progress_written",
        "queue",
        "stale",
        "started",
        "task",
    )

    def __init__(self, claimed: Claimed, queue: _QueueLoop) -> None:
        self.claimed = claimed
        self.queue = queue
        self.lost = False  # its outcome is written or no longer ours to write (released, timed out)
        self.stale = False  # a heartbeat found the token stale: stop extending, still try to complete
        self.acking = False  # finished; its completion waits for the ack thread (still leased)
        self.started: float | None = None
        self.child: Handle | None = None  # the job's run in a child process (cancel() kills it)
        self.task: _AsyncRun | None = None  # an async job's run on the worker's loop (cancel() cancels it)
        self.cancelled = False  # its cancel was requested: stop it, and end it cancelled
        self.interrupt = Interrupt()  # checkpoint() raises in its thread once stopped
        self.lock = threading.Lock()
        self.progress: JobProgress | None = None  # the latest foundry.progress() record, not yet written
        self.progress_written = 0.0  # monotonic time of the last write of it
        self.progress_lock = threading.Lock()  # one writer at a time, in order

    def report(self, done: float, total: float | None, note: str) -> None:
        """The job's progress sink: keep the latest record (the heartbeat thread writes it)."""
        self.progress = JobProgress(done, total, note, time.time())


class _Plan:
    """What running a unit's jobs needs that is the same for every job of the unit,
    looked up once per unit (its spec is cached for the worker's life already)."""

    __slots__ = ("codec", "declared", "duration", "flight", "limit", "model", "on_thread", "spec", "types")

    def __init__(self, spec: UnitSpec, series: tuple[Gauge, Histogram, Counter]) -> None:
        self.spec = spec
        self.declared = spec.traits.codec
        # (an unknown one fails each job's result where get_codec raises it: _record_success)
        self.codec: Codec | None = None
        with contextlib.suppress(SubmitError):
            self.codec = get_codec(spec.traits.codec)
        self.types = payloads_for(spec.name, spec.fn)
        self.limit = spec.traits.max_payload or DEFAULT_MAX_PAYLOAD
        self.model = spec.decision.model
        self.flight, self.duration, _ = series  # (the completed count is the ack thread's: acked)
        # a plain function on the runner thread (not a child process, not a coroutine)
        self.on_thread = not (spec.traits.isolate or spec.decision.execution == "processes" or spec.is_async)


class _AsyncRun:
    """An ``async def`` job's task on the worker's loop. ``cancel()`` (from any thread)
    cancels the task; ``future`` completes only once the coroutine has finished, its
    ``finally`` blocks included, so a cancelled job is recorded after its work stopped."""

    def __init__(
        self,
        loop: LoopThread,
        coro: Coroutine[Any, Any, Any],
        timeout: float | None,
        sink: ProgressSink | None = None,
    ) -> None:
        self._loop = loop.loop
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False

        async def run() -> Any:
            if self._cancelled:  # cancelled before it started: it never starts
                coro.close()
                raise asyncio.CancelledError
            self._task = asyncio.current_task()
            with reporting(sink):  # this task's context: progress() in the job reaches the sink
                return await (coro if timeout is None else asyncio.wait_for(coro, timeout))

        self.future: cf.Future[Any] = loop.submit(run())

    def cancel(self) -> None:
        self._cancelled = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing runs on it any more
            self._loop.call_soon_threadsafe(self._cancel_task)

    def _cancel_task(self) -> None:  # on the loop's thread, like run(): the two never race
        if self._task is not None:
            self._task.cancel()


class _Gate:
    """Who may run: any number of ordinary jobs together, or one suspect alone. A suspect
    waiting to run alone stops new ordinary jobs from starting (they are given back)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # (enter/leave, once per job, take it without the Condition's wrapper)
        self.cond = threading.Condition(self.lock)
        self.running = 0  # ordinary jobs running now
        self.alone = False  # a suspect runs now
        self.waiting = 0  # suspects waiting for the others to finish

    @property
    def closed(self) -> bool:
        """Nothing new may be claimed or started beside what is running (a suspect's turn)."""
        return self.alone or self.waiting > 0

    def enter(self) -> bool:
        """An ordinary job starts (``False``: a suspect's turn; give the job back)."""
        with self.lock:
            if self.alone or self.waiting > 0:  # (closed)
                return False
            self.running += 1
            return True

    def leave(self) -> None:
        with self.lock:
            self.running -= 1
            if self.waiting:  # only a suspect waits for the running count (not once per job)
                self.cond.notify_all()

    def enter_alone(self, stopping: threading.Event, patience: float) -> str:
        """Wait until nothing else runs, then run alone: ``"alone"``. ``"stop"``: the worker
        is stopping. ``"beside"``: the others still ran after ``patience`` seconds (a job
        hung without a timeout must not stall the worker for good): run beside them, as
        an ordinary job (uncharged if the worker dies; it stays a suspect)."""
        deadline = time.monotonic() + patience
        with self.cond:
            self.waiting += 1
            try:
                while self.running or self.alone:
                    if stopping.is_set():
                        return "stop"
                    if time.monotonic() >= deadline and not self.alone:
                        self.running += 1
                        return "beside"
                    self.cond.wait(0.1)
                if stopping.is_set():
                    return "stop"
                self.alone = True
                return "alone"
            finally:
                self.waiting -= 1

    def leave_alone(self) -> None:
        with self.cond:
            self.alone = False
            self.cond.notify_all()


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
        self.ack_lock = threading.Lock()  # (taken once per job by ack: without the Condition's wrapper)
        self.ack_cond = threading.Condition(self.ack_lock)
        self.acking = 0
        self.room: ParkingRoom[_Job] = ParkingRoom(max(64, 4 * prefetch))  # waiting on a limit

    @property
    def load(self) -> int:
        """Jobs held against ``prefetch``: those parked on a limit count only past the
        room's cap (``foundry.deliver.limits``: no head-of-line blocking behind them)."""
        return len(self.held) - min(self.room.count, self.room.cap)

    def start(self) -> None:
        name = f"foundry-worker-{self.queue}"
        w = self.worker
        self.threads.append(w.thread(f"{name}-claim", "claimer", self._claim_loop))
        self.threads.append(w.thread(f"{name}-ack", "acknowledger", self._ack_loop))
        for i in range(self.concurrency):
            self.threads.append(w.thread(f"{name}-{i}", "runner", self._run_loop))
        for t in self.threads:
            t.start()

    # -- claiming ------------------------------------------------------------------

    def _claim_loop(self) -> None:
        w = self.worker
        pause = 0.05
        while not w.stopping.is_set():
            with self.cond:
                # Refill in batches: claim when a runner may be idle, or half the window is free;
                # never while a suspect waits to run alone (or runs).
                while not w.stopping.is_set() and not (
                    self.load < self.prefetch
                    and (not self.buffer or self.prefetch - self.load >= self.prefetch // 2)
                    and not w.gate.closed
                ):
                    self.cond.wait(0.5)
                room = self.prefetch - self.load
            if w.stopping.is_set():
                break
            try:
                got = w.backend.claim(self.queue, w.name, lease=w.lease, limit=room, timeout=w.poll)
            except StorageError as exc:
                if w.stopping.is_set():
                    break
                if w.burst:  # nothing will change by itself: say so and stop
                    w.fail(WorkerFailedError(f"worker {w.name}: claim on queue {self.queue!r}: {exc}"))
                    break
                log.error("worker %s: claim on %r: %s; retrying in %.0fs", w.name, self.queue, exc, pause)
                w.stopping.wait(pause)
                pause = min(max(pause * 2, 1.0), 30.0)
                continue
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
                w.claimed.set()  # the cancel watcher watches them too
                if w.stopping.is_set() or w.gate.closed:
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
        with self.ack_lock:
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

    def flush(self, timeout: float) -> bool:
        """Wait until every queued completion is written (``False``: ``timeout`` first)."""
        with self.ack_cond:
            if self.acks:
                self.ack_cond.notify_all()  # no need to wait for company: write them now
            return self.ack_cond.wait_for(lambda: not self.acks and not self.acking, timeout)

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
            with self.lock:  # (self.work's lock)
                while (due := self.room.take_due()) is None and not self.buffer and not w.stopping.is_set():
                    wait = self.room.next_due()
                    self.work.wait(0.5 if wait is None else min(0.5, max(wait, 0.001)))
                if due is None and not self.buffer:
                    return
                job = self.buffer.popleft() if due is None else due[1]
            parked = False
            try:
                if not job.lost:
                    parked = w.limiter is not None and w.over_limit(job, due)
                    if not parked and not job.lost:
                        try:
                            w.start_job(job)
                        finally:
                            if w.limiter is not None:
                                w.end_limits(job)
            finally:
                if not parked:
                    self.done(job)

    def done(self, job: _Job) -> None:
        """The job no longer counts against prefetch (wake the claimer when it may refill)."""
        with self.lock:  # (self.cond's lock)
            self.held.pop(job.claimed.id, None)
            if not self.buffer or self.prefetch - self.load >= self.prefetch // 2:
                self.cond.notify()

    def give_back_waiting(self) -> None:
        """Release the jobs claimed but not started (graceful stop)."""
        with self.cond:
            waiting = list(self.buffer)
            self.buffer.clear()
            for job, since in self.room.drain():
                waiting.append(job)
                self.worker.parked(job, since)
            for job in waiting:
                self.held.pop(job.claimed.id, None)
            self.cond.notify_all()
            self.work.notify_all()
        for job in waiting:
            self.worker.give_back(job)

    def running(self) -> list[_Job]:
        with self.cond:
            return [j for j in self.held.values() if j.started is not None]

    def watched(self) -> list[_Job]:
        """The jobs held whose cancel the worker has still to learn of."""
        with self.cond:
            return [j for j in self.held.values() if not j.lost and not j.cancelled]

    def unbuffer(self, job: _Job) -> bool:
        """Take a job that has not started out of the buffer (``False``: a runner has it)."""
        with self.cond:
            try:
                self.buffer.remove(job)
            except ValueError:
                since = self.room.remove(job)
                if since is None:
                    return False
                self.worker.parked(job, since)
            self.held.pop(job.claimed.id, None)
            self.cond.notify()
            return True


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
        for q in plan:
            check_queue_name(q, "worker")
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
        self._hurry = threading.Event()  # skip what is left of the grace period
        self._stop_lock = threading.Lock()
        self._stop_began = False
        self.gate = _Gate()
        self.failure: WorkerFailedError | None = None  # why the worker stopped by itself, if it did
        self._async: LoopThread | None = None
        self._async_lock = threading.Lock()
        self._beat: threading.Thread | None = None
        self._cancels: threading.Thread | None = None
        self.claimed = threading.Event()  # jobs were claimed (the cancel watcher looks again)
        self._started = False
        self._specs: dict[str, UnitSpec] = {}
        self._plans: dict[str, _Plan] = {}  # unit -> what its jobs need, looked up once (_plan)
        self._children: dict[str, ProcessRunner] = {}  # unit -> its processes-model runner
        self._tracing = self.ctx.tracing
        self._system = messaging_system(self.backend.url)
        m = self.ctx.metrics
        self._m_done = m.counter(names.UNIT_COMPLETED, "units completed", ("unit", "model"))
        self._m_failed = m.counter(names.UNIT_FAILED, "units failed", ("unit", "model"))
        self._m_flight = m.gauge(names.UNIT_IN_FLIGHT, "units in flight", ("unit", "model"))
        self._m_duration = m.histogram(names.UNIT_DURATION, "seconds per unit", ("unit", "model"))
        self._m_retries = m.counter(names.JOB_RETRIES, "job retries scheduled", ("unit",))
        self._m_dead = m.counter(names.JOB_DEAD, "jobs moved to dead letters", ("unit",))
        self._m_redelivered = m.counter(names.JOB_REDELIVERIES, "jobs delivered more than once", ("unit",))
        self._m_cancelled = m.counter(
            names.JOB_CANCELLED, "jobs cancelled while a worker held them", ("unit",)
        )
        self._unit_series: dict[tuple[str, str], tuple[Gauge, Histogram, Counter]] = {}
        limited = any(limit_of(u.spec) for u in app.units.values() if u.decision.delivery == "queue")
        self.limiter = (
            Limiter(url or self.ctx.settings.queue, self.ctx.settings.home, m, lease, self.backend)
            if limited
            else None
        )

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
        if self._serves_async():
            self._loop()  # now: its lag is on /metrics from the start, not from the first job
        self._beat = self.thread("foundry-worker-beat", "heartbeat", self._heartbeat)
        self._beat.start()
        self._cancels = self.thread("foundry-worker-cancels", "cancel watcher", self._watch_cancels)
        self._cancels.start()
        return self

    def run(self, until: threading.Event | None = None) -> None:
        """Work until :meth:`stop`, ``until`` is set, or (``burst``) the queues are empty;
        then stop gracefully. Raises :class:`WorkerFailedError` when the worker stopped
        because a thread of its own failed (see ``failure``)."""
        self.start()
        while not self.stopping.is_set() and not (until is not None and until.is_set()):
            if self.burst and all(loop.idle for loop in self.loops):
                break
            self.wake.wait(0.1)
            self.wake.clear()
        self.stop()
        if self.failure is not None:
            raise self.failure

    def thread(self, name: str, role: str, target: Callable[[], None]) -> threading.Thread:
        """A thread of this worker: if ``target`` raises, the worker stops (never a
        worker that looks alive with a dead claimer, acknowledger or heartbeat)."""

        def guarded() -> None:
            try:
                target()
            except BaseException as exc:
                self.fail(
                    WorkerFailedError(
                        f"worker {self.name}: its {role} thread {name!r} failed ({type(exc).__name__}: "
                        f"{exc}); the worker stopped, giving back the jobs it could (the others' leases "
                        "lapse and they are delivered again). Fix: a bug in Foundry or the unit, see the "
                        "traceback logged above; restart the worker"
                    ),
                    exc,
                )

        return threading.Thread(target=guarded, name=name, daemon=True)

    def fail(self, error: WorkerFailedError, cause: BaseException | None = None) -> None:
        """Stop the worker because it cannot go on (the first reason is kept in ``failure``;
        ``run()`` raises it after stopping)."""
        if self.failure is None:
            self.failure = error
            if cause is not None:
                error.__cause__ = cause
            log.critical("%s", error, exc_info=cause)
        self.stopping.set()
        self.wake.set()

    def hurry(self) -> None:
        """End the grace period of a stop in progress (or the next one) now: jobs still
        running are released for immediate redelivery, as on a hard stop. A second
        SIGTERM or Ctrl-C to ``foundry worker`` calls this."""
        self._hurry.set()
        self.stopping.set()
        self.wake.set()

    def stop(self, grace: float | None = None) -> None:
        """Stop claiming, release what has not started, give running jobs ``grace``
        seconds (cut short by :meth:`hurry`), release the rest for immediate redelivery.
        Idempotent; a second call waits for the first (``grace=0`` hurries it)."""
        with self._stop_lock:
            again, self._stop_began = self._stop_began, True
        if again:
            if grace is not None and grace <= 0:
                self.hurry()
            self._finished.wait(self.grace + self.poll + 30.0)
            return
        self.stopping.set()
        self.wake.set()
        bump = getattr(getattr(self.backend, "signals", None), "bump_all", None)
        if callable(bump):
            bump()  # wake claimers blocked in the store
        for loop in self.loops:
            loop.give_back_waiting()
        deadline = time.monotonic() + (self.grace if grace is None else grace)
        while (
            time.monotonic() < deadline
            and not self._hurry.is_set()
            and any(loop.running() for loop in self.loops)
        ):
            self._hurry.wait(0.01)
        for loop in self.loops:
            for job in loop.running():
                self.give_back(job)
                if job.child is not None:
                    job.child.cancel()
        for loop in self.loops:
            loop.flush(1.0 if self._hurry.is_set() else max(1.0, deadline - time.monotonic()))
        self.hard.set()
        for loop in self.loops:
            for t in loop.threads:
                t.join(self.poll + 2.0 if t.name.endswith("-claim") else 0.1)
        for helper in (self._beat, self._cancels):
            if helper is not None:
                helper.join(self.poll + 2.0)
        if self._async is not None:
            self._async.stop()
        for runner in self._children.values():
            runner.close(5.0)
        if self.limiter is not None:
            self.limiter.close()
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
            broken = getattr(self.backend, "failure", None)  # the backend's own background task died
            if isinstance(broken, BaseException):
                self.fail(WorkerFailedError(f"worker {self.name}: the queue backend failed: {broken}"))
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
            if beat and self.limiter is not None:
                self.limiter.renew()  # the slots of the jobs it runs live as long as their leases
            for loop in self.loops:
                with loop.cond:
                    jobs = list(loop.held.values())
                for job in jobs:
                    c = job.claimed
                    if job.lost or job.stale:
                        continue
                    grace = 0.0 if job.task is None else ASYNC_TIMEOUT_GRACE
                    if (
                        c.timeout is not None
                        and job.started is not None
                        and now - job.started > c.timeout + grace
                    ):
                        self._time_out(job)
                        continue
                    self._write_progress(job, every=WRITE_EVERY)
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

    def _watch_cancels(self) -> None:
        """Learn of cancel requests for the jobs this worker holds, from any host, and stop
        them (``_cancel``). One look blocks at most ``poll`` seconds (woken by the engine's
        notification); a job claimed meanwhile is watched from the next look on."""
        ask = getattr(self.backend, "cancel_requests", None)
        if not callable(ask):  # an engine without it: a requested cancel lands when the delivery ends
            return
        pause = 0.05
        while not self.hard.is_set():
            held = {job.claimed.id: job for loop in self.loops for job in loop.watched()}
            if not held:
                self.claimed.wait(self.poll)
                self.claimed.clear()
                continue
            try:
                found = ask(list(held), timeout=self.poll)
            except BackendError as exc:
                if self.hard.is_set():
                    return
                log.warning("worker %s: looking for cancel requests failed (%s)", self.name, exc)
                self.hard.wait(pause)
                pause = min(pause * 2, 2.0)
                continue
            pause = 0.05
            for job_id in found:
                job = held.get(job_id)
                if job is not None:
                    self._cancel(job)

    def _cancel(self, job: _Job) -> None:
        """Stop a job whose cancel was requested, the way its model allows."""
        c = job.claimed
        job.cancelled = True
        job.interrupt.stop(
            CancelledError(
                f"unit {c.unit!r}: job {c.id} was cancelled while it ran (delivery {c.deliveries}); "
                "it ends cancelled and is not retried"
            )
        )
        if job.started is None and job.queue.unbuffer(job):  # claimed, not started: never start it
            self._write_cancelled(job)
            return
        self._stop_work(job)

    @staticmethod
    def _stop_work(job: _Job) -> None:
        """Kill the child of an isolated job, cancel the task of an async one; a job on a
        thread stops at its next ``checkpoint()`` (``job.interrupt`` is set)."""
        child, task = job.child, job.task
        if child is not None:
            child.cancel()
        if task is not None:
            task.cancel()

    def _write_cancelled(self, job: _Job, error: BaseException | None = None) -> None:
        """Write the end of a job whose cancel was requested (the store makes it ``cancelled``)."""
        if self._take(job):
            self._end_cancelled(job, error)

    def _end_cancelled(self, job: _Job, error: BaseException | None) -> None:
        c = job.claimed
        reason = error if error is not None else job.interrupt.error
        data = json.dumps(encode_error(reason or CancelledError(f"job {c.id} was cancelled"))).encode()
        if self.persist("cancellation", lambda: self.backend.fail(c.id, c.token, data)):
            self._m_cancelled.labels(c.unit).inc()
            self._event("cancelled", c, "its cancel was requested: it ends cancelled, not retried")

    def _time_out(self, job: _Job) -> None:
        """A running job past its timeout: kill its child, or (a thread cannot be
        stopped) fail the attempt now and discard the thread's late result."""
        if job.child is not None:
            return  # the processes model kills the child at its timeout itself
        if not self._take(job):
            return
        if job.task is not None:  # its loop did not cancel it in time: blocked by other code
            error = WorkTimeoutError(
                f"unit {job.claimed.unit!r}: job {job.claimed.id} ran past its timeout of "
                f"{job.claimed.timeout}s and its event loop did not cancel it within "
                f"{ASYNC_TIMEOUT_GRACE:g}s more (something blocks the loop); the attempt was failed "
                "and its task cancelled. Fix: find the blocking call (foundry top shows the loop's "
                "lag and the handler), or move it off the loop"
            )
            job.task.cancel()
        else:
            error = WorkTimeoutError(
                f"unit {job.claimed.unit!r}: job {job.claimed.id} ran past its timeout of "
                f"{job.claimed.timeout}s; "
                "the attempt was failed (a thread cannot be stopped from outside: it stops at its "
                "next foundry.execute.checkpoint(), and its result is discarded). Fix: raise timeout=, "
                "call checkpoint() in long loops, or declare isolate=True so a timeout kills the work"
            )
        job.interrupt.stop(error)
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

    def _arguments(self, job: _Job, plan: _Plan) -> tuple[list[Any], dict[str, Any]] | None:
        """The job's arguments, decoded with the codec the unit *declares* (never the one
        the record names): a mismatch or an undecodable payload is dead-lettered with the
        reason (both codec names, or what was wrong)."""
        c = job.claimed
        declared = plan.declared
        try:
            return decode_call(
                c.payload, c.codec, declared, unit=c.unit, what=f"job {c.id}'s arguments", types=plan.types
            )
        except RecordError as exc:
            if c.codec != declared:
                stored = c.codec if isinstance(c.codec, str) and len(c.codec) <= 40 else repr(c.codec)[:40]
                danger = ", and unpickling untrusted bytes runs code" if c.codec == "pickle" else ""
                reason = (
                    f"payload codec {stored!r} refused: unit {c.unit!r} declares codec={declared!r}"
                    f"{danger}; the job was submitted with another declaration of the unit, or written "
                    "by someone who can write to the store"
                )
            else:
                reason = f"undecodable payload: {exc}"
            self._dead(job, reason, exc)
            return None

    def _invoke(self, job: _Job, spec: UnitSpec, args: list[Any], kwargs: dict[str, Any]) -> Any:
        c = job.claimed
        if spec.traits.isolate or spec.decision.execution == "processes":
            handle = self._process_runner(spec).submit(
                tuple(args), kwargs, SubmitOptions(timeout=c.timeout), on_progress=job.report
            )
            job.child = handle
            if job.cancelled:  # the request came while it was being handed to a child
                self._stop_work(job)
            return handle.result()
        if spec.is_async:
            job.task = _AsyncRun(self._loop(), spec.fn(*args, **kwargs), c.timeout, job.report)
            if job.cancelled:
                self._stop_work(job)
            return job.task.future.result()
        return self._on_thread(job, spec.fn, args, kwargs)

    @staticmethod
    def _on_thread(job: _Job, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Run a plain function on this runner thread: ``checkpoint()`` in it raises once
        ``job.interrupt`` is stopped, ``progress()`` reaches ``job.report`` (what
        ``interruptible`` and ``reporting`` do, without two generators per job)."""
        previous = swap_interrupt(job.interrupt)
        token = report_to(job.report)
        try:
            return fn(*args, **kwargs)
        finally:
            token.var.reset(token)
            swap_interrupt(previous)

    def _write_progress(self, job: _Job, *, every: float = 0.0) -> None:
        """Write the job's latest progress record to the store, if it has a new one and the
        last write is ``every`` seconds old (the heartbeat's throttle; 0 before its outcome)."""
        if job.progress is None:
            return
        with job.progress_lock:
            record, now = job.progress, time.monotonic()
            if record is None or now - job.progress_written < every:
                return
            job.progress = None
            job.progress_written = now
            c = job.claimed
            try:
                self.backend.progress(c.id, c.token, record)
            except BackendError as exc:  # advisory: the next record, or none, is written instead
                log.warning("worker %s: progress of %s not written (%s)", self.name, c.id, exc)

    def _process_runner(self, spec: UnitSpec) -> ProcessRunner:
        with self._async_lock:
            runner = self._children.get(spec.name)
            if runner is None:
                from foundry.execute.processes import make_runner

                runner = self._children[spec.name] = make_runner(spec, self.ctx)
            return runner

    def _loop(self) -> LoopThread:
        """The worker's event loop for ``async def`` units, watched unless the app's
        ``watchdog`` setting is off (``foundry_loop_lag_seconds{loop="worker"}``)."""
        with self._async_lock:
            if self._async is None:
                from foundry.execute.asyncio_loop import LoopThread

                specs = [self.ctx.lookup(name) for name in self.app.units]
                self._async = LoopThread(
                    "foundry-worker-loop",
                    label="worker",
                    watchdog=self.ctx.settings.watchdog,
                    registry=self.ctx.metrics,
                    units=[spec for spec in specs if spec.is_async],
                )
            return self._async

    # -- limits (foundry.deliver.limits) -------------------------------------------------

    def over_limit(self, job: _Job, due: tuple[Scope, _Job, float] | None) -> bool:
        """Ask for the job's grant under its unit's limits; ``True``: it was refused and
        waits in its queue loop's parking room (``due``: it comes from there)."""
        assert self.limiter is not None
        spec = self._spec(job)
        limit = limit_of(spec) if spec is not None else None
        loop, now = job.queue, time.monotonic()
        if spec is None or limit is None or job.cancelled:  # an unknown unit is dead-lettered; a
            if due is not None:  # cancelled job ends so when it "starts"
                with loop.work:
                    loop.room.answered(due[0], 0.0)
                self.parked(job, due[2])
            return False
        scope, since = (due[0], due[2]) if due is not None else (self.limiter.scope(spec, job.claimed), now)
        with loop.work:
            if due is None and loop.room.waiting(scope):  # others of its scope wait: behind them
                loop.room.park(scope, job, 0.0, since, keep_turn=True)
                self.limiter.parked(spec.name, 1)
                loop.cond.notify()
                return True
        granted, wait = self.limiter.ask(limit, scope, job.claimed)
        with loop.work:
            if granted:
                loop.room.answered(scope, 0.0)  # the next of its scope may ask now
                if due is not None:
                    self.parked(job, since)
                loop.work.notify()
                return False
            if not self.stopping.is_set():
                loop.room.park(scope, job, wait, since, front=due is not None)
                if due is None:
                    self.limiter.parked(spec.name, 1)
                loop.cond.notify()  # a parked job does not count against prefetch: claim on
                return True
            loop.room.answered(scope, 0.0)
        if due is not None:
            self.parked(job, since)
        self.give_back(job)  # stopping: nothing may start any more
        loop.done(job)
        return True

    def parked(self, job: _Job, since: float) -> None:
        """A job leaves the parking room (it runs, goes back or is cancelled)."""
        if self.limiter is not None:
            self.limiter.parked(job.claimed.unit, -1)
            self.limiter.waited(job.claimed.unit, time.monotonic() - since)

    def end_limits(self, job: _Job) -> None:
        """Give back the job's slot; the jobs of its scope parked here ask at once."""
        scope = self.limiter.release(job.claimed) if self.limiter is not None else None
        if scope is not None:
            with job.queue.work:
                job.queue.room.wake(scope)
                job.queue.work.notify()

    def start_job(self, job: _Job) -> None:
        """Run a job taken from the buffer: an ordinary one beside the others, a suspect
        alone (see the module docstring); one that may not start now goes back."""
        if job.claimed.suspect:
            self._run_alone(job)
        elif self.gate.enter():
            try:
                self.execute(job)
            finally:
                self.gate.leave()
        else:
            self.give_back(job)  # a suspect waits to run alone here: let another worker have it

    def _run_alone(self, job: _Job) -> None:
        c = job.claimed
        how = self.gate.enter_alone(self.stopping, max(self.lease, 10.0))
        if how == "stop":
            self.give_back(job)
            return
        if how == "beside":
            log.warning(
                "worker %s: suspect job %s waited %.0fs for the jobs beside it to finish; it runs beside "
                "them (a death now is not charged to it)",
                self.name,
                c.id,
                max(self.lease, 10.0),
            )
            try:
                self.execute(job)
            finally:
                self.gate.leave()
            return
        try:
            for loop in self.loops:  # hold nothing else: what has not started goes back
                loop.give_back_waiting()
            for loop in self.loops:  # and what finished is acknowledged before it starts
                loop.flush(self.lease)
            marked = self.persist("mark alone", lambda: self.backend.mark_alone(c.id, c.token))
            if not marked:
                if marked is False and self._take(job):
                    self._event("lost", c, "the lease was taken over before the job could run alone")
                return
            self._event("alone", c, "an earlier delivery ended without an outcome: it runs alone")
            self.execute(job)
            job.queue.flush(self.lease)  # its own outcome is written before anything else starts
        finally:
            self.gate.leave_alone()
            for loop in self.loops:
                with loop.cond:
                    loop.cond.notify_all()  # the claimers may refill

    def _serves_async(self) -> bool:
        """Whether a unit this worker may run is ``async def`` (its loop starts with it)."""
        served = set(self.queues)
        return any(
            unit.spec.is_async and unit.decision.delivery == "queue" and queue_of(unit.spec) in served
            for unit in self.app.units.values()
        )

    def execute(self, job: _Job) -> None:
        """Run one claimed job and record its outcome (never raises)."""
        c = job.claimed
        plan = self._plans.get(c.unit) or self._plan(job)
        if plan is None:
            return
        spec = plan.spec
        decoded = self._arguments(job, plan)
        if decoded is None:
            return
        args, kwargs = decoded
        if job.cancelled:  # its cancel came while it waited for a runner
            self._write_cancelled(job)
            return
        if c.deliveries > 1 + c.attempts:
            self._m_redelivered.labels(c.unit).inc()
        job.started = started = time.monotonic()
        self._event("started", c)
        plan.flight.inc()
        tracer = self._tracing.tracer()
        try:
            try:
                if tracer is not None:
                    value = self._traced(tracer, job, spec, args, kwargs)
                elif plan.on_thread:  # the common case: straight to the function
                    value = self._on_thread(job, spec.fn, args, kwargs)
                else:
                    value = self._invoke(job, spec, args, kwargs)
            finally:
                if job.progress is not None:
                    self._write_progress(job)  # the last record, before the outcome ends the delivery
        except BaseException as exc:
            exc = self._as_timeout(job, spec, exc)
            self._record_failure(job, exc, spec)
        else:
            self._record_success(job, plan, value)
        finally:
            plan.flight.dec()
            plan.duration.observe(time.monotonic() - started)

    def _plan(self, job: _Job) -> _Plan | None:
        """The job's unit's :class:`_Plan`, made on its first job (``None``: an unknown
        unit, dead-lettered by :meth:`_spec`)."""
        c = job.claimed
        spec = self._spec(job)
        if spec is None:
            return None
        plan = self._plans[c.unit] = _Plan(spec, self._series(c.unit, spec.decision.model))
        return plan

    def _series(self, unit: str, model: str) -> tuple[Gauge, Histogram, Counter]:
        """The in-flight, duration and completed series of ``(unit, model)``, looked up
        once (three label lookups per job otherwise)."""
        got = self._unit_series.get((unit, model))
        if got is None:
            got = (
                self._m_flight.labels(unit, model),
                self._m_duration.labels(unit, model),
                self._m_done.labels(unit, model),
            )
            self._unit_series[(unit, model)] = got
        return got

    def _traced(
        self, tracer: Tracer, job: _Job, spec: UnitSpec, args: list[Any], kwargs: dict[str, Any]
    ) -> Any:
        """:meth:`_invoke` in a *process* span, child of the context the job was submitted
        in (after a *wait* span for its time in the queue, on its first delivery)."""
        c = job.claimed
        attributes = {
            **decision_attributes(c.unit, spec.decision),
            "messaging.system": self._system,
            "messaging.destination.name": c.queue,
            "messaging.message.id": c.id,
            "foundry.job.delivery": c.deliveries,
            "foundry.job.attempt": c.attempts + 1,
        }
        if c.deliveries == 1:
            tracer.waited(f"wait {c.unit}", c.trace, c.enqueued_at, attributes)
        attributes["messaging.operation"] = attributes["messaging.operation.type"] = "process"
        with tracer.process(f"process {c.unit}", c.trace, attributes):
            return self._invoke(job, spec, args, kwargs)

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

    def _record_success(self, job: _Job, plan: _Plan, value: Any) -> None:
        c = job.claimed
        spec = plan.spec
        try:
            codec = plan.codec if plan.codec is not None else get_codec(plan.declared)
            typed = plan.types.dump_result(value, what=f"the result of job {c.id}")
            data = codec.encode(typed if codec.name == "json" else value, unit=c.unit, what="the result")
            limit = plan.limit
            if len(data) > limit:
                raise too_large(
                    f"unit {c.unit!r}",
                    f"the result of job {c.id}",
                    len(data),
                    limit,
                    stored="the job failed and the result was not stored",
                    fix=RESULT_FIX,
                )
        except SubmitError as exc:  # (PayloadTooLargeError too): not worth a retry
            self._record_failure(job, exc, spec, retry=False)
            return
        except Exception as exc:  # a unit's value must never stop the runner thread (and the worker)
            error = SubmitError(
                f"unit {c.unit!r}: the result of job {c.id} cannot be encoded with codec="
                f"{spec.traits.codec!r} ({type(exc).__name__}: {str(exc)[:200]}). Fix: return plain data "
                "(str, int, float, bool, None, list, dict), or a reference to where the data is"
            )
            error.__cause__ = exc
            self._record_failure(job, error, spec, retry=False)
            return
        if not self._take(job):
            return  # released on stop, or timed out: its outcome is no longer ours to write
        job.queue.ack(job, data, plan.model)

    def acked(self, job: _Job, model: str, written: bool | None) -> None:
        c = job.claimed
        if written:
            self._series(c.unit, model)[2].inc()
            self._event("succeeded", c)
        elif written is False and job.cancelled:
            self._m_cancelled.labels(c.unit).inc()
            self._event("cancelled", c, "it finished after its cancel was requested: its result was dropped")
        elif written is False:
            self._event(
                "lost",
                c,
                "a completion was already recorded (or its cancel was requested); this one was dropped",
            )

    def _record_failure(
        self, job: _Job, exc: BaseException, spec: UnitSpec | None, *, retry: bool = True
    ) -> None:
        if self._take(job):
            self._write_failure(job, exc, spec, retry=retry)

    def _write_failure(
        self, job: _Job, exc: BaseException, spec: UnitSpec | None, *, retry: bool = True
    ) -> None:
        c = job.claimed
        if job.cancelled:  # however it ended, it ends cancelled (the store would make it so anyway)
            # an async job's task, a future cancelled -- not our CancelledError (also a
            # cf.CancelledError), whose message says how the job was stopped
            stopped = isinstance(exc, cf.CancelledError | asyncio.CancelledError) and not isinstance(
                exc, CancelledError
            )
            self._end_cancelled(job, None if stopped else exc)
            return
        retry_on: tuple[type[BaseException] | str, ...] = spec.traits.retry_on if spec else ()
        base = (spec.traits.backoff if spec and spec.traits.backoff is not None else None) or self.backoff
        data = json.dumps(encode_error(exc)).encode()
        model = spec.decision.model if spec else "queue"
        detail = f"{type(exc).__name__}: {exc}"
        if retry and c.attempts < c.max_retries and retries_on(retry_on, exc):
            # retry number attempts+1: base · 2^attempts, capped, jittered in its upper half
            delay = Backoff(base, self.max_backoff, owner=c.unit).delay(c.attempts + 1)
            at = time.time() + delay
            if self.persist("retry", lambda: self.backend.fail(c.id, c.token, data, retry_at=at)):
                self._m_retries.labels(c.unit).inc()
                self._event("retry", c, f"{detail}; retry {c.attempts + 1}/{c.max_retries} in {delay:.2f}s")
            return
        if self.persist("failure", lambda: self.backend.fail(c.id, c.token, data)):
            self._m_failed.labels(c.unit, model).inc()
            self._event("timeout" if isinstance(exc, WorkTimeoutError) else "failed", c, detail)
