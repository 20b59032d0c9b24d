"""The dispatcher every pool engine runs its workers with: worker processes on this
machine, one duplex pipe each. ``local://`` (the default, ``local.py``) is this
dispatcher in the submitting process; ``served.py`` and ``nats.py`` run it behind their
fronts. The dispatcher lives in the process that submits: it knows
exactly which worker is free, so "the first free worker" is exact, and it sees a worker
die the moment it dies (its pipe closes, its sentinel fires), so a lost attempt is
answered ``LOST`` at once, not at a timeout.

* Workers are started with ``forkserver`` (``spawn`` off Linux), resolve the unit's
  function by module and qualified name, and run one request at a time. They die with
  the dispatcher (``PR_SET_PDEATHSIG`` and a lifeline pipe), and ignore ``SIGINT``
  (Ctrl-C reaches the dispatcher, which drains them).
* A submitting thread writes to a free worker's pipe itself; the engine's one thread
  reads answers, hands the next waiting attempt to the worker that just answered,
  enforces attempt timeouts (``SIGKILL``, then a replacement) and wait limits, and
  keeps the worker count at its target.
* A worker that dies before it is ready (its module does not import) makes the pool
  answer ``NO_WORKER`` with the start-up error at once, instead of every request
  waiting for its deadline; three such deaths in a row pause restarts for a second.
* An attempt still waiting for a free worker can be taken back (:meth:`LocalPool.cancel`).

The same dispatcher runs behind the network fronts (``foundry pool serve``): the NATS
worker host and the served local pool hand it the frames they receive (``frame=``),
bound its waiting line (``max_waiting``, beyond it ``OVERLOAD``) and follow its free
workers through ``on_change``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import multiprocessing.connection as mpc
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from foundry.backends.pool._common import (
    KeyCache,
    decode_reply,
    describe_exit,
    die_with_parent,
    encode_request,
    process_context,
    resolve_target,
    run_request,
)
from foundry.backends.pool.base import (
    CANCELLED,
    DEADLINE,
    LOST,
    NO_WORKER,
    OVERLOAD,
    Attempt,
    Done,
    EngineSpec,
    EngineStats,
    Reply,
    answer_once,
)
from foundry.errors import BackendUnavailableError

__all__ = ["LocalFront", "LocalPool"]

log = logging.getLogger("foundry.pool")

_READY, _FATAL, _STOP = b"R", b"F", b"S"
NODE = os.uname().nodename
CRASH_STREAK = 3  # deaths before ready in a row that pause restarts
CRASH_PAUSE = 1.0
STOP_GRACE = 2.0


def _worker_main(
    conn: mpc.Connection, lifeline: mpc.Connection, unit: str, codec: str, module: str, qualname: str
) -> None:  # pragma: no cover - runs in a worker process (covered by the tests, in another process)
    die_with_parent(lifeline)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        fn = resolve_target(module, qualname)
    except BaseException as exc:
        conn.send_bytes(_FATAL + json.dumps(f"{type(exc).__name__}: {exc}").encode())
        return
    conn.send_bytes(_READY + str(os.getpid()).encode())
    cache = KeyCache()
    recv, send = conn.recv_bytes, conn.send_bytes
    while True:
        try:
            frame = recv()
        except (EOFError, OSError):
            return
        if frame == _STOP:
            return
        reply, _ = run_request(unit, codec, fn, frame, cache)
        try:
            send(reply)
        except (EOFError, OSError):
            return


@dataclass(eq=False, slots=True)
class _Job:
    attempt: Attempt
    done: Done
    frame: bytes
    since: float
    wait_until: float
    run_until: float = math.inf
    sent_at: float = 0.0


@dataclass(eq=False)
class _Worker:
    number: int
    process: Any
    conn: mpc.Connection
    lifeline: mpc.Connection
    pid: int = 0
    ready: bool = False
    job: _Job | None = None
    retiring: bool = False
    killed: str = ""  # why the engine killed it ("timed out after 2s", "pool closed")
    name: str = f"{NODE}:?"  # "host:pid" once it said it is ready


class LocalPool:
    """Worker processes on this machine behind an exact first-free dispatcher."""

    def __init__(
        self,
        url: str,
        spec: EngineSpec,
        *,
        max_waiting: int | None = None,
        on_change: Callable[[], None] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.url = url
        self.max_waiting = max_waiting
        self.on_change = on_change  # called (never under the lock) when free workers or the line change
        self.unit = spec.unit
        self._codec = spec.codec
        self._module = spec.module
        self._qualname = spec.qualname
        self._target = max(0, spec.workers)
        self._ctx = process_context()
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)
        self._workers: list[_Worker] = []
        self._free: list[_Worker] = []  # a stack: the most recently freed worker first
        self._waiting: deque[_Job] = deque()
        self._numbers = 0
        self._closed = False
        self._stopped = False
        self._fatal = ""
        self._streak = 0
        self._paused_until = 0.0
        self._arrivals = 0
        self._served = 0
        self._service = 0.0
        self._restarts = 0
        self._exits: dict[str, int] = {}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        # When the engine next wakes by itself (monotonic). It is lazy: a timer stays armed
        # at a deadline that went away (that job finished) and only moves *earlier*, so a
        # request that starts while the engine sleeps wakes it only when its deadline is
        # sooner than every armed one (for a pool going idle and busy, almost never).
        self._armed = 0.0
        self._loop_thread = 0  # the loop's thread id, once attached (``loop=``)
        self._loop = loop
        self._ended = threading.Event()
        self._registered: dict[int, tuple[_Worker, bool]] = {}  # fd -> (worker, is its pipe)
        self._changes = 0  # counts every change to the list of workers
        self._watched = -1  # the ``_changes`` the loop's watched fds were made for
        self._timer: asyncio.TimerHandle | None = None
        if loop is None:
            self._thread: threading.Thread | None = threading.Thread(
                target=self._run, name=f"foundry-pool-{self.unit}", daemon=True
            )
            self._thread.start()
        else:  # driven by the front's event loop: one thread for the network and the workers
            self._thread = None
            loop.call_soon_threadsafe(self._attach)
        self._wake()  # start the first workers now

    def __repr__(self) -> str:
        return f"<LocalPool {self.unit} workers={self._target}>"

    # -- the caller's side --------------------------------------------------------------

    def send(self, attempt: Attempt, done: Done, frame: bytes | None = None) -> None:
        """Hand ``attempt`` to the first free worker. ``frame``: the request already
        encoded (a front passes on what it received)."""
        done = answer_once(done, attempt)
        now = time.monotonic()
        job = _Job(
            attempt, done, frame if frame is not None else encode_request(attempt), now, now + attempt.wait
        )
        refuse, full = "", False
        worker: _Worker | None = None
        with self._lock:
            self._arrivals += 1
            if self._closed:
                refuse = "the pool is closed"
            elif not self._free and self._no_worker_coming(now):
                refuse = self._why_none()
            elif self._free:
                worker = self._free.pop()
                self._start_job(worker, job, now)
            elif self.max_waiting is not None and len(self._waiting) >= self.max_waiting:
                full = True
            else:
                self._waiting.append(job)
                if job.wait_until < self._armed:
                    self._wake_by(job.wait_until)
        if refuse:
            done(Reply(NO_WORKER, detail=refuse))
        elif full:
            done(
                Reply(
                    OVERLOAD,
                    detail=f"{self.max_waiting} requests already wait for a free worker of {self.unit!r}",
                )
            )
        else:
            if worker is not None:
                self._write(worker, job)
            self._changed()

    def cancel(self, request: str) -> bool:
        """Take back the attempt of ``request`` while it waits for a free worker."""
        with self._lock:
            job = next((j for j in self._waiting if j.attempt.request == request), None)
            if job is not None:
                self._waiting.remove(job)
        if job is None:
            return False
        job.done(
            Reply(CANCELLED, detail="cancelled before a worker took it", queued=time.monotonic() - job.since)
        )
        self._changed()
        return True

    def free(self) -> tuple[int, int]:
        """``(free workers, attempts waiting)`` right now."""
        with self._lock:
            return len(self._free), len(self._waiting)

    def offer(self) -> tuple[int, int, bool]:
        """``(free workers, attempts waiting, serving)`` right now, in one look."""
        with self._lock:
            serving = not self._closed and not self._no_worker_coming(time.monotonic())
            return len(self._free), len(self._waiting), serving

    @property
    def fatal(self) -> str:
        """Why workers cannot start, while they cannot (``""`` otherwise)."""
        return self._fatal

    def serving(self) -> bool:
        """A worker is live or on its way (``False``: an attempt now would be ``NO_WORKER``)."""
        with self._lock:
            return not self._closed and not self._no_worker_coming(time.monotonic())

    def _changed(self) -> None:
        listener = self.on_change
        if listener is not None:
            listener()

    def _no_worker_coming(self, now: float) -> bool:
        if self._target == 0:
            return True
        for w in self._workers:
            if w.ready and not w.retiring:
                return False
        return bool(self._fatal) and (self._streak >= CRASH_STREAK or not self._workers)

    def _why_none(self) -> str:
        if self._target == 0:
            return "the pool is sized to 0 workers"
        return f"no worker could start: {self._fatal}"

    def _start_job(self, worker: _Worker, job: _Job, now: float) -> None:
        worker.job = job
        job.sent_at = now
        job.run_until = now + job.attempt.timeout
        if job.run_until < self._armed:  # sooner than the engine's next timer
            self._wake_by(job.run_until)

    def _write(self, worker: _Worker, job: _Job) -> None:
        try:
            worker.conn.send_bytes(job.frame)
        except (OSError, ValueError):
            # It died before it got the request: nothing ran, so the attempt waits for
            # another worker (its death is handled by the engine thread).
            with self._lock:
                if worker.job is job:
                    worker.job = None
                    self._waiting.appendleft(job)
                    self._wake()

    def _wake_by(self, deadline: float) -> None:
        """Have the engine wake by ``deadline`` (lock held). On the engine's own event loop
        this moves its timer (no syscall); from another thread it pokes the wake pipe."""
        loop = self._loop
        if loop is not None and threading.get_ident() == self._loop_thread:
            self._arm(loop, deadline)
        else:
            self._wake()

    def _arm(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        """The loop's timer at ``deadline`` (lock held; the loop's clock is monotonic)."""
        if self._timer is not None:
            self._timer.cancel()
        self._armed = deadline
        self._timer = None if deadline == math.inf else loop.call_at(deadline, self._step)

    def _rearm(self, now: float) -> float:
        """The engine's next wake-up after a turn (lock held): the soonest deadline, unless
        one armed earlier is still ahead (see ``_armed``)."""
        soonest = self._next_deadline()
        return soonest if self._armed <= now else min(self._armed, soonest)

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    # -- sizing --------------------------------------------------------------------------

    def size(self) -> int:
        with self._lock:
            return self._target

    def resize(self, workers: int) -> None:
        with self._lock:
            self._target = max(0, workers)
        self._wake()

    def stats(self) -> EngineStats:
        with self._lock:
            states = tuple(
                (
                    w.name if w.pid else f"starting-{w.number}",
                    "retiring"
                    if w.retiring
                    else "busy"
                    if w.job is not None
                    else "idle"
                    if w.ready
                    else "starting",
                )
                for w in self._workers
            )
            return EngineStats(
                live=sum(1 for w in self._workers if w.ready and not w.retiring),
                busy=sum(1 for w in self._workers if w.job is not None),
                starting=sum(1 for w in self._workers if not w.ready),
                waiting=len(self._waiting),
                arrivals=self._arrivals,
                served=self._served,
                service_seconds=self._service,
                restarts=self._restarts,
                exits=tuple(sorted(self._exits.items())),
                workers=states,
            )

    # -- the engine's thread ------------------------------------------------------------

    def _run(self) -> None:
        wake = self._wake_r
        while True:
            with self._lock:
                if self._stopped:
                    break
                objects: list[Any] = [wake]
                by_object: dict[Any, _Worker] = {}
                for w in self._workers:
                    objects.append(w.conn)
                    objects.append(w.process.sentinel)
                    by_object[w.conn] = w
                    by_object[w.process.sentinel] = w
                now = time.monotonic()
                # a submitter wakes this thread only for a timer sooner than this one
                self._armed = self._rearm(now)
                timeout = None if self._armed == math.inf else max(0.0, self._armed - now)
            try:
                ready = mpc.wait(objects, timeout)
            except OSError:  # a connection closed under us; the loop rebuilds the list
                ready = []
            for obj in ready:
                if obj is wake:
                    try:
                        os.read(wake, 4096)
                    except OSError:
                        pass
                    continue
                worker = by_object.get(obj)
                if worker is None:
                    continue
                if obj is worker.conn:
                    self._receive(worker)
                else:
                    self._buried(worker)
            if time.monotonic() >= self._armed:  # nothing is due before the armed time
                self._timers()
            self._keep_size()
        self._stop_all()
        self._ended.set()

    # -- or driven by an event loop (a front's: ``loop=``) ---------------------------------

    def _attach(self) -> None:
        assert self._loop is not None
        self._loop_thread = threading.get_ident()
        self._loop.add_reader(self._wake_r, self._on_wake)
        self._step()

    def _on_wake(self) -> None:
        try:
            os.read(self._wake_r, 4096)
        except OSError:
            pass
        self._step()

    def _on_ready(self, fd: int) -> None:
        entry = self._registered.get(fd)
        if entry is not None:
            worker, is_pipe = entry
            if is_pipe:
                self._receive(worker)
            else:
                self._buried(worker)
        self._step()

    def _step(self) -> None:
        """One turn of the engine on the loop: timers, size, which fds to watch, next timer."""
        loop = self._loop
        assert loop is not None
        if time.monotonic() >= self._armed:  # nothing is due before the armed time
            self._timers()
        self._keep_size()
        with self._lock:
            stopped = self._stopped
            if self._watched != self._changes or stopped:
                self._watch(loop, stopped)
            if stopped:
                self._arm(loop, math.inf)
            else:
                armed = self._rearm(time.monotonic())
                if armed != self._armed or (self._timer is None and armed != math.inf):
                    self._arm(loop, armed)
        if stopped:
            loop.remove_reader(self._wake_r)
            self._stop_all()
            self._ended.set()

    def _watch(self, loop: asyncio.AbstractEventLoop, stopped: bool) -> None:
        """Watch every worker's pipe and sentinel on the loop (lock held; when they changed)."""
        self._watched = self._changes
        wanted: dict[int, tuple[_Worker, bool]] = {}
        if not stopped:
            for w in self._workers:
                wanted[w.conn.fileno()] = (w, True)
                wanted[w.process.sentinel] = (w, False)
        for fd in [fd for fd in self._registered if wanted.get(fd) != self._registered[fd]]:
            loop.remove_reader(fd)
            del self._registered[fd]
        for fd, entry in wanted.items():
            if fd not in self._registered:
                loop.add_reader(fd, self._on_ready, fd)
                self._registered[fd] = entry

    def _next_deadline(self) -> float:
        """The soonest attempt timeout, wait limit or restart pause (lock held; inf: none)."""
        soonest = math.inf
        for w in self._workers:
            if w.job is not None:
                soonest = min(soonest, w.job.run_until)
        if self._waiting:
            soonest = min(soonest, min(job.wait_until for job in self._waiting))
        if self._paused_until:
            soonest = min(soonest, self._paused_until)
        return soonest

    def _receive(self, worker: _Worker) -> None:
        try:
            message = worker.conn.recv_bytes()
        except (EOFError, OSError):
            self._buried(worker)
            return
        head = message[:1]
        if head == _READY:
            with self._lock:
                worker.pid = int(message[1:] or 0)
                worker.name = f"{NODE}:{worker.pid or '?'}"
                worker.ready = True
                self._streak = 0
                self._fatal = ""
                self._paused_until = 0.0
            self._next_for(worker)
            return
        if head == _FATAL:
            try:
                text = str(json.loads(message[1:]))
            except ValueError:
                text = "it could not say why"
            log.error("unit %r: a pool worker could not start: %s", self.unit, text)
            with self._lock:
                self._fatal = text
            return
        reply = decode_reply(message, worker.name)
        with self._lock:
            job, worker.job = worker.job, None
            if job is not None:
                self._served += 1
                # how long the attempt held its worker, hand-off to answer: the run plus the
                # pipe both ways and the worker's wake-up, which is the service time of the
                # queueing model (on a busy machine well above what the worker measured)
                self._service += max(reply.seconds, time.monotonic() - job.sent_at)
        if job is not None:
            queued = job.sent_at - job.since
            job.done(
                Reply(reply.kind, reply.body, reply.worker, reply.detail, reply.seconds, queued)
                if queued
                else reply
            )
        self._next_for(worker)

    def _next_for(self, worker: _Worker) -> None:
        """Give the worker that is free now the oldest waiting attempt, or park it."""
        expired: list[_Job] = []
        job: _Job | None = None
        with self._lock:
            if worker not in self._workers:
                return
            if worker.retiring:
                self._retire(worker)
            else:
                now = time.monotonic()
                while self._waiting:
                    candidate = self._waiting.popleft()
                    if candidate.wait_until <= now:
                        expired.append(candidate)
                        continue
                    job = candidate
                    break
                if job is not None:
                    self._start_job(worker, job, now)
                elif worker not in self._free:
                    self._free.append(worker)
                    self._drained.notify_all()
        for late in expired:
            late.done(self._late(late))
        if job is not None:
            self._write(worker, job)
        self._changed()

    def _late(self, job: _Job) -> Reply:
        return Reply(
            DEADLINE,
            detail=f"no worker was free within {job.attempt.wait:.3g}s ({len(self._workers)} workers)",
            queued=time.monotonic() - job.since,
        )

    def _retire(self, worker: _Worker) -> None:
        """Ask an idle worker to exit (lock held); its sentinel fires and it is buried."""
        worker.retiring = True
        if worker in self._free:
            self._free.remove(worker)
        try:
            worker.conn.send_bytes(_STOP)
        except (OSError, ValueError):
            pass

    def _buried(self, worker: _Worker) -> None:
        """A worker exited: answer its attempt ``LOST``, count it, close its pipes."""
        with self._lock:
            if worker not in self._workers:
                return
            self._workers.remove(worker)
            self._changes += 1
            if worker in self._free:
                self._free.remove(worker)
            job, worker.job = worker.job, None
        worker.process.join(1.0)
        code = worker.process.exitcode
        how = describe_exit(code)
        expected = (worker.retiring or self._closed) and not worker.killed
        with self._lock:
            if not expected:
                self._exits[how] = self._exits.get(how, 0) + 1
                if worker.ready and not self._closed:
                    self._restarts += 1
                if not worker.ready:
                    self._streak += 1
                    if self._streak >= CRASH_STREAK:
                        self._paused_until = time.monotonic() + CRASH_PAUSE
                        self._fatal = (
                            self._fatal or f"{self._streak} workers in a row died ({how}) before ready"
                        )
            refused = list(self._waiting) if self._no_worker_coming(time.monotonic()) else []
            if refused:
                self._waiting.clear()
        for closing in (worker.conn, worker.lifeline):
            try:
                closing.close()
            except OSError:
                pass
        if not expected:
            log.warning(
                "unit %r: pool worker %s died (%s)%s",
                self.unit,
                worker.name,
                how,
                " while running" if job else "",
            )
        if job is not None:
            detail = worker.killed or f"worker {worker.name} died ({how}) while running it"
            job.done(Reply(LOST, worker=worker.name, detail=detail, queued=job.sent_at - job.since))
        for waiting in refused:
            waiting.done(Reply(NO_WORKER, detail=self._why_none()))
        with self._lock:
            self._drained.notify_all()
        self._changed()

    def _timers(self) -> None:
        now = time.monotonic()
        late: list[_Job] = []
        with self._lock:
            for w in self._workers:
                if w.job is not None and w.job.run_until <= now and not w.killed:
                    w.killed = (
                        f"worker {w.name} did not answer within {w.job.attempt.timeout:.3g}s and was killed"
                    )
                    _kill(w)
            while self._waiting and self._waiting[0].wait_until <= now:
                late.append(self._waiting.popleft())
            if self._waiting:  # not FIFO by deadline: look at every one (the list is bounded)
                keep = deque(job for job in self._waiting if job.wait_until > now)
                late.extend(job for job in self._waiting if job.wait_until <= now)
                self._waiting = keep
        for job in late:
            job.done(self._late(job))
        if late:
            self._changed()

    def _keep_size(self) -> None:
        with self._lock:
            if self._closed:
                return
            now = time.monotonic()
            if self._paused_until and now < self._paused_until:
                return
            active = [w for w in self._workers if not w.retiring]
            missing = self._target - len(active)
            if missing < 0:
                self._shrink(active, -missing)
        for _ in range(max(0, missing)):
            try:
                worker = self._spawn()  # outside the lock: submitters keep going meanwhile
            except Exception as exc:  # cannot start a process at all: say so, fail fast
                log.error("unit %r: cannot start a pool worker: %s", self.unit, exc)
                with self._lock:
                    self._fatal = f"starting a worker process failed ({type(exc).__name__}: {exc})"
                    self._streak = CRASH_STREAK
                    self._paused_until = time.monotonic() + CRASH_PAUSE
                    refused = list(self._waiting) if self._no_worker_coming(time.monotonic()) else []
                    if refused:
                        self._waiting.clear()
                for job in refused:
                    job.done(Reply(NO_WORKER, detail=self._why_none()))
                return
            with self._lock:
                self._workers.append(worker)
                self._changes += 1
        if missing > 0:
            self._changed()

    def _shrink(self, active: list[_Worker], surplus: int) -> None:
        """Retire ``surplus`` workers (lock held): starting and idle ones now, busy ones
        after their current attempt."""
        for w in [w for w in active if not w.ready] + [w for w in self._free if not w.retiring]:
            if surplus <= 0:
                return
            self._retire(w)
            surplus -= 1
        for w in active:
            if surplus <= 0:
                return
            if w.job is not None and not w.retiring:
                w.retiring = True
                surplus -= 1

    def _spawn(self) -> _Worker:
        self._numbers += 1
        parent, child = self._ctx.Pipe(duplex=True)
        life_r, life_w = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(
            target=_worker_main,
            args=(child, life_r, self.unit, self._codec, self._module, self._qualname),
            name=f"foundry-pool-{self.unit}-{self._numbers}",
            daemon=True,
        )
        process.start()
        child.close()
        life_r.close()
        return _Worker(self._numbers, process, parent, life_w)

    # -- closing -------------------------------------------------------------------------

    def close(self, timeout: float = 10.0, *, leftover: str = DEADLINE) -> None:
        """Drain: running and waiting attempts get ``timeout`` to finish; what still waits
        then is answered ``leftover``. A front that can send work elsewhere passes
        ``leftover=BOUNCE``: then what waits is sent back at once (another host's free
        worker takes it sooner than this one, which is going away), and only running
        attempts get the ``timeout``."""
        end = time.monotonic() + max(0.0, timeout)
        bounced: list[_Job] = []
        with self._lock:
            if self._stopped:
                return
            self._closed = True
            if leftover != DEADLINE:
                bounced, self._waiting = list(self._waiting), deque()
        for job in bounced:
            job.done(Reply(leftover, detail="the pool closed before a worker was free"))
        with self._lock:
            while self._waiting or any(w.job is not None for w in self._workers):
                left = end - time.monotonic()
                if left <= 0 or not self._workers:
                    break
                self._drained.wait(min(left, 0.1))
            waiting, self._waiting = list(self._waiting), deque()
            for w in self._workers:
                if w.job is not None:
                    w.killed = f"the pool closed while worker {w.name} was running it"
                    _kill(w)
        for job in waiting:
            job.done(Reply(leftover, detail="the pool closed before a worker was free"))
        # Let the engine thread bury the killed ones (answering their attempts LOST).
        deadline = time.monotonic() + 2.0
        with self._lock:
            while any(w.job is not None for w in self._workers) and time.monotonic() < deadline:
                self._drained.wait(0.05)
            self._stopped = True
        self._wake()
        self._ended.wait(5.0 + STOP_GRACE)
        if self._loop is None or self._ended.is_set():
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _stop_all(self) -> None:
        with self._lock:
            workers, self._workers, self._free = list(self._workers), [], []
            self._changes += 1
        for w in workers:
            try:
                w.conn.send_bytes(_STOP)
            except (OSError, ValueError):
                pass
        end = time.monotonic() + STOP_GRACE
        for w in workers:
            w.process.join(max(0.0, end - time.monotonic()))
            if w.process.exitcode is None:
                _kill(w)
                w.process.join(1.0)
            if w.job is not None:
                w.job.done(Reply(LOST, worker=w.name, detail="the pool closed while it ran"))
            for closing in (w.conn, w.lifeline):
                try:
                    closing.close()
                except OSError:
                    pass


