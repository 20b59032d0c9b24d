"""``parallel``: partition → map → merge over data in memory, on processes.

::

    from foundry.execute.parallel import parallel_map

    scores = parallel_map(score, rows)                  # a list, in input order
    scores = parallel_map(score, rows, chunksize=500)   # explicit chunking
    scores = parallel_map(score, rows, errors="return") # failed items hold their exception

    @app.work(partitionable=True, est="2ms")            # a unit: its function takes one item,
    def score(row): ...                                 # the unit is called with all of them
    scores = score(rows)

How it runs:

- **Plan** (:func:`plan_chunks`): inputs below ``threshold`` items, or whose estimated
  work is under ``min_work`` seconds, run *sequentially in the caller* — processes would
  cost more than they save — and the plan says so ("fell back to sequential: 12 items <
  threshold 64"). Otherwise the per-item cost (``est``, or measured on the first items
  in the caller, whose results are kept) sizes chunks so that each carries at least a few
  milliseconds of work (IPC stays small) and there are about four chunks per worker (a
  slow chunk cannot hold the join for long: load imbalance is bounded by one chunk).
- **Map**: chunks go to the ``processes`` model's crash-contained pool (a child that
  dies loses its chunk only; children die with the parent), at most two per
  worker in flight, so memory stays bounded; each chunk is pickled in the caller, so an
  item that cannot be sent fails with :class:`~foundry.errors.SubmitError` naming its index.
  With ``cluster=`` (``tcp://scheduler:8786`` for Dask, ``ray://head:10001`` for Ray;
  :mod:`foundry.backends.cluster`) the same chunks go to that cluster's workers instead,
  with the same bound in flight; "workers" is then the cores the cluster offers (capped
  by ``workers=``), asked at the start of each run.
- **Merge**: results are put back in input order at the join.
  A failed item raises its original exception type, noted with its index and chunk; the
  other chunks still complete (``errors="return"`` keeps every outcome).

A progress bar (rich) shows for runs expected to last a second or more when the console is
a terminal; ``progress=False`` turns it off, ``progress=True`` forces it.

What the model keeps: every item is computed once and its result lands at its own index;
one item's failure does not discard the others'. Nothing is persisted: a crash of the
caller loses the run. Float reductions may differ from a sequential run (the order of
additions changes).

Metrics: ``foundry_unit_completed_total`` / ``failed`` count items (``unit``, ``model`` =
``parallel``), ``foundry_unit_in_flight`` the items in dispatched chunks,
``foundry_unit_duration_seconds`` whole runs, and ``foundry_cpu_utilisation`` the
fraction of the workers' cores the last run kept busy (CPU seconds ÷ wall × workers).
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import dataclasses
import functools
import math
import os
import pickle
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from foundry.backends.cluster import ChunkCall, ClusterEngine, is_local, open_cluster
from foundry.config import check_url
from foundry.decide.model import Decision
from foundry.errors import (
    CancelledError,
    ClusterUnavailableError,
    OverloadError,
    SubmitError,
    WorkTimeoutError,
)
from foundry.execute._task import Task
from foundry.execute.instrument import IdMaker, UnitMetrics, check_in_process_options
from foundry.execute.processes import ProcessPool
from foundry.handle import FutureSource, Handle, Outcome
from foundry.observe import names
from foundry.observe.metrics import Registry
from foundry.runtime import RuntimeContext, SubmitOptions, UnitSpec
from foundry.serialize import DEFAULT_ERROR_TYPES, decode_error, encode_error

__all__ = [
    "ChunkPlan",
    "ParallelExecutor",
    "ParallelRunner",
    "make_runner",
    "parallel_map",
    "plan_chunks",
]

MODEL = "parallel"
_new_id = IdMaker("par")
DEFAULT_THRESHOLD = 64
"""Inputs with fewer items run sequentially in the caller."""
MIN_WORK = 0.1
"""Seconds of estimated total work below which processes cost more than they save."""
CHUNKS_PER_WORKER = 4
MIN_CHUNK_SECONDS = 0.005
MAX_CHUNK_SECONDS = 0.1
PROBE_SECONDS = 0.002
PROBE_MAX_ITEMS = 256
SEQUENTIAL_BATCH = 4096
SHIP_FLOOR = 1e-6
"""Seconds an item costs to send to a process and back, at the least (pipe, queue threads)."""
SHIP_FACTOR = 4.0
"""The round trip costs about this many times the caller's measured pickling share."""
IN_FLIGHT_PER_WORKER = 2


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """How one run is split, and why. ``mode`` is ``"processes"`` or ``"sequential"``."""

    items: int
    workers: int
    mode: Literal["processes", "sequential"]
    chunksize: int
    chunks: int
    est: float | None
    reason: str
    probed: int = 0  # items run in the caller to measure ``est`` (their results are kept)
    ship: float | None = None  # estimated seconds to send one item and its result across
    engine: str = "local"  # where the chunks are computed: "local" processes, "dask", "ray"

    @property
    def expected_seconds(self) -> float | None:
        """Estimated wall time (work ÷ workers); ``None`` without an estimate."""
        if self.est is None:
            return None
        lanes = self.workers if self.mode == "processes" else 1
        return self.items * self.est / lanes

    @property
    def note(self) -> str:
        return self.reason if self.mode == "sequential" else f"parallel: {self.reason}"


