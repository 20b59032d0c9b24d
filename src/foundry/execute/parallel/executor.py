"""The ``parallel`` executor: runs one map, by a plan, on this machine's processes or a cluster.

It measures what the planner (:mod:`foundry.execute.parallel.plan`) needs — the per-item
cost, by running the first items in the caller and keeping their results, and the
pickling cost of shipping them — asks it for a :class:`ChunkPlan`, then carries it out:
sequentially in the caller, or chunk by chunk on the ``processes`` model's pool (or the
cluster's workers), at most :data:`IN_FLIGHT_PER_WORKER` chunks per worker in flight,
results put back in input order. What a worker runs for a chunk is
:mod:`foundry.execute.parallel._chunk`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import pickle
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from foundry.backends.cluster import ChunkCall, ClusterEngine, is_local, open_cluster
from foundry.config import check_url
from foundry.errors import CancelledError, ClusterUnavailableError, SubmitError, WorkTimeoutError
from foundry.execute._task import Task
from foundry.execute.instrument import UnitMetrics, usable_cpus
from foundry.execute.parallel._chunk import map_resuming, run_chunk, run_shipped_chunk
from foundry.execute.parallel._progress import ProgressBar, show_progress
from foundry.execute.parallel.plan import (
    DEFAULT_THRESHOLD,
    MIN_WORK,
    PIPE_BYTE_SECONDS,
    ChunkPlan,
    plan_chunks,
)
from foundry.execute.processes import ProcessPool
from foundry.handle import Outcome
from foundry.observe import names
from foundry.observe.metrics import Registry
from foundry.serialize import DEFAULT_ERROR_TYPES, decode_error

__all__ = ["MODEL", "ParallelExecutor"]

MODEL = "parallel"
PROBE_SECONDS = 0.002
PROBE_MAX_ITEMS = 256
PROBE_TRIM = 0.05  # the share of the probe's slowest items left out of its mean
SEQUENTIAL_BATCH = 4096
IN_FLIGHT_PER_WORKER = 2
AHEAD = 1  # chunks handed to a busy child behind the one it computes (IN_FLIGHT_PER_WORKER - 1)
SHIP_REPEATS = 3


def _ship_cost(items: Sequence[Any], results: Sequence[Any]) -> float | None:
    """Seconds per item to serialise items and their results both ways — what the caller
    and a worker spend between them (pickle, unpickle) — plus their bytes through the
    pipe (:data:`~foundry.execute.parallel.plan.PIPE_BYTE_SECONDS`); ``None`` when
    something does not pickle (the run then says so, with the item's index)."""
    if not items:
        return None
    items, results = list(items), list(results)
    best = math.inf
    for _ in range(SHIP_REPEATS):  # the fastest of a few: a descheduled caller is not shipping
        started = time.perf_counter()
        try:
            sent = pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL)
            pickle.loads(sent)
            back = pickle.dumps(results, protocol=pickle.HIGHEST_PROTOCOL)
            pickle.loads(back)
        except Exception:
            return None
        best = min(best, time.perf_counter() - started)
        if best > PROBE_SECONDS:  # big payloads: once is enough, and a repeat is costly
            break
    return (best + (len(sent) + len(back)) * PIPE_BYTE_SECONDS) / len(items)


def _trimmed_mean(took: list[float]) -> float:
    """The mean per-item time without the slowest :data:`PROBE_TRIM` of the items: on a
    shared machine the caller can be descheduled for milliseconds in the middle of a
    2 ms probe, and one such item would make microsecond items look like milliseconds
    (and the plan cut the run into thousands of tiny chunks)."""
    kept = sorted(took)[: len(took) - int(len(took) * PROBE_TRIM)]
    return sum(kept) / len(kept)


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
    ship: float | None = None  # measured serialisation cost per item, both ways (see plan_chunks)
    bar: ProgressBar | None = None

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
        ahead: int = AHEAD,
    ) -> None:
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise SubmitError(f"parallel {name!r}: workers={workers!r} must be an integer ≥ 1, or None")
        if cluster is not None:
            check_url("cluster", cluster)
        self.cluster = None if is_local(cluster) else cluster
        self._cap = workers
        self.workers = workers or usable_cpus()  # on a cluster: the cores of the last run
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
        self._ahead = ahead  # chunks handed ahead to a busy child (0: main's dispatch, for A/B runs)
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
        """Part of ``processes``' crash-contained pool, running
        :func:`~foundry.execute.parallel._chunk.run_chunk`: a child that dies fails only
        its chunk, children die with the parent, and cancelling a run kills the children
        still computing its chunks."""
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPool(
                    f"{self.name}.chunks",
                    run_chunk.__module__,
                    run_chunk.__qualname__,
                    workers=self.workers,
                    max_pending=self.workers * IN_FLIGHT_PER_WORKER,
                    short=False,
                    ahead=self._ahead,  # each child finds its next chunk in its pipe when it answers one
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
        run.bar = bar = ProgressBar(show_progress(progress, plan, console), len(data), self.name, console)
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
        took: list[float] = []
        cpu = time.process_time()
        clock = time.perf_counter
        started = last = clock()
        while count < limit:
            try:
                run.results[count] = fn(data[count], **kw)
            except Exception as exc:
                self._record(run, count, exc)
                failed += 1
            count += 1
            now = clock()
            took.append(now - last)
            last = now
            if now - started >= PROBE_SECONDS:
                break
        run.cpu += time.process_time() - cpu
        self._m.completed.inc(count - failed)
        self._m.failed.inc(failed)
        run.ship = _ship_cost(data[:count], run.results[:count])
        readings = [clock() for _ in range(6)]  # what the probe's own reading of the clock costs
        tick = min(b - a for a, b in itertools.pairwise(readings))
        return count, max(0.0, _trimmed_mean(took) - tick)

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
            batch, failed = map_resuming(call, data[index:stop])
            results[index:stop] = batch
            for offset in failed:
                self._record(run, index + offset, batch[offset])
            self._m.completed.inc(stop - index - len(failed))
            self._m.failed.inc(len(failed))
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
        bounds = plan.bounds(start)
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
            run_shipped_chunk, (shipped, lo, payload), unit=name, chunk=number
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
        _, shipped, failures, cpu = outcome.value
        run.results[lo:hi] = pickle.loads(shipped) if isinstance(shipped, bytes) else shipped
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
