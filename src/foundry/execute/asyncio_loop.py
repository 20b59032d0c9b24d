"""``async``: coroutines on an event loop, bounded by permits.

::

    @app.work(bound="io", concurrency=300, est="40ms")
    async def handle_payment(req): ...

    await handle_payment(req)                # from async code: runs in *your* task
    handle = await handle_payment.asubmit(req)   # a task on your loop, with a Handle
    handle = handle_payment.submit(req)      # from sync code: on Foundry's managed loop
    handle_payment(req)                      # from sync code: submit + wait

**Which loop.** Async callers run the work on their own running loop (so it can use the
caller's connections and context); sync callers use one managed loop per process in a
daemon thread (``uvloop`` when it is installed), started on first use and stopped when
the last runner that used it closes. ``foundry.loop()`` is the public handle on it (and
keeps it for the life of the process).

**Watched.** The managed loop runs a loop-lag monitor and the starvation watchdog
(``foundry.observe.watchdog``) unless the app's ``watchdog`` setting is off: its lag is
``foundry_loop_lag_seconds{loop="foundry"}`` in the registry of every app whose async
units ran on it, and a stall names the unit whose code held the loop. It is one loop
for the process: watched as soon as one app that uses it wants it watched.

**Permits.** At most ``workers`` units of a unit run at once — else the permits the
decision sized from the load (``decision.load.concurrency``), else ``concurrency``,
else 100 — across
every loop that submits them. ``await unit(x)`` with a free permit runs the coroutine
inline in the caller's task — no extra task, no future — which is what makes the model
cost about as much as ``asyncio.Semaphore`` + ``gather``. Waiters get permits in FIFO
order. Handles submitted beyond the permits wait in a bounded intake (``max_pending``,
default 4 × permits); past that the unit's ``overflow`` policy applies (``block`` waits
for room up to ``latency`` or 30 s, ``reject`` raises
:class:`~foundry.errors.OverloadError`, ``caller_runs`` runs it in the caller).

**Structure and cancellation.** Cancelling a handle cancels its asyncio task; the handle
resolves (with :class:`~foundry.errors.CancelledError`) once the coroutine has unwound,
so :func:`foundry.execute.scope` never returns while one of its tasks is still running.
Cancelling the caller of ``await unit(x)`` cancels the work (it runs in the caller's
task). A unit's ``timeout`` is ``asyncio.timeout`` around the coroutine: the coroutine is
cancelled and the handle fails with :class:`~foundry.errors.WorkTimeoutError`.

**Plain functions.** A ``def`` (not ``async def``) unit decided ``async`` runs through
``asyncio.to_thread`` under the same permits: it cannot block the loop, but a timeout
can only stop the *wait* for it, not the thread (logged once per unit).

**Blocking on the loop.** ``handle.result()`` called on the very loop thread that runs
the task can never return; it raises :class:`~foundry.errors.PoolDeadlockError` at once
(``await handle`` is the fix).

Guarantees: each accepted unit runs at most once and its handle resolves exactly once;
one unit's failure never touches another. Nothing is persisted; a crash of the process
loses the tasks in flight and the intake.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from foundry.errors import CancelledError, OverloadError, PoolDeadlockError, SubmitError, WorkTimeoutError
from foundry.execute._task import QUEUED, SUCCEEDED, Task
from foundry.execute.instrument import (
    IdMaker,
    PoolGauges,
    UnitMetrics,
    check_in_process_options,
    drain_at_exit,
    forget,
)
from foundry.handle import Handle
from foundry.observe.metrics import Registry
from foundry.runtime import RuntimeContext, SubmitOptions, UnitSpec

if TYPE_CHECKING:
    from foundry.observe.watchdog import LoopMonitor, StallReport, UnitLike, Watchdog

__all__ = ["AsyncRunner", "CallerLoop", "LoopThread", "make_runner", "managed_loop"]

T = TypeVar("T")

log = logging.getLogger("foundry.execute")

MODEL = "async"
DEFAULT_PERMITS = 100
PENDING_PER_PERMIT = 4
DEFAULT_BLOCK_TIMEOUT = 30.0
CANCEL_GRACE = 2.0


# -- the managed loop ------------------------------------------------------------------------


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when it is installed, else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class LoopThread:
    """An event loop running forever in a daemon thread, watched.

    ``foundry.loop()`` returns the process's managed one: ``.loop`` is the running
    ``asyncio`` loop, ``.run(coro)`` / ``.submit(coro)`` run a coroutine on it from any
    other thread, and ``.watchdog`` / ``.monitor`` / ``.lag()`` / ``.reports`` are its
    loop-lag monitor and starvation watchdog (``None`` / empty when the watchdog is off).
    """

    def __init__(
        self,
        name: str = "foundry-loop",
        *,
        label: str = "foundry",
        watchdog: float | None = None,
        registry: Registry | None = None,
        units: Iterable[UnitLike] = (),
    ) -> None:
        self.name = name
        self.label = label  # the loop= label of its metrics
        self.loop = new_event_loop()
        self.watchdog: Watchdog | None = None
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()
        self._ready.wait(10.0)
        if watchdog is not None:
            self.watch(watchdog, registry=registry, units=units)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        try:
            self.loop.run_forever()
        finally:
            if self.watchdog is not None:
                self.watchdog.stop()
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    # -- the watchdog -----------------------------------------------------------------------

    def watch(
        self, threshold: float, *, registry: Registry | None = None, units: Iterable[UnitLike] = ()
    ) -> Watchdog:
        """Start the watchdog (when it is not running yet, with ``threshold``), show its
        series in ``registry`` and attribute stalls to ``units``."""
        from foundry.observe.watchdog import Watchdog

        with self._lock:
            dog = self.watchdog
            if dog is None:
                dog = Watchdog(self.loop, registry=registry, name=self.label, threshold=threshold)
                self.watchdog = dog.start()
        dog.watch(*units)
        if registry is not None:
            dog.export(registry)
        return dog

    @property
    def monitor(self) -> LoopMonitor | None:
        """The loop-lag monitor (``None`` when the watchdog is off)."""
        return None if self.watchdog is None else self.watchdog.monitor

    def lag(self) -> dict[str, float]:
        """Loop lag so far: ``{"count", "sum", "p50", "p99", "max"}`` in seconds
        (empty when the watchdog is off)."""
        return {} if self.watchdog is None else self.watchdog.monitor.summary()

    @property
    def reports(self) -> list[StallReport]:
        """The watchdog's recent stall reports, oldest first."""
        return [] if self.watchdog is None else list(self.watchdog.reports)

    # -- running coroutines on it ----------------------------------------------------------

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop from another thread; its future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (from another thread). With
        ``timeout`` the coroutine is cancelled when it runs longer (``TimeoutError``)."""
        if _running_loop() is self.loop:
            coro.close()
            raise PoolDeadlockError(
                f"{self.name}: run() was called on the loop's own thread, which would wait for "
                "work that can only run once it returns. Fix: `await` the coroutine instead"
            )
        work = coro if timeout is None else asyncio.wait_for(coro, timeout)
        return asyncio.run_coroutine_threadsafe(work, self.loop).result()

    def stop(self, timeout: float = 5.0) -> None:
        if self.loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._cancel_all)
        self.thread.join(timeout)

    def _cancel_all(self) -> None:
        tasks = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        for task in tasks:
            task.cancel()
        if not tasks:
            self.loop.stop()
            return

        async def settle() -> None:
            await asyncio.wait(tasks, timeout=CANCEL_GRACE)
            self.loop.stop()

        self.loop.create_task(settle())

    def __repr__(self) -> str:
        state = "closed" if self.loop.is_closed() else "running" if self.loop.is_running() else "starting"
        watched = "off" if self.watchdog is None else f"{self.watchdog.threshold * 1e3:.0f} ms"
        return f"<LoopThread {self.name!r} {state}, watchdog {watched}>"


class CallerLoop:
    """An event loop that its owner thread runs one coroutine at a time
    (``run_until_complete``: a stream consumer's thread for its ``async def`` handler),
    watched while it runs — the time it sits stopped between calls is not lag."""

    def __init__(
        self,
        *,
        label: str,
        watchdog: float | None,
        registry: Registry | None = None,
        units: Iterable[UnitLike] = (),
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self.watchdog: Watchdog | None = None
        if watchdog is not None:
            from foundry.observe.watchdog import Watchdog

            dog = Watchdog(self.loop, registry=registry, name=label, threshold=watchdog, units=units)
            self.watchdog = dog.start(paused=True)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        dog = self.watchdog
        if dog is None:
            return self.loop.run_until_complete(coro)
        dog.resume()
        try:
            return self.loop.run_until_complete(coro)
        finally:
            dog.pause()

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        self.loop.close()


_managed: LoopThread | None = None
_managed_users = 0
_managed_pinned = False
_managed_lock = threading.Lock()


def managed_loop(*, pin: bool = False) -> LoopThread:
    """The process's managed loop (started on first use; one user more until released,
    or for the life of the process with ``pin``)."""
    global _managed, _managed_users, _managed_pinned
    with _managed_lock:
        if _managed is None or _managed.loop.is_closed() or not _managed.thread.is_alive():
            _managed = LoopThread()
            _managed_pinned = False
        if pin:
            if not _managed_pinned:
                _managed_pinned = True
                _managed_users += 1
        else:
            _managed_users += 1
        return _managed


def release_managed_loop() -> None:
    global _managed, _managed_users
    with _managed_lock:
        _managed_users = max(0, _managed_users - 1)
        if _managed_users or _managed is None:
            return
        loop_thread, _managed = _managed, None
    loop_thread.stop()


@atexit.register
def _stop_managed() -> None:
    with _managed_lock:
        loop_thread = _managed
    if loop_thread is not None:
        loop_thread.stop(2.0)


_running_loop: Callable[[], asyncio.AbstractEventLoop | None] = asyncio._get_running_loop
"""This thread's running loop, or ``None`` (asyncio's C helper: no exception to raise and catch
on the permit path, which asks it once per grant)."""


# -- tasks and permits ----------------------------------------------------------------------------


class AsyncTask(Task):
    """A unit accepted by the async model; it knows its loop and, once started, its task."""

    __slots__ = ("aio", "in_intake", "loop", "loop_thread")

    def __init__(
        self, owner: AsyncRunner, args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None
    ):
        super().__init__(owner, owner.fn, args, kwargs, timeout)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_thread = 0
        self.in_intake = False  # waiting in the bounded intake for a permit
        self.aio: asyncio.Task[Any] | None = None

    def wait(self, timeout: float | None) -> bool:
        if (
            self.state < SUCCEEDED
            and self.loop_thread == threading.get_ident()
            and self.loop is not None
            and self.loop.is_running()
        ):
            raise PoolDeadlockError(
                f"unit {self.owner.name!r}: handle.result() was called on the event loop thread that runs "  # type: ignore[attr-defined]
                "this very task, which can never run while the loop is blocked waiting for it. "
                "Fix: `await handle` (or `await handle.aresult(timeout)`) instead"
            )
        return super().wait(timeout)


_WAITING, _GRANTED, _WITHDRAWN = range(3)


class _Inline:
    """A caller of ``await unit(x)`` waiting for a permit."""

    __slots__ = ("future", "loop", "state")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()
        self.state = _WAITING


class AsyncRunner:
    """Runs an ``async`` unit (see the module docstring)."""

    model = MODEL

    def __init__(self, spec: UnitSpec, ctx: RuntimeContext) -> None:
        traits = spec.traits
        self.spec = spec
        self.name = spec.name
        self.fn = spec.fn
        self.is_coroutine = spec.is_async
        self.permits = (
            traits.workers or spec.decision.load.concurrency or traits.concurrency or DEFAULT_PERMITS
        )
        self.max_pending = traits.max_pending or PENDING_PER_PERMIT * self.permits
        self.overflow = traits.overflow
        self.block_timeout = traits.latency if traits.latency is not None else DEFAULT_BLOCK_TIMEOUT
        self.timeout = traits.timeout
        # ``await unit(x)`` awaits the coroutine itself, timed inline (no timeout to arm)
        self._inline_plain = self.timeout is None and self.is_coroutine
        self.map_window = self.permits + self.max_pending
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._running = 0  # permits held
        self._waiting: deque[AsyncTask | _Inline] = deque()  # FIFO for permits
        self._queued = 0  # AsyncTasks in _waiting, not cancelled (the bounded intake)
        self._inline_waiting = 0
        self._room_waiters = 0  # sync submitters blocked on a full intake
        self._async_room: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()
        self._live: set[AsyncTask] = set()
        self._closed = False
        self._managed: LoopThread | None = None
        self._managed_lock = threading.Lock()
        self._watchdog = ctx.settings.watchdog
        self._registry = ctx.metrics
        self._warned_thread_timeout = False
        self._ids = IdMaker("aio")
        self.metrics = UnitMetrics(ctx.metrics, spec.name, MODEL, in_flight=lambda: float(self._running))
        self.gauges = PoolGauges(
            ctx.metrics,
            spec.name,
            depth=lambda: float(self._queued + self._inline_waiting),
            oldest_age=self._oldest_age,
            busy=lambda: float(self._running),
        )
        drain_at_exit(self)
        if not self.is_coroutine:
            log.info(
                "unit %r is a plain function on the async model: it runs in threads (asyncio.to_thread) "
                "under %d permits. Declare it `async def` to run on the loop itself",
                spec.name,
                self.permits,
            )

    def _oldest_age(self) -> float:
        now = time.perf_counter()
        with self._lock:
            for item in self._waiting:
                if isinstance(item, AsyncTask) and item.state == QUEUED:
                    return max(0.0, now - item.enqueued)
        return 0.0

    # -- the work itself ---------------------------------------------------------------

    def _coroutine(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Coroutine[Any, Any, Any]:
        if self.is_coroutine:
            return self.fn(*args, **kwargs)  # type: ignore[no-any-return]
        return asyncio.to_thread(self.fn, *args, **kwargs)

    async def _execute(self, args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None) -> Any:
        """Run the unit once in the current task, with its timeout and its metrics."""
        started = time.perf_counter()
        try:
            if timeout is None:
                value = await self._coroutine(args, kwargs)
            else:
                value = await self._timed(args, kwargs, timeout, started)
        except BaseException:
            self.metrics.fail(time.perf_counter() - started)
            raise
        now = time.perf_counter()
        self.metrics.ok(now - started, now)
        return value

    async def _timed(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float, started: float
    ) -> Any:
        if not self.is_coroutine and not self._warned_thread_timeout:
            self._warned_thread_timeout = True
            log.warning(
                "unit %r: a timeout on a plain function run by the async model stops the wait, not the "
                "thread. Fix: declare it `async def`, or model='processes' to kill it",
                self.name,
            )
        window = asyncio.timeout(timeout)
        try:
            async with window:
                return await self._coroutine(args, kwargs)
        except TimeoutError as exc:
            if not window.expired():
                raise  # the work's own TimeoutError
            raise WorkTimeoutError(
                f"unit {self.name!r} ran {time.perf_counter() - started:.3f}s, past its timeout of "
                f"{timeout}s, and was cancelled. Fix: raise timeout=, or find the slow await"
            ) from exc

    # -- permits ------------------------------------------------------------------------

    def _release(self) -> None:
        """Give the permit to the next waiter (FIFO), or free it."""
        grant: AsyncTask | _Inline | None = None
        with self._lock:
            while self._waiting:
                item = self._waiting.popleft()
                if isinstance(item, AsyncTask):
                    if not item.in_intake:  # cancelled while it waited
                        continue
                    item.in_intake = False
                    self._queued -= 1
                else:
                    if item.state != _WAITING:  # its caller gave up
                        continue
                    item.state = _GRANTED
                    self._inline_waiting -= 1
                grant = item
                break
            if grant is None:
                self._running -= 1
            if (self._room_waiters or self._async_room) and not isinstance(grant, _Inline):
                self._wake_room()  # a permit or a place in the intake came free
        if grant is None:
            return
        if type(grant) is _Inline and grant.loop is _running_loop():  # the common case, inline
            if not grant.future.done():
                grant.future.set_result(None)
            return
        self._grant(grant)

    def _wake_room(self) -> None:
        """Under the lock: tell one submitter blocked on a full intake to retry."""
        if self._room_waiters:
            self._room.notify()
        while self._async_room:
            loop, future = self._async_room.popleft()
            if not future.done():
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_set_none, future)
                break

    def _grant(self, item: AsyncTask | _Inline) -> None:
        """A permit was assigned to ``item``: start it (on its own loop)."""
        loop = item.loop
        assert loop is not None
        here = _running_loop() is loop
        if isinstance(item, _Inline):
            if here:
                _set_none(item.future)
            else:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_set_none, item.future)
            return
        if here:
            self._spawn(item)
        else:
            try:
                loop.call_soon_threadsafe(self._spawn, item)
            except RuntimeError:  # that loop is gone: nothing can run this task
                item.finish(error=CancelledError(f"unit {self.name!r}: the loop that would run it closed"))
                self._release()

    def _spawn(self, task: AsyncTask) -> None:
        """On the task's loop: create the asyncio task."""
        task.aio = asyncio.get_running_loop().create_task(self._run(task), name=f"{self.name}:{id(task):x}")

    async def _run(self, task: AsyncTask) -> None:
        try:
            if not task.start():
                return
            try:
                value = await self._execute(task.args, task.kwargs, task.timeout)
            except asyncio.CancelledError:
                task.finish(error=CancelledError(f"unit {self.name!r}: the task was cancelled"))
            except BaseException as exc:
                task.finish(error=exc)
            else:
                task.finish(value)
        finally:
            self._live.discard(task)
            self._release()

    # -- intake ---------------------------------------------------------------------------

    def _task(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> AsyncTask:
        if options is not _NO_OPTIONS:
            check_in_process_options(self.name, MODEL, options)
        timeout = options.timeout if options.timeout is not None else self.timeout
        return AsyncTask(self, args, kwargs, timeout)

    def _try_accept(self, task: AsyncTask, loop: tuple[asyncio.AbstractEventLoop, int]) -> bool:
        """Take a permit or a place in the intake; ``False`` when both are full."""
        with self._lock:
            if self._closed:
                raise SubmitError(f"unit {self.name!r}: its runner is closed. Fix: submit before app.close()")
            task.loop, task.loop_thread = loop
            task.enqueued = time.perf_counter()
            if self._running < self.permits and not self._waiting:
                self._running += 1
                self._live.add(task)
                granted = True
            elif self._queued < self.max_pending:
                self._waiting.append(task)
                task.in_intake = True
                self._queued += 1
                self._live.add(task)
                granted = False
            else:
                return False
        if granted:
            self._grant(task)
        return True

    def _overflow_error(self, waited: float | None = None) -> OverloadError:
        self.gauges.rejected.inc()
        if waited is None:
            return OverloadError(
                f"unit {self.name!r}: {self.permits} permits are taken and {self.max_pending} units wait "
                "(overflow='reject'). Fix: retry later, raise concurrency or max_pending, or declare "
                "overflow='block'"
            )
        return OverloadError(
            f"unit {self.name!r}: the intake stayed full ({self.permits} permits, {self.max_pending} "
            f"waiting) for {waited}s with overflow='block'. Fix: raise concurrency or max_pending, or "
            "slow the producer"
        )

    def _managed_loop(self) -> tuple[asyncio.AbstractEventLoop, int]:
        """The managed loop (this runner holds one use of it until close)."""
        with self._managed_lock:
            if self._managed is None:
                self._managed = managed_loop()
                if self._watchdog is not None:  # the app's setting (on by default)
                    self._managed.watch(self._watchdog, registry=self._registry, units=[self.spec])
            loop_thread = self._managed
        return loop_thread.loop, loop_thread.thread.ident or 0

    def _target_loop(self) -> tuple[asyncio.AbstractEventLoop, int]:
        """The caller's running loop, else the managed one."""
        loop = _running_loop()
        if loop is not None:
            return loop, threading.get_ident()
        return self._managed_loop()

    def submit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        task = self._task(args, kwargs, options)
        target = self._target_loop()
        if self._try_accept(task, target):
            return Handle(self._ids(), self.name, task)
        if target[0] is _running_loop() and self.overflow != "reject":
            raise OverloadError(
                f"unit {self.name!r}: the intake is full and submit() was called on the loop, where "
                f"overflow={self.overflow!r} (waiting for room, or running it here) would stall it. "
                "Fix: `await unit.asubmit(...)`, which waits for room without blocking the loop"
            )
        return self._blocking_submit(task, target)

    def try_submit(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions
    ) -> Handle | None:
        """Accept without blocking (on the caller's loop, else the managed one); ``None``
        when permits and intake are full (per-key lanes)."""
        task = self._task(args, kwargs, options)
        if not self._try_accept(task, self._target_loop()):
            return None
        return Handle(self._ids(), self.name, task)

    def _caller_runs(self, task: AsyncTask) -> Handle:
        task.start()
        try:
            value = asyncio.run(self._execute(task.args, task.kwargs, task.timeout))
        except Exception as exc:
            task.finish(error=exc)
        else:
            task.finish(value)
        return Handle(self._ids(), self.name, task)

    async def asubmit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        task = self._task(args, kwargs, options)
        loop = asyncio.get_running_loop()
        target = (loop, threading.get_ident())
        if self._try_accept(task, target):
            return Handle(self._ids(), self.name, task)
        if self.overflow == "reject":
            raise self._overflow_error()
        if self.overflow == "caller_runs":
            task.start()
            try:
                task.finish(await self._execute(task.args, task.kwargs, task.timeout))
            except Exception as exc:
                task.finish(error=exc)
            return Handle(self._ids(), self.name, task)
        deadline = time.monotonic() + self.block_timeout
        while not self._try_accept(task, target):
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._overflow_error(self.block_timeout)
            future: asyncio.Future[None] = loop.create_future()
            with self._lock:
                self._async_room.append((loop, future))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(future, min(left, 0.5))
        return Handle(self._ids(), self.name, task)

    async def acall(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``await unit(x)``: run in the caller's task once a permit is free. Beyond
        ``async with semaphore: await fn(x)`` it costs one lock round trip to take the
        permit (or a place in line), one to give it back, and two clock reads (the
        duration metric); no task, no extra coroutine."""
        ticket: _Inline | None = None
        refused = False
        with self._lock:
            if self._closed:
                raise SubmitError(
                    f"unit {self.name!r}: its runner is closed. Fix: call it before app.close()"
                )
            if self._running < self.permits and not self._waiting:
                self._running += 1
            elif self.overflow != "reject" or self._inline_waiting < self.max_pending:
                ticket = _Inline(asyncio.get_running_loop())
                self._waiting.append(ticket)
                self._inline_waiting += 1
            else:
                refused = True
        if refused:
            raise self._overflow_error()
        if ticket is not None:  # wait in line (FIFO) until _release grants the permit
            try:
                await ticket.future
            except BaseException:  # gave up first: withdraw, or pass on a permit granted meanwhile
                with self._lock:
                    granted = ticket.state == _GRANTED
                    if not granted:
                        ticket.state = _WITHDRAWN  # _release skips it
                        self._inline_waiting -= 1
                if granted:
                    self._release()
                raise
        if not self._inline_plain:
            try:
                return await self._execute(args, kwargs, self.timeout)
            finally:
                self._release()
        started = time.perf_counter()
        try:
            value = await self.fn(*args, **kwargs)
        except BaseException:
            self.metrics.fail(time.perf_counter() - started)
            raise
        finally:
            self._release()
        now = time.perf_counter()
        self.metrics.ok(now - started, now)
        return value

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``unit(x)`` from sync code: on the managed loop, and wait for the result."""
        task = self._task(args, kwargs, _NO_OPTIONS)
        target = self._managed_loop()
        if self._try_accept(task, target):
            handle = Handle(self._ids(), self.name, task)
        else:
            handle = self._blocking_submit(task, target)
        return handle.result()

    def _blocking_submit(self, task: AsyncTask, loop: tuple[asyncio.AbstractEventLoop, int]) -> Handle:
        if self.overflow == "reject":
            raise self._overflow_error()
        if self.overflow == "caller_runs":
            return self._caller_runs(task)
        deadline = time.monotonic() + self.block_timeout
        while not self._try_accept(task, loop):
            with self._room:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._overflow_error(self.block_timeout)
                self._room_waiters += 1
                try:
                    self._room.wait(min(left, 0.5))
                finally:
                    self._room_waiters -= 1
        return Handle(self._ids(), self.name, task)

    # -- cancellation and closing ------------------------------------------------------------

    def cancel_task(self, task: Task) -> bool:
        assert isinstance(task, AsyncTask)
        with self._lock:
            state = task.state
            if state >= SUCCEEDED:
                return False
            if state == QUEUED:  # in the intake, or granted a permit and not started yet
                if task.in_intake:
                    task.in_intake = False
                    self._queued -= 1
                    self._live.discard(task)
                    self._wake_room()
                callbacks = task.finish_locked(
                    None, CancelledError(f"unit {self.name!r}: cancelled before it started")
                )
            else:
                callbacks = None
        if callbacks is not None:
            for callback in callbacks:
                callback()
            return True
        aio, loop = task.aio, task.loop
        if aio is None or loop is None:
            return False
        if _running_loop() is loop:
            aio.cancel()
        else:
            try:
                loop.call_soon_threadsafe(aio.cancel)
            except RuntimeError:
                return False
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Stop the intake, let accepted work finish within ``timeout``, cancel the rest."""
        deadline = time.monotonic() + timeout
        on_loop = _running_loop()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._room.notify_all()
            hosted_here = any(t.loop is on_loop for t in self._live) if on_loop is not None else False
            if not hosted_here:
                while self._running or self._queued:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._room.wait(min(left, 0.05))
            leftovers = list(self._live)
        for task in leftovers:
            self.cancel_task(task)
        grace = time.monotonic() + CANCEL_GRACE
        if not hosted_here:
            for task in leftovers:
                task.wait(max(0.0, grace - time.monotonic()))
        self.metrics.close()
        self.gauges.close()
        forget(self)
        if self._managed is not None:
            self._managed = None
            release_managed_loop()


_NO_OPTIONS = SubmitOptions()


def _set_none(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def make_runner(spec: UnitSpec, ctx: RuntimeContext) -> AsyncRunner:
    """The ``async`` runner for ``spec``."""
    return AsyncRunner(spec, ctx)
