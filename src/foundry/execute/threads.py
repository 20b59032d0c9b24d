"""``threads`` and ``bounded_pool``: a fixed set of worker threads behind a bounded intake.

::

    @app.work(bound="io", concurrency=16, max_pending=64, overflow="reject")
    def fetch(url): ...

    handle = fetch.submit(url)      # OverloadError when 64 are already waiting
    fetch(url)                      # submit + wait

The two models share this implementation and differ in what the decision means:
``bounded_pool`` sizes a pool for a count of independent units (tens, not thousands);
``threads`` is the model for units that share state under locks.

**Size.** ``workers`` (the trait), else the size the decision chose from the load
(``decision.load.concurrency``: the units in flight, and for computing work no more
than the cores), else ``concurrency``, else ``os.cpu_count()`` for ``bound="cpu"`` and
``min(32, cpu + 4)`` otherwise. All workers start with the first
submission and live until ``close()``.

**Bounded intake.** At most ``max_pending`` units (default 4 × workers) wait for a
worker; what arrives beyond that meets the unit's ``overflow`` policy: ``"block"`` waits
for room up to the unit's ``latency`` (or 30 s) and then raises
:class:`~foundry.errors.OverloadError`; ``"reject"`` raises it at once (and counts
``foundry_pool_rejected_total``); ``"caller_runs"`` runs the unit in the submitting
thread — backpressure by making the producer do the work.

**Pool deadlock.** A pooled unit that waits on a handle of its *own* pool (``result()``
or ``exception()``) while every worker is already blocked the same way would wait for
ever: the awaited unit is queued behind the waiters, or running on a worker that is
itself waiting. The pool keeps the wait-for graph of its workers and raises
:class:`~foundry.errors.PoolDeadlockError` in the waiter that can never be satisfied —
at once, not after a timeout. The check is exact: it fires only when *every* worker of
the pool is blocked on an unfinished unit of the pool, and then only in the waiter
whose deadline comes first (an untimed wait has none), because until that deadline
nothing can finish. In a *timed* wait the error is a
:class:`~foundry.errors.PoolDeadlockTimeoutError`, which is also a
``ResultTimeoutError``: that wait could only have timed out, so it times out now and
says why, and code that handles timeouts keeps working. A nested wait that can
complete (a free worker remains, or the awaited unit is running on a worker that is not
waiting) never raises. Waits on other
pools' handles, or from ``await`` inside a worker, are not part of the graph.

**Timeouts and cancellation.** A Python thread cannot be stopped from outside. A unit
that exceeds its ``timeout`` (counted from its start) fails its handle with
:class:`~foundry.errors.WorkTimeoutError` at the deadline, and cancelling a running unit
fails it with :class:`~foundry.errors.CancelledError` at once; the function itself runs
on until it returns or calls :func:`foundry.execute.checkpoint`, which raises in it.
Its worker stays busy until then (``foundry_pool_busy`` shows it) and its late result
is discarded. A queued unit that is cancelled never starts.

Guarantees: each accepted unit runs at most once, and its handle is resolved exactly
once (value, its own exception, a timeout, or a cancellation); one unit's failure never
touches another's handle. Nothing is persisted: a crash of the process loses the queue.
``close(timeout)`` stops the intake, lets accepted work drain, and cancels (resolves
as :class:`~foundry.errors.CancelledError`) whatever had not started when time ran out.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Literal

from foundry.errors import (
    CancelledError,
    OverloadError,
    PoolDeadlockError,
    PoolDeadlockTimeoutError,
    SubmitError,
    WorkTimeoutError,
)
from foundry.execute._task import CANCELLED, QUEUED, RUNNING, SUCCEEDED, Task
from foundry.execute.instrument import (
    IdMaker,
    PoolGauges,
    UnitMetrics,
    check_in_process_options,
    drain_at_exit,
    forget,
    usable_cpus,
)
from foundry.handle import Handle
from foundry.observe.metrics import Registry
from foundry.runtime import RuntimeContext, SubmitOptions, UnitSpec

__all__ = [
    "Interrupt",
    "PoolRunner",
    "ThreadPool",
    "checkpoint",
    "default_workers",
    "interruptible",
    "make_runner",
    "swap_interrupt",
]

Policy = Literal["block", "reject", "caller_runs"]
DEFAULT_BLOCK_TIMEOUT = 30.0
PENDING_PER_WORKER = 4


def default_workers(bound: str | None) -> int:
    cpus = usable_cpus()
    return cpus if bound == "cpu" else min(32, cpus + 4)


class Interrupt:
    """A cooperative stop for work that runs in a thread outside a pool (a durable queue
    worker's job): once :meth:`stop` was called, :func:`checkpoint` raises its error in
    the thread that runs the work under :func:`interruptible`."""

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: BaseException | None = None

    def stop(self, error: BaseException) -> None:
        """Ask the work to stop with ``error`` (the first request wins)."""
        if self.error is None:
            self.error = error


class _Local(threading.local):
    pool: ThreadPool | None = None
    task: PoolTask | None = None
    interrupt: Interrupt | None = None


_local = _Local()


@contextlib.contextmanager
def interruptible(interrupt: Interrupt) -> Iterator[None]:
    """Run the body with ``interrupt`` as this thread's stop (see :func:`checkpoint`)."""
    previous = swap_interrupt(interrupt)
    try:
        yield
    finally:
        swap_interrupt(previous)


def swap_interrupt(interrupt: Interrupt | None) -> Interrupt | None:
    """Make ``interrupt`` this thread's stop and return the one it replaces: what
    :func:`interruptible` does, for a hot path that puts the previous one back in its
    own ``finally`` (a durable queue worker's runner, once per job) without a generator."""
    previous, _local.interrupt = _local.interrupt, interrupt
    return previous


def checkpoint() -> None:
    """Raise in a unit that was cancelled or timed out (a cooperative stop).

    Call it between steps of long work that runs on ``threads`` / ``bounded_pool``, or in
    a durable job that a queue worker runs on one of its threads: a thread cannot be
    interrupted from outside, so this is where it notices. Elsewhere it does nothing.
    """
    task = _local.task
    if task is not None and task.state != RUNNING:
        error = task.error
        if error is not None:
            raise error
    interrupt = _local.interrupt
    if interrupt is not None and interrupt.error is not None:
        raise interrupt.error


class PoolTask(Task):
    """A task of a :class:`ThreadPool`; its ``wait`` takes part in deadlock detection."""

    __slots__ = ()
    owner: ThreadPool

    def wait(self, timeout: float | None) -> bool:
        if self.state >= SUCCEEDED:
            return True
        pool = self.owner
        if _local.pool is pool and (timeout is None or timeout > 0):
            return pool._wait_as_worker(self, timeout)
        return super().wait(timeout)


class ThreadPool:
    """A fixed pool of worker threads with a bounded FIFO intake (see the module doc)."""

    def __init__(
        self,
        name: str,
        *,
        workers: int,
        max_pending: int,
        overflow: Policy = "block",
        block_timeout: float = DEFAULT_BLOCK_TIMEOUT,
        registry: Registry | None = None,
        model: str = "bounded_pool",
    ) -> None:
        if workers < 1 or max_pending < 1:
            raise ValueError(f"pool {name!r}: workers={workers} and max_pending={max_pending} must be ≥ 1")
        self.name = name
        self.workers = workers
        self.max_pending = max_pending
        self.overflow: Policy = overflow
        self.block_timeout = block_timeout
        self.model = model
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._queue: queue.SimpleQueue[PoolTask | None] = queue.SimpleQueue()
        self._pending: deque[PoolTask] = deque()  # mirrors the queue, in order, for depth and age
        self._depth = 0  # queued and not cancelled
        self._room_waiters = 0
        self._busy = 0
        self._threads: list[threading.Thread] = []
        self._idents: set[int] = set()
        self._waits: dict[int, tuple[PoolTask, float]] = {}  # worker -> (awaited task, deadline)
        self._doomed: dict[int, PoolDeadlockError] = {}
        self._events: dict[int, threading.Event] = {}
        self._closed = False
        self._started = False
        registry = registry if registry is not None else Registry()
        self.metrics = UnitMetrics(registry, name, model, in_flight=lambda: float(self._busy))
        self.gauges = PoolGauges(
            registry, name, depth=lambda: float(self._depth), oldest_age=self._oldest_age, busy=self.busy
        )
        drain_at_exit(self)

    # -- reading ---------------------------------------------------------------

    def busy(self) -> float:
        return float(self._busy)

    @property
    def depth(self) -> int:
        return self._depth

    def _oldest_age(self) -> float:
        with self._lock:
            for task in self._pending:
                if task.state == QUEUED:
                    return max(0.0, time.perf_counter() - task.enqueued)
        return 0.0

    # -- submitting -------------------------------------------------------------

    def submit_task(self, task: PoolTask) -> None:
        """Accept ``task`` or apply the overflow policy (raises, or runs it here)."""
        if not self.try_enqueue(task):
            self._overflow(task)

    def try_enqueue(self, task: PoolTask) -> bool:
        """Accept ``task`` if the intake has room; ``False`` when it is full."""
        with self._lock:
            if self._closed:
                raise SubmitError(
                    f"unit {self.name!r}: its pool is closed. Fix: submit before app.close() / pool.close()"
                )
            if self._depth >= self.max_pending:
                return False
            self._enqueue(task)
            if not self._started:
                self._start()
            return True

    def _enqueue(self, task: PoolTask) -> None:
        """Under the lock."""
        self._depth += 1
        task.enqueued = time.perf_counter()
        self._pending.append(task)
        self._queue.put(task)

    def _overflow(self, task: PoolTask) -> None:
        if self.overflow == "reject":
            self.gauges.rejected.inc()
            raise OverloadError(
                f"unit {self.name!r}: the pool's intake is full ({self.max_pending} waiting for "
                f"{self.workers} workers) and overflow='reject'. Fix: retry later, raise max_pending or "
                "workers, or declare overflow='block' to wait for room"
            )
        if self.overflow == "caller_runs":
            self.run_here(task)
            return
        deadline = time.monotonic() + self.block_timeout
        with self._lock:
            self._room_waiters += 1
            try:
                while not self._closed and self._depth >= self.max_pending:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self.gauges.rejected.inc()
                        raise OverloadError(
                            f"unit {self.name!r}: the pool's intake stayed full ({self.max_pending} waiting "
                            f"for {self.workers} workers) for {self.block_timeout}s with overflow='block'. "
                            "Fix: add workers, raise max_pending, or slow the producer"
                        )
                    self._room.wait(left)
                if self._closed:
                    raise SubmitError(f"unit {self.name!r}: the pool closed while this submission waited")
                self._enqueue(task)
            finally:
                self._room_waiters -= 1

    def run_here(self, task: PoolTask) -> None:
        """Run ``task`` in the calling thread (``caller_runs``)."""
        if not task.start():
            return
        started = time.perf_counter()
        try:
            value = task.fn(*task.args, **task.kwargs)
        except BaseException as exc:
            self.metrics.fail(time.perf_counter() - started)
            task.finish(error=exc)
            if not isinstance(exc, Exception):
                raise
            return
        now = time.perf_counter()
        self.metrics.ok(now - started, now)
        task.finish(value)

    def _start(self) -> None:
        """Under the lock: start every worker."""
        self._started = True
        for number in range(self.workers):
            thread = threading.Thread(target=self._work, name=f"foundry-{self.name}-{number}", daemon=True)
            self._threads.append(thread)
            thread.start()

    # -- the workers ---------------------------------------------------------------

    def _work(self) -> None:
        _local.pool = self
        with self._lock:
            self._idents.add(threading.get_ident())
        get, get_nowait = self._queue.get, self._queue.get_nowait
        lock, pending, metrics = self._lock, self._pending, self.metrics
        perf = time.perf_counter
        try:
            while True:
                try:
                    task = get_nowait()
                except queue.Empty:
                    metrics.flush()  # idle: publish what was buffered
                    task = get()
                if task is None:
                    return
                with lock:
                    pending.popleft()
                    if not task.start_locked():  # cancelled while queued: its room was freed then
                        continue
                    self._depth -= 1
                    self._busy += 1
                    if self._room_waiters:
                        self._room.notify()
                started = perf()
                task.started = started
                if task.timeout is not None:
                    _timers.schedule(started + task.timeout, task, self._expire)
                _local.task = task
                error: BaseException | None = None
                value: Any = None
                try:
                    value = task.fn(*task.args, **task.kwargs)
                except BaseException as exc:
                    error = exc
                _local.task = None
                now = perf()
                with lock:
                    self._busy -= 1
                    callbacks = task.finish_locked(value, error)
                    if self._closed and not self._busy and not self._depth:
                        self._room.notify_all()  # close() waits for the drain
                if callbacks is not None:  # None: it was cancelled or timed out; the late outcome is dropped
                    if error is None:
                        metrics.ok(now - started, now)
                    else:
                        metrics.fail(now - started)
                    for callback in callbacks:
                        callback()
                del task, value, error
        finally:
            with self._lock:
                self._idents.discard(threading.get_ident())

    def _expire(self, task: PoolTask) -> None:
        """The timer thread: ``task`` ran past its timeout."""
        if task.state != RUNNING:
            return
        took = time.perf_counter() - task.started
        error = WorkTimeoutError(
            f"unit {self.name!r} ran {took:.3f}s, past its timeout of {task.timeout}s; its handle failed "
            "now, and the thread runs on until the function returns or calls "
            "foundry.execute.checkpoint(). Fix: raise timeout=, call checkpoint() in long loops, or "
            "declare model='processes' so a timeout kills the work"
        )
        if task.finish(error=error):
            self.metrics.fail(took)

    # -- cancellation -----------------------------------------------------------------

    def cancel_task(self, task: Task) -> bool:
        with self._lock:
            state = task.state
            if state >= SUCCEEDED:
                return state == CANCELLED
            if state == QUEUED:
                self._depth -= 1
                if self._room_waiters:
                    self._room.notify()
                message = "the work was cancelled before it started"
            else:
                message = (
                    "the work was cancelled while running; its thread runs on until the function "
                    "returns or calls foundry.execute.checkpoint()"
                )
            callbacks = task.finish_locked(None, CancelledError(f"unit {self.name!r}: {message}"))
        for callback in callbacks or ():
            callback()
        return True

    # -- deadlock detection -------------------------------------------------------------

    def _wait_as_worker(self, task: PoolTask, timeout: float | None) -> bool:
        """A worker of this pool waits on ``task`` (of this pool): wait, unless that can
        never end, in which case raise :class:`PoolDeadlockError`."""
        me = threading.get_ident()
        if task is _local.task:
            raise PoolDeadlockError(
                f"unit {self.name!r}: a unit waited on its own handle, which can never finish while "
                "it waits. Fix: return the value instead of waiting on yourself"
            )
        event = threading.Event()
        deadline = float("inf") if timeout is None else time.monotonic() + timeout
        with self._lock:
            if not task.add_done_callback_locked(event.set):
                return True  # finished already
            self._waits[me] = (task, deadline)
            self._events[me] = event
            victim = self._deadlocked()
            if victim is not None:
                self._doomed[victim] = self._deadlock_error(victim)
                self._events[victim].set()
        try:
            event.wait(timeout)
        finally:
            with self._lock:
                self._waits.pop(me, None)
                self._events.pop(me, None)
                doom = self._doomed.pop(me, None)
                task.remove_done_callback_locked(event.set)
        if doom is not None and task.state < SUCCEEDED:
            raise doom
        return task.state >= SUCCEEDED

    def _deadlocked(self) -> int | None:
        """Under the lock: if every worker waits on an unfinished task of this pool, the
        waiter that can never be satisfied (earliest deadline); else ``None``."""
        if len(self._idents) < self.workers or len(self._waits) < self.workers:
            return None  # a worker is free (or still starting): it will take the queued work
        for ident in self._idents:
            entry = self._waits.get(ident)
            if entry is None or entry[0].state >= SUCCEEDED or ident in self._doomed:
                return None
        return min(self._waits, key=lambda ident: self._waits[ident][1])

    def _deadlock_error(self, ident: int) -> PoolDeadlockError:
        awaited, deadline = self._waits[ident]
        where = "queued behind the waiters" if awaited.state == QUEUED else "running on a waiting worker"
        # A timed wait could only have ended by timing out: it times out now, and says why.
        kind = PoolDeadlockError if deadline == float("inf") else PoolDeadlockTimeoutError
        return kind(
            f"unit {self.name!r}: pool deadlock — all {len(self._idents)} workers are waiting on units of "
            f"this same pool ({self._depth} queued), and the awaited unit is {where}: nothing can ever "
            "finish. Fix: don't wait on the pool from inside it (return the handle, or chain the work), "
            "raise workers, or run the inner unit on another unit's pool (declare waits_on_pool=True "
            "to see the decision's advice)"
        )

    # -- closing -----------------------------------------------------------------------

    def close(self, timeout: float = 10.0) -> None:
        """Stop the intake, drain accepted work within ``timeout``, cancel what is left."""
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._room.notify_all()
            if _local.pool is not self:  # a worker closing its own pool cannot wait for itself
                while self._depth or self._busy:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._room.wait(left)
            leftovers = [t for t in self._pending if t.state == QUEUED]
        for task in leftovers:
            self.cancel_task(task)
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        self._threads = [t for t in self._threads if t.is_alive()]
        self.metrics.close()
        self.gauges.close()
        forget(self)


# -- timers for per-unit timeouts ---------------------------------------------------------


class _Timers:
    """One daemon thread firing ``callback(task)`` at deadlines (``perf_counter`` clock)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Any, Callable[[Any], None]]] = []
        self._cond = threading.Condition()
        self._seq = 0
        self._thread: threading.Thread | None = None

    def schedule(self, due: float, task: Any, callback: Callable[[Any], None]) -> None:
        with self._cond:
            self._seq += 1
            heapq.heappush(self._heap, (due, self._seq, task, callback))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="foundry-timers", daemon=True)
                self._thread.start()
            if self._heap[0][1] == self._seq:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.perf_counter():
                    wait = None if not self._heap else self._heap[0][0] - time.perf_counter()
                    self._cond.wait(wait)
                _, _, task, callback = heapq.heappop(self._heap)
            try:
                callback(task)
            except Exception:  # a timer callback must not kill the timer thread
                continue


_timers = _Timers()


# -- the runner ------------------------------------------------------------------------------


class PoolRunner:
    """Runs a ``threads`` or ``bounded_pool`` unit on its own :class:`ThreadPool`."""

    def __init__(self, spec: UnitSpec, ctx: RuntimeContext, model: str = "bounded_pool") -> None:
        traits = spec.traits
        workers = (
            traits.workers
            or spec.decision.load.concurrency
            or traits.concurrency
            or default_workers(traits.bound)
        )
        self.spec = spec
        self.model = model
        self.timeout = traits.timeout
        self.pool = ThreadPool(
            spec.name,
            workers=workers,
            max_pending=traits.max_pending or PENDING_PER_WORKER * workers,
            overflow=traits.overflow,
            block_timeout=traits.latency if traits.latency is not None else DEFAULT_BLOCK_TIMEOUT,
            registry=ctx.metrics,
            model=model,
        )
        self._ids = IdMaker("thr" if model == "threads" else "bp")
        self.map_window = workers + self.pool.max_pending

    def _task(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> PoolTask:
        if (
            options.key is not None
            or options.delay is not None
            or options.eta is not None
            or options.priority
        ):
            check_in_process_options(self.spec.name, self.model, options)
        if self.spec.is_async:
            fn: Callable[..., Any] = _run_coroutine(self.spec.fn)
        else:
            fn = self.spec.fn
        timeout = options.timeout if options.timeout is not None else self.timeout
        return PoolTask(self.pool, fn, args, kwargs, timeout)

    def submit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        task = self._task(args, kwargs, options)
        self.pool.submit_task(task)
        return Handle(self._ids(), self.spec.name, task)

    def try_submit(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions
    ) -> Handle | None:
        """Accept without blocking; ``None`` when the intake is full (per-key lanes)."""
        task = self._task(args, kwargs, options)
        if not self.pool.try_enqueue(task):
            return None
        return Handle(self._ids(), self.spec.name, task)

    async def asubmit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        task = self._task(args, kwargs, options)
        if not self.pool.try_enqueue(task):
            # full: blocking for room, or running it here, would hold the loop; do it off the loop
            await asyncio.to_thread(self.pool.submit_task, task)
        return Handle(self._ids(), self.spec.name, task)

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        handle = self.submit(args, kwargs, _NO_OPTIONS)
        return handle.result()

    def close(self, timeout: float = 10.0) -> None:
        self.pool.close(timeout)


_NO_OPTIONS = SubmitOptions()


def _run_coroutine(fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(fn(*args, **kwargs))

    return run


def make_runner(spec: UnitSpec, ctx: RuntimeContext) -> PoolRunner:
    """The ``threads`` or ``bounded_pool`` runner for ``spec`` (its decision says which)."""
    execution = spec.decision.execution
    return PoolRunner(
        spec, ctx, model=execution if execution in ("threads", "bounded_pool") else "bounded_pool"
    )