def _kill(worker: _Worker) -> None:
    try:
        worker.process.kill()
    except (OSError, ValueError, AttributeError):
        pass


class LocalFront:
    """What the fronts that serve a :class:`LocalPool` to other processes share (the NATS
    worker host, the served local pool): sizing goes to the dispatcher, and start-up
    waits for its first workers."""

    local: LocalPool
    unit: str
    where = ""  # for messages: " on nats://…"
    ready_fix = "check that the unit's module imports in a fresh process"

    def size(self) -> int:
        return self.local.size()

    def resize(self, workers: int) -> None:
        self.local.resize(workers)

    def stats(self) -> EngineStats:
        return self.local.stats()

    @property
    def fatal(self) -> str:
        return self.local.fatal

    def ready(self) -> None:
        """Called once the first workers are ready."""

    def wait_ready(self, timeout: float) -> None:
        """Wait until the first target of workers is ready; raise when none can start."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            stats = self.stats()
            if stats.live >= self.size():
                self.ready()
                return
            if self.fatal and stats.live == 0:
                break
            time.sleep(0.02)
        raise BackendUnavailableError(
            f"unit {self.unit!r}: its pool workers did not start within {timeout:g}s{self.where}"
            + (f": {self.fatal}" if self.fatal else "")
            + f". Fix: {self.ready_fix}"
        )
