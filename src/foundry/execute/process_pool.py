"""The crash-contained pool of child processes behind the ``processes`` model.

What it guarantees is the model's documentation (:mod:`foundry.execute.processes`); this
module is how it keeps it. Submitters pickle a unit's arguments and write them to an idle
child's pipe themselves; a dispatcher thread of the pool's own starts the children (so
their death signal follows a thread that lives as long as the pool), reads their
answers, hands short units ahead to busy children (or, for a pool made with ``ahead=``,
that many units of any length: ``parallel``'s chunks), enforces timeouts by killing, and
replaces the children that die — failing only the unit each was running. What a child
runs is :mod:`foundry.execute._child`. ``parallel`` runs its chunks on this pool too.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import multiprocessing.connection as mpc
import multiprocessing.util  # its exit hook must be registered before any pool registers ours
import os
import pickle
import signal
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from foundry.errors import (
    CancelledError,
    ChildCrashedError,
    OverloadError,
    SubmitError,
    WorkTimeoutError,
)
from foundry.execute._child import ERROR, OK, PICKLE, SKIPPED, child_main
from foundry.execute._task import QUEUED, SUCCEEDED, Task
from foundry.execute.instrument import (
    PoolGauges,
    UnitMetrics,
    describe,
    drain_at_exit,
    forget,
    usable_cpus,
)
from foundry.execute.progress import ProgressSink
from foundry.observe import names
from foundry.observe.metrics import Registry
from foundry.serialize import DEFAULT_ERROR_TYPES, ErrorTypes, decode_error

__all__ = ["ProcTask", "ProcessPool"]

log = logging.getLogger("foundry.execute")

MODEL = "processes"
KILL_GRACE = 1.0  # seconds between SIGTERM and SIGKILL
PENDING_PER_WORKER = 4
DEFAULT_BLOCK_TIMEOUT = 30.0
AHEAD_MAX = 8  # units handed ahead to a busy child, at most
AHEAD_BYTES = 32 * 1024  # ... and at most this many bytes of arguments (a pipe holds more)
SHORT = 0.002  # a unit is "short" (may be handed ahead) below this many seconds
AHEAD_BUFFER = 1 << 20  # bytes of socket buffer asked for a child's pipe in a pool with ``ahead=``
BOOT_RETRIES = 3  # replacements in a row that die while starting before the pool gives up
BOOT_TIMEOUT = 120.0  # seconds a child may take to start (import the main script and the function)
WARM_TIMEOUT = 30.0  # seconds ``warm()`` waits for the first child of a pool started ahead of use
BOOT_FIX = (
    "Fix: guard the main script with `if __name__ == '__main__':`, and check the function's module "
    "imports cleanly"
)


def _context() -> Any:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


# -- the parent side ------------------------------------------------------------------------------


class ProcTask(Task):
    """A unit for a child process: its pickled arguments and where it is."""

    __slots__ = ("ahead", "child", "number", "on_progress", "payload", "sent", "size")

    def __init__(self, owner: ProcessPool, number: int, payload: bytes, timeout: float | None) -> None:
        super().__init__(owner, _never, (), {}, timeout)
        self.number = number
        self.payload = payload
        self.size = len(payload)
        self.child: _Child | None = None
        self.sent = False
        self.ahead = False
        self.on_progress: ProgressSink | None = None  # where the child's progress() records go


def _never(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - a ProcTask runs in a child
    raise AssertionError("a process unit runs in its child")


@dataclass(eq=False)
class _Child:
    process: Any
    conn: mpc.Connection
    lifeline: mpc.Connection
    started_at: float
    perf_started: float = field(default_factory=time.perf_counter)
    ready: bool = False
    pid: int = 0
    inflight: deque[ProcTask] = field(default_factory=deque)
    head_since: float = 0.0  # when the first unit of ``inflight`` started
    handed: int = 0  # units handed in its lifetime
    ahead_bytes: int = 0
    ahead_room: int = 0  # bytes of units that may wait in its pipe (``ahead=`` pools), never blocking
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    outbox: list[ProcTask] = field(default_factory=list)  # assigned, not yet written to its pipe
    kill_reason: str | None = None  # "timeout", "cancelled", "recycled", "closing"
    kill_at: float = 0.0
    stopping: bool = False


class ProcessPool:
    """A crash-contained pool of child processes running one function (the guarantees:
    :mod:`foundry.execute.processes`)."""

    def __init__(
        self,
        name: str,
        module: str,
        qualname: str,
        *,
        workers: int | None = None,
        max_pending: int | None = None,
        overflow: Literal["block", "reject", "caller_runs"] = "block",
        block_timeout: float = DEFAULT_BLOCK_TIMEOUT,
        max_tasks_per_child: int | None = None,
        timeout: float | None = None,
        short: bool | None = None,
        ahead: int = 0,
        registry: Registry | None = None,
        errors: ErrorTypes | None = None,
    ) -> None:
        """``short``: whether units are short enough to hand a few ahead to a busy child
        (``None``: measure). ``ahead``: hand this many units ahead to every busy child
        whatever their length, so that a child finds its next unit in its pipe when it
        answers the last (no round trip through the parent between two units); each
        such unit is written only when it fits in the pipe's buffer (a write to a busy
        child must never block), and never when units have a timeout. A unit handed
        ahead is not running: the death of its child puts it back at the front of the
        queue, and cancelling it drops it in the child (unless the child reached it in
        the same instant: it then runs, its result discarded)."""
        self.name = name
        self.module = module
        self.qualname = qualname
        # Which types an unpicklable exception's record is rebuilt as (the function's module's).
        self.errors = errors if errors is not None else DEFAULT_ERROR_TYPES.scoped(modules=(module,))
        self.workers = workers or usable_cpus()
        self.max_pending = max_pending or PENDING_PER_WORKER * self.workers
        self.overflow = overflow
        self.block_timeout = block_timeout
        self.max_tasks_per_child = max_tasks_per_child
        self.timeout = timeout
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._pending: deque[ProcTask] = deque()
        self._depth = 0  # pending and not cancelled
        self._children: list[_Child] = []
        self._numbers = itertools.count(1)
        self._closed = False
        self._fatal: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._avg = 0.0  # EWMA of seconds per unit, over ``self._observed`` results
        self._observed = 0
        # Every answered call's wall and CPU seconds, as the children measured them
        # (:meth:`measured`: computing or waiting, for the drift check).
        self._calls = 0
        self._wall = 0.0
        self._cpu = 0.0
        self._started = threading.Event()  # a child said "ready", or the pool gave up
        self._ahead_ok = short is not False and timeout is None
        self._ahead = ahead if timeout is None else 0
        self._served = False  # a child of this pool has started (sent "ready") at least once
        self._boot_failures = 0  # children in a row that died while starting
        self._respawn_at = 0.0  # monotonic time before which no child is started (back-off)
        self._spawned = 0
        registry = registry if registry is not None else Registry()
        self.metrics = UnitMetrics(registry, name, MODEL, in_flight=self._running_count)
        self.gauges = PoolGauges(
            registry,
            name,
            depth=lambda: float(self._depth),
            oldest_age=self._oldest_age,
            busy=self._running_count,
        )
        self._exits = registry.counter(
            names.CHILD_EXITS, "Child process exits, by exit code", ("unit", "code")
        )
        self.restarts = registry.counter(names.CHILD_RESTARTS, "Child processes replaced", ("unit",)).labels(
            name
        )
        drain_at_exit(self)

    # -- reading ------------------------------------------------------------------------

    def _running_count(self) -> float:
        return float(sum(1 for c in self._children if c.inflight))

    def _oldest_age(self) -> float:
        now = time.perf_counter()
        with self._lock:
            for task in self._pending:
                if task.state == QUEUED:
                    return max(0.0, now - task.enqueued)
        return 0.0

    def pids(self) -> list[int]:
        """Process ids of the live children (for tests and `foundry top`)."""
        with self._lock:
            return [c.pid for c in self._children if c.pid]

    def has_room(self) -> bool:
        """Whether a submit now would be accepted without waiting (a hint: it may change
        the next instant)."""
        return self._depth < self.max_pending

    def measured(self) -> tuple[int, float, float]:
        """``(calls, wall seconds, CPU seconds)`` of every call answered so far, as the
        children measured them: CPU/wall near 1 is computing, near 0 waiting."""
        with self._lock:
            return self._calls, self._wall, self._cpu

    def start(self, timeout: float) -> None:
        """Start the children now, before any unit is submitted, and wait until the first
        one is ready (``timeout`` seconds at most): the first calls then find a child
        waiting instead of a pool booting. Raises :class:`SubmitError` when the children
        cannot start, or did not within ``timeout``."""
        with self._lock:
            if self._closed:
                raise SubmitError(f"unit {self.name!r}: its process pool is closed")
            if self._thread is None:
                self._start_dispatcher()
        self._started.wait(timeout)
        with self._lock:
            fatal, served = self._fatal, self._served
        if fatal is not None:
            raise SubmitError(str(fatal)) from fatal
        if not served:
            raise SubmitError(
                f"unit {self.name!r}: no child process was ready within {timeout}s (the machine is "
                f"overloaded, or importing {self.module} is slow). Fix: check that the module imports "
                "quickly and cleanly"
            )

    # -- submitting ------------------------------------------------------------------------

    def submit(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        timeout: float | None = None,
        on_progress: ProgressSink | None = None,
    ) -> ProcTask:
        """Accept a unit (blocking or refusing by the overflow policy when full);
        ``on_progress`` gets its :func:`foundry.progress` records, on the dispatcher thread
        (keep it short)."""
        task = self._new_task(args, kwargs, timeout)
        task.on_progress = on_progress
        if not self._accept(task):
            self._overflow(task)
        return task

    def try_submit(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None = None
    ) -> ProcTask | None:
        """Accept without blocking; ``None`` when the intake is full."""
        task = self._new_task(args, kwargs, timeout)
        return task if self._accept(task) else None

    def _new_task(self, args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None) -> ProcTask:
        _refuse_while_bootstrapping(self.name)
        try:
            payload = pickle.dumps((args, kwargs), PICKLE)
        except Exception as exc:
            raise SubmitError(
                f"unit {self.name!r} runs in a child process, and its arguments cannot be pickled "
                f"({type(exc).__name__}: {exc}; arguments {describe(args)}, {describe(kwargs)}). "
                "Fix: pass plain data (ids, paths, numbers, dicts) and open live objects (files, "
                "sockets, locks, connections) inside the function"
            ) from exc
        return ProcTask(self, next(self._numbers), payload, timeout if timeout is not None else self.timeout)

    def _accept(self, task: ProcTask) -> bool:
        send: list[_Child] = []
        with self._lock:
            if self._closed:
                raise SubmitError(
                    f"unit {self.name!r}: its process pool is closed. Fix: submit before close()"
                )
            if self._fatal is not None:
                raise SubmitError(str(self._fatal)) from self._fatal
            if self._depth >= self.max_pending:
                return False
            self._depth += 1
            task.enqueued = time.perf_counter()
            self._pending.append(task)
            if self._thread is None:
                self._start_dispatcher()
            else:
                send = self._assign()
        self._send_all(send)
        if task.timeout is not None:
            self._wake()  # the dispatcher keeps the clock of running units
        return True

    def _overflow(self, task: ProcTask) -> None:
        if self.overflow == "reject":
            self.gauges.rejected.inc()
            raise OverloadError(
                f"unit {self.name!r}: {self.max_pending} units already wait for {self.workers} child "
                "processes (overflow='reject'). Fix: retry later, raise max_pending or workers"
            )
        if self.overflow == "caller_runs":
            log.warning(
                "unit %r: overflow='caller_runs' on the processes model blocks for room instead: running "
                "isolated work in the caller would give up its isolation",
                self.name,
            )
        deadline = time.monotonic() + self.block_timeout
        while not self._accept(task):
            with self._room:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.gauges.rejected.inc()
                    raise OverloadError(
                        f"unit {self.name!r}: the intake stayed full ({self.max_pending} waiting) for "
                        f"{self.block_timeout}s with overflow='block'. Fix: add workers, raise "
                        "max_pending, or slow the producer"
                    )
                if self._depth >= self.max_pending:
                    self._room.wait(min(left, 0.5))

    # -- assigning units to children (under the lock) -----------------------------------------

    def _assign(self) -> list[_Child]:
        """Under the lock: hand pending units to idle children, then (short units only)
        a few ahead to busy ones. Returns the children to write to, outside the lock."""
        out: list[_Child] = []
        pending = self._pending
        if not pending:
            return out
        ready = [c for c in self._children if c.ready and not c.stopping and c.kill_reason is None]
        now = time.perf_counter()
        for child in ready:
            if not pending:
                break
            if not child.inflight and self._take(child, 1, now):
                out.append(child)
        # Hand ahead only when units are known to be short and every child is up and busy:
        # a unit handed ahead waits behind its child's current one even if another frees up.
        if (
            pending
            and self._ahead_ok
            and self._observed >= 2 * self.workers
            and self._avg < SHORT
            and len(ready) == len(self._children)
            and all(c.inflight for c in ready)
        ):
            share = max(1, min(AHEAD_MAX, len(pending) // max(1, len(ready))))
            for child in ready:
                if not pending:
                    break
                room = AHEAD_MAX - len(child.inflight)
                timed = bool(child.inflight) and child.inflight[0].timeout is not None
                if (
                    room > 0
                    and not timed
                    and child.ahead_bytes < AHEAD_BYTES
                    and self._take(child, min(room, share), now, ahead=True)
                ):
                    out.append(child)
        # Every ready child is busy now (the idle ones took one above); while one is still
        # starting, what waits is kept for it rather than queued behind a busy child.
        if pending and self._ahead and len(ready) == len(self._children):
            for child in ready:
                if not pending:
                    break
                room = self._ahead + 1 - len(child.inflight)
                if (
                    child.inflight
                    and room > 0
                    and self._take(child, room, now, ahead=True, budget=child.ahead_room - child.ahead_bytes)
                ):
                    out.append(child)
        return out

    def _take(
        self, child: _Child, count: int, now: float, ahead: bool = False, budget: int | None = None
    ) -> int:
        """Under the lock: move up to ``count`` pending units to ``child``, handed ahead
        only while their payloads fit in ``budget`` bytes. Units with a timeout are never
        handed ahead (their clock must start when they start)."""
        batch: list[ProcTask] = []
        limit = self.max_tasks_per_child
        while self._pending and len(batch) < count:
            if limit is not None and child.handed >= limit:
                break
            task = self._pending[0]
            if task.state != QUEUED:
                self._pending.popleft()
                continue
            if ahead and task.timeout is not None:
                break
            if budget is not None:
                if task.size > budget:
                    break
                budget -= task.size
            self._pending.popleft()
            self._depth -= 1
            ahead = bool(child.inflight)
            if not ahead:
                child.head_since = now
                task.start_locked()
                task.started = now
            else:
                child.ahead_bytes += task.size
            task.ahead = ahead
            task.child = child
            child.inflight.append(task)
            child.outbox.append(task)
            child.handed += 1
            batch.append(task)
        if batch:
            self._room.notify()
        return len(batch)

    def _send_all(self, children: list[_Child]) -> None:
        """Write each child's outbox to its pipe. Whoever holds the child's send lock
        sends everything assigned so far, so units reach the child in assignment order."""
        for child in children:
            with child.send_lock:
                with self._lock:
                    batch, child.outbox = child.outbox, []
                if not batch:
                    continue
                message = pickle.dumps(("run", [(t.number, t.payload) for t in batch]), PICKLE)
                try:
                    child.conn.send_bytes(message)
                except OSError:  # the child died; its death handler requeues what was not sent
                    continue
                for task in batch:
                    task.sent = True

    # -- the dispatcher thread ---------------------------------------------------------------

    def _start_dispatcher(self) -> None:
        """Under the lock."""
        self._thread = threading.Thread(target=self._dispatch, name=f"foundry-{self.name}-procs", daemon=True)
        self._thread.start()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def _spawn(self) -> _Child:
        """On the dispatcher thread (so the children's death signal follows a thread that
        lives as long as the pool)."""
        ctx = _context()
        parent_end, child_end = ctx.Pipe(duplex=True)
        life_read, life_write = ctx.Pipe(duplex=False)
        process = ctx.Process(
            target=child_main,
            args=(child_end, life_read, self.name, self.module, self.qualname),
            name=f"foundry-{self.name}",
            daemon=True,
        )
        process.start()
        child_end.close()
        life_read.close()
        child = _Child(process, parent_end, life_write, time.monotonic(), pid=process.pid or 0)
        if self._ahead:
            child.ahead_room = _widen(parent_end) // 4
        return child

    def _dispatch(self) -> None:
        try:
            while True:
                self._top_up()
                with self._lock:
                    if self._closed and not self._children:
                        return
                    children = list(self._children)
                waitables: list[Any] = [self._wake_r]
                for child in children:
                    waitables.append(child.conn)
                    waitables.append(child.process.sentinel)
                ready = mpc.wait(waitables, self._next_deadline(children))
                if self._wake_r in ready:
                    with contextlib.suppress(OSError):
                        os.read(self._wake_r, 4096)
                for child in children:
                    if child.conn in ready:
                        self._drain(child)
                    if child.process.sentinel in ready:
                        self._drain(child)
                        self._on_exit(child)
                self._enforce_deadlines()
                if self._closed and not self._depth:  # closing, and nothing left to hand out
                    self._stop_idle()
                with self._lock:
                    send = self._assign()
                self._send_all(send)
        except BaseException:  # pragma: no cover - a bug here must not hang every caller
            log.exception("unit %r: the process pool's dispatcher failed", self.name)
            self._fail_everything(SubmitError(f"unit {self.name!r}: the process pool's dispatcher failed"))
            raise

    def _top_up(self) -> None:
        """On the dispatcher: start children up to ``workers`` (replacements too, while
        open or draining accepted work). Until one child has started, one at a time: if
        children cannot start at all, one fails (and prints one traceback), not all."""
        with self._lock:
            if self._fatal is not None or (self._closed and self._depth == 0):
                return
            if time.monotonic() < self._respawn_at:
                return
            missing = self.workers - len(self._children)
            if not self._served:
                missing = min(missing, 1 - len(self._children))
        for _ in range(max(0, missing)):
            try:
                child = self._spawn()
            except Exception as exc:
                self._give_up(
                    SubmitError(
                        f"unit {self.name!r}: its child processes cannot start ({type(exc).__name__}: "
                        f"{str(exc).strip()[:300]}). {BOOT_FIX}"
                    ),
                    detail=str(exc),
                )
                return
            with self._lock:
                self._children.append(child)
                self._spawned += 1
                replacement = self._spawned > self.workers
            if replacement:
                self.restarts.inc()

    def _give_up(self, error: SubmitError, detail: str = "") -> None:
        """The children cannot start: fail what waits and every later submit with ``error``
        (logged once), and start no more children."""
        with self._lock:
            if self._fatal is not None:
                return
            self._fatal = error
        self._started.set()
        log.error("%s%s", error, f" ({detail})" if detail and detail not in str(error) else "")
        self._fail_everything(error)

    def _next_deadline(self, children: list[_Child]) -> float | None:
        now = time.perf_counter()
        soonest: float | None = None
        if self._respawn_at and len(children) < self.workers and self._fatal is None:
            soonest = self._respawn_at - time.monotonic() + now  # (on the perf_counter clock)
        for child in children:
            due: float | None = None
            if not child.ready and child.kill_reason is None:
                due = child.perf_started + BOOT_TIMEOUT
            elif child.kill_reason is not None:
                due = child.kill_at
            elif child.inflight and child.inflight[0].timeout is not None:
                due = child.head_since + child.inflight[0].timeout
            if due is not None:
                soonest = due if soonest is None else min(soonest, due)
        if soonest is None:
            return 1.0 if self._closed else None
        return max(0.0, soonest - now)

    def _drain(self, child: _Child) -> None:
        """Read every message the child has sent."""
        try:
            while child.conn.poll():
                self._on_message(child, pickle.loads(child.conn.recv_bytes()))
        except (EOFError, OSError):
            pass  # it died; the sentinel reports it

    def _on_message(self, child: _Child, message: tuple[Any, ...]) -> None:
        if message[0] == "ready":
            with self._lock:
                child.ready = True
                child.pid = message[1]
                self._served = True
                self._boot_failures = 0
                self._respawn_at = 0.0
            self._started.set()
            return
        if message[0] == "progress":
            _, number, done, total, note = message
            with self._lock:
                task = next((t for t in child.inflight if t.number == number), None)
            sink = None if task is None else task.on_progress
            if sink is not None:
                try:
                    sink(done, total, note)
                except Exception:  # a broken sink must not stop the dispatcher
                    log.exception("unit %r: a progress sink failed", self.name)
            return
        if message[0] == "fatal":
            error = decode_error(message[1], self.errors)
            self._give_up(
                SubmitError(
                    f"unit {self.name!r}: the child process could not import {self.module}.{self.qualname} "
                    f"({error}). Fix: make the function importable by that name"
                )
            )
            return
        number, kind, data, seconds, cpu = message
        now = time.perf_counter()
        with self._lock:
            if kind != SKIPPED:
                self._calls += 1
                self._wall += seconds
                self._cpu += cpu
            if not child.inflight or child.inflight[0].number != number:  # pragma: no cover
                log.error("unit %r: child %s answered out of order", self.name, child.pid)
                return
            task = child.inflight.popleft()
            task.payload = b""
            if child.inflight:  # the child moves on to the next unit it was handed
                head = child.inflight[0]
                if head.ahead:
                    head.ahead = False
                    child.ahead_bytes -= head.size
                if head.start_locked():
                    head.started = now
                child.head_since = now
            self._avg = seconds if not self._observed else 0.8 * self._avg + 0.2 * seconds
            self._observed += 1
            if kind == OK:
                callbacks = task.finish_locked(data, None)
            elif kind == SKIPPED:
                callbacks = None
            else:
                error = data if kind == ERROR else decode_error(data, self.errors)
                callbacks = task.finish_locked(None, error)
            retire = (
                self.max_tasks_per_child is not None
                and child.handed >= self.max_tasks_per_child
                and not child.inflight
            )
            if retire:
                child.stopping = True
        if callbacks is not None:
            if kind == OK:
                self.metrics.ok(seconds, now)
            else:
                self.metrics.fail(seconds)
            for callback in callbacks:
                callback()
        if retire:
            with child.send_lock, contextlib.suppress(OSError):
                child.conn.send_bytes(pickle.dumps(("stop",), PICKLE))

    def _on_exit(self, child: _Child) -> None:
        """The child's process ended: settle its units and count (the dispatcher starts
        a replacement); a child that died while starting may give up the pool."""
        child.process.join(1.0)
        failures, hopeless = 0, False
        code = child.process.exitcode
        with child.send_lock, self._lock:  # (no send to it is half done)
            if child not in self._children:
                return
            self._children.remove(child)
            inflight = list(child.inflight)
            child.inflight.clear()
            child.outbox.clear()
            reason = child.kill_reason
            planned = child.stopping and not inflight
            # The child ran its units one at a time, in order, and every answer it sent
            # has been read: the first unit it was sent is the one it was running. The
            # others never started: back to the front of the queue, in order.
            requeue: list[ProcTask] = []
            head: ProcTask | None = None
            for task in inflight:
                if head is None and task.sent:
                    head = task  # whatever its state now, this is the one it was running
                    continue
                if not task.requeue_locked():  # cancelled (and told to skip) already
                    continue
                task.child = None
                task.ahead = False
                task.sent = False
                requeue.append(task)
            for task in reversed(requeue):
                self._pending.appendleft(task)
                self._depth += 1
            booting = not child.ready and not planned and reason in (None, "boot")
            if booting:
                self._boot_failures += 1
                failures = self._boot_failures
                # Never started a child: it is the script or the module, not bad luck.
                hopeless = not self._served or failures >= BOOT_RETRIES
                if not hopeless:
                    self._respawn_at = time.monotonic() + min(2.0, 0.1 * 2**failures)
        self._exits.labels(self.name, str(code)).inc()
        if head is not None:
            took = time.perf_counter() - child.head_since
            if reason == "timeout":
                error: BaseException = WorkTimeoutError(
                    f"unit {self.name!r} ran {took:.3f}s, past its timeout of {head.timeout}s; its child "
                    f"process (pid {child.pid}) was killed (exit code {code}) and replaced. Fix: raise "
                    "timeout=, or make the work smaller"
                )
            elif reason in ("cancelled", "closing"):
                error = CancelledError(f"unit {self.name!r}: cancelled while running; its child was killed")
            else:
                error = ChildCrashedError(self.name, code, _signal_name(code))
            if head.finish(error=error):
                self.metrics.fail(took)
        with contextlib.suppress(OSError):
            child.conn.close()
        with contextlib.suppress(OSError):
            child.lifeline.close()
        if booting and hopeless:
            how = (
                f"did not start within {BOOT_TIMEOUT:.0f}s and was killed"
                if reason == "boot"
                else f"exited with {_how(code)} while starting"
            )
            again = "" if failures == 1 else f" ({failures} children in a row)"
            self._give_up(
                SubmitError(
                    f"unit {self.name!r}: its child process (pid {child.pid}) {how}, before it ran "
                    f"anything{again}, so no more children are started and the unit's pending and later "
                    "work fails. A child imports the function's module and, with spawn/forkserver, runs "
                    "the main script again: its traceback, if it printed one, is above. " + BOOT_FIX
                )
            )

    # -- deadlines, cancellation, killing ------------------------------------------------------

    def _enforce_deadlines(self) -> None:
        now = time.perf_counter()
        with self._lock:
            children = list(self._children)
        for child in children:
            if child.kill_reason is not None:
                if now >= child.kill_at and child.process.is_alive():
                    with contextlib.suppress(Exception):
                        child.process.kill()
                    child.kill_at = now + 3600.0
                continue
            if not child.ready and now >= child.perf_started + BOOT_TIMEOUT:
                self._kill(child, "boot")
                continue
            if not child.inflight:
                continue
            head = child.inflight[0]
            if head.timeout is not None and now >= child.head_since + head.timeout:
                self._kill(child, "timeout")

    def _stop_idle(self) -> None:
        """Closing: ask every child that has nothing to do to exit (late replacements too)."""
        with self._lock:
            idle = [c for c in self._children if not c.inflight and not c.stopping and c.kill_reason is None]
            for child in idle:
                child.stopping = True
        for child in idle:
            with child.send_lock, contextlib.suppress(OSError):
                child.conn.send_bytes(pickle.dumps(("stop",), PICKLE))

    def _kill(self, child: _Child, reason: str) -> None:
        """Terminate now, kill after the grace; the exit is handled as the child's death."""
        child.kill_reason = reason
        child.kill_at = time.perf_counter() + KILL_GRACE
        with contextlib.suppress(Exception):
            child.process.terminate()
        self._wake()

    def cancel_task(self, task: Task) -> bool:
        assert isinstance(task, ProcTask)
        with self._lock:
            state = task.state
            if state >= SUCCEEDED:
                return False
            child = task.child
            if state == QUEUED and child is None:  # still in our queue: it will never start
                self._depth -= 1
                self._room.notify()
                error = CancelledError(f"unit {self.name!r}: cancelled before it started")
            elif state == QUEUED:  # handed ahead to a busy child: it will skip it
                error = CancelledError(f"unit {self.name!r}: cancelled before it started")
            else:  # running: its child is killed (and replaced)
                error = CancelledError(f"unit {self.name!r}: cancelled while running; its child was killed")
            callbacks = task.finish_locked(None, error)
        if child is not None:
            if state == QUEUED:
                with child.send_lock, contextlib.suppress(OSError):
                    child.conn.send_bytes(pickle.dumps(("skip", task.number), PICKLE))
            else:
                self._kill(child, "cancelled")
        for callback in callbacks or ():
            callback()
        return True

    def _fail_everything(self, error: BaseException) -> None:
        """The children cannot run this unit at all: fail what is queued and handed out."""
        with self._lock:
            tasks = [t for t in self._pending if t.state < SUCCEEDED]
            for child in self._children:
                tasks.extend(t for t in child.inflight if t.state < SUCCEEDED)
            self._pending.clear()
            self._depth = 0
            self._room.notify_all()
        for task in tasks:
            task.finish(error=error)

    # -- closing ---------------------------------------------------------------------------------

    def close(self, timeout: float = 10.0) -> None:
        """Stop the intake, let accepted units finish within ``timeout``, then cancel the
        rest, stop the children (killing those still busy) and reap them."""
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._room.notify_all()
            while self._depth or any(c.inflight for c in self._children):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._room.wait(min(left, 0.05))
            leftovers = [t for t in self._pending if t.state == QUEUED]
            children = list(self._children)
        for task in leftovers:
            self.cancel_task(task)
        for child in children:
            if child.inflight:
                self._kill(child, "closing")
        self._stop_idle()
        thread = self._thread
        if thread is not None:
            self._wake()
            thread.join(max(1.0, deadline - time.monotonic()) + KILL_GRACE)
        with self._lock:
            children = list(self._children)
        for child in children:  # the dispatcher is gone or stuck: reap by hand
            if child.process.is_alive():
                with contextlib.suppress(Exception):
                    child.process.kill()
                child.process.join(1.0)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.metrics.close()
        self.gauges.close()
        forget(self)