def _fmt_seconds(seconds: float) -> str:
    if seconds < 1e-5:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def plan_chunks(
    items: int,
    *,
    workers: int,
    est: float | None = None,
    chunksize: int | None = None,
    threshold: int = DEFAULT_THRESHOLD,
    min_work: float = MIN_WORK,
    probed: int = 0,
    ship: float | None = None,
) -> ChunkPlan:
    """Decide sequential vs processes and the chunk size. Pure; ``items`` excludes probed ones.

    ``ship`` is the measured cost of pickling one item and its result (the caller's share
    of IPC); the real round trip costs several times that, and never less than
    ``SHIP_FLOOR``.
    """

    def sequential(reason: str) -> ChunkPlan:
        return ChunkPlan(
            items, workers, "sequential", max(1, items), 1 if items else 0, est, reason, probed, ship
        )

    total = items + probed
    if chunksize is not None:
        if isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1:
            raise SubmitError(
                f"parallel: chunksize={chunksize!r} must be an integer ≥ 1, or None for automatic"
            )
        if workers <= 1 or items == 0:
            return sequential(f"fell back to sequential: {workers} worker(s), {items} item(s)")
        chunks = math.ceil(items / chunksize)
        return ChunkPlan(
            items,
            workers,
            "processes",
            chunksize,
            chunks,
            est,
            f"{chunks} chunks of {chunksize} (explicit)",
            probed,
        )
    if total < threshold:
        return sequential(f"fell back to sequential: {total} items < threshold {threshold}")
    if workers <= 1:
        return sequential("fell back to sequential: one worker (a single core is available)")
    if est is not None and items * est < min_work:
        return sequential(
            f"fell back to sequential: {items} items × {_fmt_seconds(est)} ≈ {_fmt_seconds(items * est)} "
            f"of work < {_fmt_seconds(min_work)}, less than shipping it to processes costs"
        )
    round_trip = max(SHIP_FLOOR, SHIP_FACTOR * (ship or 0.0))
    if est is not None and est * (1 - 1 / workers) < round_trip:
        return sequential(
            f"fell back to sequential: an item computes in ≈ {_fmt_seconds(est)} but costs ≈ "
            f"{_fmt_seconds(round_trip)} to ship to a process and back; {workers} workers would "
            "spend more time shipping than they save"
        )
    size = math.ceil(items / (workers * CHUNKS_PER_WORKER))
    if est is not None and est > 0:
        low = math.ceil(MIN_CHUNK_SECONDS / est)
        high = max(low, math.floor(MAX_CHUNK_SECONDS / est))
        size = min(max(size, low), high)
    size = max(1, size)
    chunks = math.ceil(items / size)
    if chunks > workers and chunks % workers:  # a last round with idle workers: even it out
        chunks += workers - chunks % workers
        size = max(1, math.ceil(items / chunks))
        chunks = math.ceil(items / size)
    per = f" ≈ {_fmt_seconds(size * est)} each" if est else ""
    return ChunkPlan(
        items,
        workers,
        "processes",
        size,
        chunks,
        est,
        f"{chunks} chunks of {size} items{per} over {workers} workers",
        probed,
        ship,
    )