def _widen(conn: mpc.Connection) -> int:
    """Ask for :data:`AHEAD_BUFFER` bytes of send buffer on the parent's end of a child's
    pipe (a socket pair; the kernel caps the request at ``net.core.wmem_max``) and return
    what it granted. A quarter of it is what may wait in the pipe for a busy child: two
    units handed ahead (one the child is about to read, the next) fit with room to spare,
    so those writes never block the parent, whatever the child is doing."""
    fd = os.dup(conn.fileno())
    try:
        sock = socket.socket(fileno=fd)
    except OSError:  # not a socket (no pipe buffer to rely on): nothing is handed ahead
        os.close(fd)
        return 0
    with sock:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, AHEAD_BUFFER)
        try:
            return int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))
        except OSError:
            return 0


def _how(code: int | None) -> str:
    name = _signal_name(code)
    return f"signal {name}" if name else f"exit code {code}"


def _refuse_while_bootstrapping(unit: str) -> None:
    """In a process that multiprocessing is still starting (it is re-running the main
    script as ``__mp_main__``), starting a pool cannot work: say why, at once."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise SubmitError(
            f"unit {unit!r} was submitted while a child process was starting: with spawn/forkserver "
            "every child runs the main script again, and this submit is at its top level, so each "
            f"child would start children of its own. {BOOT_FIX}"
        )


def _signal_name(code: int | None) -> str | None:
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return None