def _pickling_cost(items: Sequence[Any], results: Sequence[Any]) -> float | None:
    """Seconds per item the caller spends pickling items and unpickling results."""
    if not items:
        return None
    started = time.perf_counter()
    try:
        pickle.dumps(list(items), protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(pickle.dumps(list(results), protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # unpicklable: the run will say so, with the item's index
        return None
    return (time.perf_counter() - started) / len(items)


# -- the child side -------------------------------------------------------------------


def _portable(error: BaseException) -> Any:
    """The exception itself when it pickles (type and notes survive), else a JSON record."""
    error.add_note(
        f"--- raised in worker pid {os.getpid()} ---\n{''.join(traceback.format_exception(error))}"
    )
    try:
        pickle.dumps(error)
    except Exception:
        return encode_error(error)
    return error


def _run_chunk(fn: Callable[..., Any], start: int, payload: bytes, kwargs: dict[str, Any]) -> Any:
    """Runs in a child: map ``fn`` over one chunk, item by item; failures are recorded,
    not raised, so one bad item does not lose its neighbours' results."""
    cpu = time.process_time()
    items = pickle.loads(payload)
    results: list[Any] = []
    failures: list[tuple[int, Any]] = []
    for offset, item in enumerate(items):
        try:
            results.append(fn(item, **kwargs))
        except Exception as exc:
            results.append(None)
            failures.append((start + offset, _portable(exc)))
    return start, results, failures, time.process_time() - cpu


def _run_shipped_chunk(shipped: bytes, start: int, payload: bytes) -> Any:
    """Runs on a cluster worker: :func:`_run_chunk` with the function and its keyword
    arguments unpickled *here*, inside the task. A worker that cannot import the
    function then fails this task with the ``ModuleNotFoundError`` (which the engine
    reports with the fix) instead of failing to decode the task message itself, which
    Dask does not report to the client at all: the run would hang."""
    fn, kwargs = pickle.loads(shipped)
    return _run_chunk(fn, start, payload, kwargs)


# -- the parent side ------------------------------------------------------------------


_progress_lock = threading.Lock()


class _Progress:
    """A rich progress bar, or nothing (not a terminal, asked not to, or one is showing)."""

    def __init__(self, enabled: bool, total: int, label: str, console: Any) -> None:
        self._bar: Any = None
        self._task: Any = None
        if not enabled or not _progress_lock.acquire(blocking=False):
            return
        try:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=console,
                transient=False,
            )
            self._task = self._bar.add_task(label, total=total)
            self._bar.start()
        except Exception:
            self._bar = None
            _progress_lock.release()

    def advance(self, n: int) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
            _progress_lock.release()


def _show_progress(progress: bool | None, plan: ChunkPlan, console: Any) -> bool:
    if progress is not None:
        return progress
    if console is None or not getattr(console, "is_terminal", False):
        return False
    expected = plan.expected_seconds
    return expected >= 1.0 if expected is not None else plan.items >= 10_000


@dataclass(slots=True)
class _Run:
    """One map in progress: what it maps, its results, failures and accounting."""

    fn: Callable[..., Any]
    data: Sequence[Any]
    kw: dict[str, Any]
    deadline: float | None
    cancel: threading.Event | None
    results: list[Any]
    failures: dict[int, BaseException] = dataclasses.field(default_factory=dict)
    cpu: float = 0.0
    start: int = 0  # items before this ran in the caller while probing
    ship: float | None = None  # measured pickling cost per item (see plan_chunks)
    bar: _Progress | None = None

    @property
    def total(self) -> int:
        return len(self.data)


class ParallelExecutor:
    """Owns a process pool, or a connection to a cluster (``cluster=``), made on first
    need, and runs maps on it. Thread-safe."""

    def __init__(
        self,
        *,
        workers: int | None = None,
        name: str = "parallel",
        metrics: Registry | None = None,
        cluster: str | None = None,
    ) -> None:
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise SubmitError(f"parallel {name!r}: workers={workers!r} must be an integer ≥ 1, or None")
        if cluster is not None:
            check_url("cluster", cluster)
        self.cluster = None if is_local(cluster) else cluster
        self._cap = workers
        self.workers = workers or default_workers()  # on a cluster: the cores of the last run
        self._engine: ClusterEngine | None = None
        self.name = name
        self.metrics = metrics if metrics is not None else Registry()
        self._in_chunks = 0  # items in dispatched, unfinished chunks
        # Items are counted in bulk (completed/failed), durations are whole runs.
        self._m = UnitMetrics(self.metrics, name, MODEL, in_flight=lambda: float(self._in_chunks))
        self._cpu = self.metrics.gauge(
            names.CPU_UTILISATION, "Fraction of the workers' cores kept busy", ("unit",)
        ).labels(name)
        self._lanes = self.metrics.gauge(
            names.PARALLEL_WORKERS, "Workers the last run spread its chunks over", ("unit", "engine")
        )
        self._lost = self.metrics.counter(
            names.PARALLEL_CHUNKS_LOST,
            "Chunks lost as a whole (their worker died, or the cluster went away)",
            ("unit", "engine"),
        )
        self._pool: ProcessPool | None = None
        self._lock = threading.Lock()
        self.plans: deque[ChunkPlan] = deque(maxlen=32)

    @property
    def engine(self) -> str:
        """Where chunks are computed: ``"local"``, ``"dask"`` or ``"ray"`` (once connected)."""
        if self.cluster is None:
            return "local"
        return self._engine.kind if self._engine is not None else self.cluster.split("://", 1)[0]

    def _get_engine(self) -> ClusterEngine:
        assert self.cluster is not None
        with self._lock:
            if self._engine is None:
                self._engine = open_cluster(self.cluster)
            return self._engine

    def _workers_now(self) -> int:
        """The workers to plan for: this machine's (fixed), or what the cluster offers now
        (capped by ``workers=``)."""
        if self.cluster is None:
            return self.workers
        cores = self._get_engine().cores()
        self.workers = min(cores, self._cap) if self._cap else cores
        return self.workers

    @property
    def last_plan(self) -> ChunkPlan | None:
        return self.plans[-1] if self.plans else None

    def _get_pool(self) -> ProcessPool:
        """Part of ``processes``' crash-contained pool, running :func:`_run_chunk`: a child
        that dies fails only its chunk, children die with the parent, and cancelling a
        run kills the children still computing its chunks."""
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPool(
                    f"{self.name}.chunks",
                    __name__,
                    _run_chunk.__qualname__,
                    workers=self.workers,
                    max_pending=self.workers * IN_FLIGHT_PER_WORKER,
                    short=False,  # never hand chunks ahead: cancellation stays exact
                    registry=self.metrics,
                )
            return self._pool

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
            engine, self._engine = self._engine, None
        if pool is not None:
            pool.close()
        if engine is not None:
            engine.close()
        self._m.flush()

    # -- one run ----------------------------------------------------------------

    def map(
        self,
        fn: Callable[..., Any],
        items: Iterable[Any],
        *,
        kwargs: dict[str, Any] | None = None,
        chunksize: int | None = None,
        est: float | None = None,
        threshold: int = DEFAULT_THRESHOLD,
        min_work: float = MIN_WORK,
        progress: bool | None = None,
        console: Any = None,
        errors: Literal["raise", "return"] = "raise",
        timeout: float | None = None,
        cancel: threading.Event | None = None,
    ) -> list[Any]:
        """``[fn(item, **kwargs) for item in items]`` on processes (or the cluster's
        workers), in input order."""
        if errors not in ("raise", "return"):
            raise SubmitError(f"parallel {self.name!r}: errors={errors!r}. Fix: use 'raise' or 'return'")
        data: Sequence[Any] = items if isinstance(items, Sequence) else list(items)
        started = time.perf_counter()
        deadline = None if timeout is None else time.monotonic() + timeout
        run = _Run(fn, data, dict(kwargs or {}), deadline, cancel, [None] * len(data))
        # A small input stays in the caller whatever the workers: don't ask the cluster.
        workers = self._workers_now() if len(data) >= threshold or chunksize is not None else self.workers
        probed = 0
        if est is None and chunksize is None and len(data) >= threshold and workers > 1:
            probed, est = self._probe(run)
            run.start = probed
        plan = plan_chunks(
            len(data) - probed,
            workers=workers,
            est=est,
            chunksize=chunksize,
            threshold=threshold,
            min_work=min_work,
            probed=probed,
            ship=run.ship,
        )
        if plan.mode == "processes" and self.cluster is not None:
            engine = self._get_engine()
            plan = dataclasses.replace(
                plan, engine=engine.kind, reason=f"{plan.reason} on {engine.kind} {engine.url}"
            )
        self.plans.append(plan)
        if console is None and progress is not False:
            from rich.console import Console

            console = Console(stderr=True)
        run.bar = bar = _Progress(_show_progress(progress, plan, console), len(data), self.name, console)
        bar.advance(probed)
        try:
            if plan.mode == "sequential":
                self._sequential(run)
            else:
                self._parallel(run, plan)
        finally:
            bar.close()
            wall = time.perf_counter() - started
            self._m.duration.observe(wall)
            if plan.mode == "processes" and wall > 0:
                self._cpu.set(min(1.0, run.cpu / (wall * plan.workers)))
                self._lanes.labels(self.name, plan.engine).set(plan.workers)
        return self._merge(run, plan, errors)

    def _record(self, run: _Run, index: int, error: BaseException, where: str = "in the caller") -> None:
        error.add_note(f"parallel {self.name!r}: item {index} failed ({where})")
        run.failures[index] = error
        run.results[index] = error

    def _probe(self, run: _Run) -> tuple[int, float]:
        """Run the first items here to measure the per-item cost; keep their results."""
        fn, data, kw = run.fn, run.data, run.kw
        limit = max(1, min(PROBE_MAX_ITEMS, len(data) // 8))
        count = failed = 0
        cpu = time.process_time()
        started = time.perf_counter()
        while count < limit:
            try:
                run.results[count] = fn(data[count], **kw)
            except Exception as exc:
                self._record(run, count, exc)
                failed += 1
            count += 1
            if time.perf_counter() - started >= PROBE_SECONDS:
                break
        spent = time.perf_counter() - started
        run.cpu += time.process_time() - cpu
        self._m.completed.inc(count - failed)
        self._m.failed.inc(failed)
        run.ship = _pickling_cost(data[:count], run.results[:count])
        return count, spent / count

    def _check_stop(self, run: _Run, done: int) -> None:
        deadline, cancel, total = run.deadline, run.cancel, run.total
        if cancel is not None and cancel.is_set():
            raise CancelledError(f"parallel {self.name!r}: cancelled after {done} of {total} items")
        if deadline is not None and time.monotonic() > deadline:
            raise WorkTimeoutError(
                f"parallel {self.name!r}: timed out after {done} of {total} items. "
                "Fix: raise the unit's timeout, or give it more workers"
            )

    def _sequential(self, run: _Run) -> None:
        fn, data, kw, bar = run.fn, run.data, run.kw, run.bar
        assert bar is not None
        call = functools.partial(fn, **kw) if kw else fn
        results = run.results
        index, total = run.start, len(data)
        while index < total:  # in batches: stop/timeout checks and metrics per batch, not per item
            self._check_stop(run, index)
            stop = min(total, index + SEQUENTIAL_BATCH)
            failed = 0
            batch: list[Any] = []
            append = batch.append
            items = iter(data[index:stop])
            while True:  # the loop resumes after a failure: no item runs twice
                try:
                    for item in items:
                        append(call(item))
                    break
                except Exception as exc:
                    self._record(run, index + len(batch), exc)
                    append(exc)
                    failed += 1
            results[index:stop] = batch
            self._m.completed.inc(stop - index - failed)
            self._m.failed.inc(failed)
            bar.advance(stop - index)
            index = stop

    def _payload(self, data: Sequence[Any], start: int, stop: int) -> bytes:
        chunk = list(data[start:stop])
        try:
            return pickle.dumps(chunk, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            for offset, item in enumerate(chunk):
                try:
                    pickle.dumps(item)
                except Exception as item_exc:
                    raise SubmitError(
                        f"parallel {self.name!r}: item {start + offset} cannot be sent to a worker process "
                        f"({type(item_exc).__name__}: {item_exc}). Fix: pass plain data (numbers, strings, "
                        "tuples, dicts, arrays), not live objects such as locks, sockets or open files"
                    ) from item_exc
            raise SubmitError(
                f"parallel {self.name!r}: items {start}..{stop - 1} cannot be pickled: {exc}"
            ) from exc

    def _parallel(self, run: _Run, plan: ChunkPlan) -> None:
        fn, data, kw, bar, start = run.fn, run.data, run.kw, run.bar, run.start
        assert bar is not None
        try:
            pickle.dumps(fn)
        except Exception as exc:
            raise SubmitError(
                f"parallel {self.name!r}: the function {getattr(fn, '__qualname__', fn)!r} cannot be sent to "
                f"worker processes ({exc}). Fix: define it at module level (not a lambda or a closure)"
            ) from exc
        send = self._sender(fn, kw)
        bounds = [(s, min(s + plan.chunksize, len(data))) for s in range(start, len(data), plan.chunksize)]
        pending: dict[Task | ChunkCall, tuple[int, int, int]] = {}
        finished: deque[Task | ChunkCall] = deque()
        arrived = threading.Event()

        def on_done(task: Task | ChunkCall) -> Callable[[], None]:
            def done() -> None:
                finished.append(task)
                arrived.set()

            return done

        next_chunk = 0
        done_items = start
        limit = plan.workers * IN_FLIGHT_PER_WORKER
        try:
            while next_chunk < len(bounds) or pending:
                while next_chunk < len(bounds) and len(pending) < limit:
                    lo, hi = bounds[next_chunk]
                    sent = send(next_chunk, lo, self._payload(data, lo, hi))
                    pending[sent] = (next_chunk, lo, hi)
                    sent.add_done_callback(on_done(sent))
                    self._in_chunks += hi - lo
                    next_chunk += 1
                self._check_stop(run, done_items)
                deadline = run.deadline
                arrived.wait(0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic())))
                arrived.clear()
                while finished:
                    done = finished.popleft()
                    number, lo, hi = pending.pop(done)
                    self._in_chunks -= hi - lo
                    self._collect(done.outcome(), run, number, lo, hi, plan.engine)
                    done_items += hi - lo
                    bar.advance(hi - lo)
        finally:
            for task, (_, lo, hi) in pending.items():
                task.cancel()  # queued: dropped; running: its child is killed and replaced
                self._in_chunks -= hi - lo

    def _sender(
        self, fn: Callable[..., Any], kw: dict[str, Any]
    ) -> Callable[[int, int, bytes], Task | ChunkCall]:
        """How one chunk is sent: to this machine's process pool, or to the cluster."""
        if self.cluster is None:
            pool = self._get_pool()
            return lambda number, lo, payload: pool.submit((fn, lo, payload, kw), {})
        engine = self._get_engine()
        name = self.name
        try:  # by reference when importable; a script's own functions (``__main__``) by value
            import cloudpickle  # a dependency of both Dask and Ray

            shipped = cloudpickle.dumps((fn, kw), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise SubmitError(
                f"parallel {name!r}: the keyword arguments cannot be sent to the cluster's workers ({exc}). "
                "Fix: pass plain data (numbers, strings, tuples, dicts, arrays)"
            ) from exc
        return lambda number, lo, payload: engine.submit(
            _run_shipped_chunk, (shipped, lo, payload), unit=name, chunk=number
        )

    def _collect(self, outcome: Outcome, run: _Run, number: int, lo: int, hi: int, engine: str) -> None:
        where = f"chunk {number}, items {lo}..{hi - 1}"
        if outcome.error is not None:  # the chunk as a whole failed (its child died, say)
            error = outcome.error
            self._lost.labels(self.name, engine).inc()
            if isinstance(error, ClusterUnavailableError):  # nothing more can be computed: stop the run
                error.add_note(f"parallel {self.name!r}: the run stopped at {where}")
                raise error
            error.add_note(f"parallel {self.name!r}: {where} were lost with it")
            for index in range(lo, hi):
                run.failures[index] = run.results[index] = error
            self._m.failed.inc(hi - lo)
            return
        _, results, failures, cpu = outcome.value
        run.results[lo:hi] = results
        run.cpu += cpu
        for index, portable in failures:
            if isinstance(portable, BaseException):
                error = portable
            else:  # an unpicklable exception's record: its type only when its module's or admitted
                module = getattr(getattr(run.fn, "func", run.fn), "__module__", None)
                allowed = DEFAULT_ERROR_TYPES.scoped(modules=(module,) if module else ())
                error = decode_error(portable, allowed)
            self._record(run, index, error, where)
        self._m.failed.inc(len(failures))
        self._m.completed.inc(hi - lo - len(failures))

    def _merge(self, run: _Run, plan: ChunkPlan, errors: str) -> list[Any]:
        if run.failures and errors == "raise":
            indices = sorted(run.failures)
            first = run.failures[indices[0]]
            if len(indices) > 1:
                shown = ", ".join(map(str, indices[:10])) + (" ..." if len(indices) > 10 else "")
                first.add_note(
                    f"parallel {self.name!r}: {len(indices)} of {run.total} items failed (indices {shown}); "
                    "pass errors='return' to get every outcome"
                )
            raise first
        return run.results


# -- the shared executor behind parallel_map() ------------------------------------------

_shared: dict[tuple[int | None, str | None], ParallelExecutor] = {}
_shared_lock = threading.Lock()


def _close_shared() -> None:
    with _shared_lock:
        executors = list(_shared.values())
        _shared.clear()
    for executor in executors:
        executor.close()


atexit.register(_close_shared)


def parallel_map(
    fn: Callable[..., Any],
    items: Iterable[Any],
    *,
    workers: int | None = None,
    chunksize: int | None = None,
    est: float | None = None,
    threshold: int = DEFAULT_THRESHOLD,
    progress: bool | None = None,
    errors: Literal["raise", "return"] = "raise",
    timeout: float | None = None,
    cluster: str | None = None,
    **kwargs: Any,
) -> list[Any]:
    """``[fn(item, **kwargs) for item in items]`` on processes, in input order (see the
    module docstring). Uses a shared pool per worker count, closed at exit.

    ``cluster`` (else ``FOUNDRY_CLUSTER``) computes the chunks on a Dask or Ray cluster
    (``tcp://scheduler:8786``, ``ray://head:10001``); one connection per URL, closed at exit."""
    target = cluster or os.environ.get("FOUNDRY_CLUSTER") or None
    if is_local(target):
        target = None
    key = (workers or default_workers(), None) if target is None else (workers, target)
    with _shared_lock:
        executor = _shared.get(key)
        if executor is None:
            executor = _shared[key] = ParallelExecutor(workers=key[0], cluster=target)
    return executor.map(
        fn,
        items,
        kwargs=kwargs,
        chunksize=chunksize,
        est=est,
        threshold=threshold,
        progress=progress,
        errors=errors,
        timeout=timeout,
    )


# -- the runner for @app.work(partitionable=True) units ----------------------------------


class ParallelRunner:
    """Runs a ``parallel`` unit: ``unit(items)`` maps its per-item function over ``items``."""

    def __init__(self, spec: UnitSpec, ctx: RuntimeContext) -> None:
        self.spec = spec
        self.executor = ParallelExecutor(
            workers=spec.traits.concurrency,
            name=spec.name,
            metrics=ctx.metrics,
            cluster=ctx.settings.cluster,
        )
        self._slots = threading.BoundedSemaphore(spec.traits.max_pending or 4)
        self._cancels: set[threading.Event] = set()
        self._closed = False

    @property
    def decision(self) -> Decision:
        """The unit's decision with the last run's plan in its notes ("fell back to ...")."""
        plan = self.executor.last_plan
        if plan is None:
            return self.spec.decision
        return dataclasses.replace(self.spec.decision, notes=(*self.spec.decision.notes, plan.note))

    @property
    def last_plan(self) -> ChunkPlan | None:
        return self.executor.last_plan

    def _data(self, args: tuple[Any, ...]) -> Iterable[Any]:
        if len(args) != 1 or isinstance(args[0], str | bytes) or not isinstance(args[0], Iterable):
            raise SubmitError(
                f"unit {self.spec.name!r} is parallel: call it with one iterable of items (its function "
                f"runs once per item), got {len(args)} positional argument(s). Fix: `{self.spec.name}(rows)`"
            )
        return args[0]

    def _run(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], cancel: threading.Event | None
    ) -> list[Any]:
        return self.executor.map(
            self.spec.fn,
            self._data(args),
            kwargs=kwargs,
            est=self.spec.traits.est,
            timeout=self.spec.traits.timeout,
            cancel=cancel,
        )

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self._run(args, kwargs, None)

    def map(
        self, iterable: Iterable[Any], *, ordered: bool = True, timeout: float | None = None
    ) -> Iterator[Any]:
        """``unit.map(items)``: the whole input is one parallel run (order restored)."""
        yield from self.executor.map(self.spec.fn, iterable, est=self.spec.traits.est, timeout=timeout)

    def submit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        check_in_process_options(self.spec.name, MODEL, options)
        self._data(args)
        if self._closed:
            raise SubmitError(
                f"unit {self.spec.name!r}: its runner is closed. Fix: submit before app.close()"
            )
        if not self._slots.acquire(timeout=30.0):
            raise OverloadError(
                f"unit {self.spec.name!r}: {self.spec.traits.max_pending or 4} parallel runs are already "
                "in progress and none finished within 30 s. Fix: raise max_pending, or wait for results"
            )
        cancel = threading.Event()

        def stop() -> bool:
            cancel.set()  # pending chunks are dropped; running ones finish and are discarded
            return True

        source = FutureSource(on_cancel=stop)
        self._cancels.add(cancel)

        def work() -> None:
            source.running = True
            try:
                source.future.set_result(self._run(args, kwargs, cancel))
            except BaseException as exc:
                try:
                    source.future.set_exception(exc)
                except cf.InvalidStateError:
                    pass
            finally:
                self._cancels.discard(cancel)
                self._slots.release()

        threading.Thread(target=work, name=f"foundry-{self.spec.name}-parallel", daemon=True).start()
        return Handle(_new_id(), self.spec.name, source)

    async def asubmit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        import asyncio

        return await asyncio.to_thread(self.submit, args, kwargs, options)

    def close(self, timeout: float = 10.0) -> None:
        self._closed = True
        deadline = time.monotonic() + timeout
        limit = self.spec.traits.max_pending or 4
        taken = 0
        while taken < limit and self._slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
            taken += 1
        if taken < limit:
            for cancel in list(self._cancels):
                cancel.set()
        for _ in range(taken):
            self._slots.release()
        self.executor.close()


def make_runner(spec: UnitSpec, ctx: RuntimeContext) -> ParallelRunner:
    """The ``parallel`` runner for ``spec`` (see the module docstring)."""
    return ParallelRunner(spec, ctx)
