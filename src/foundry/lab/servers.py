"""Server models under the same offered load: thread per request, a fixed pool, async.

One simulator, three worker shapes (seed 003's "server model lab"). ``concurrency``
requests are in flight at all times (a closed loop with no think time: the knob is
concurrency, and the offered load is derived from it as ``concurrency ÷ (cpu + wait)``).
Each request computes for ``cpu`` then waits for ``wait`` (an upstream call, a query):

- **thread per request**: every in-flight request has its own thread; the CPU phase
  queues for a core (with the GIL, for the one interpreter) and thread start-up costs
  ``spawn`` of CPU; memory is one stack per in-flight request;
- **fixed pool**: ``pool`` threads; a request waits for a free thread and holds it
  through its CPU phase *and its wait* — waiting occupies a worker;
- **async**: one event loop per core, each connection bound to one loop; only the CPU
  phase occupies the loop, waiting occupies nothing but a task frame.

Memory is an estimate — threads × ``stack`` (+ tasks × ``task_frame`` for async) — as
in the seed: real runtimes differ by orders of magnitude (reserved vs touched stack,
hybrids). CPU scheduling is approximated as FCFS on the cores (an OS time-slices); the
means are close, the tails are not. Throughput bounds from the operational laws are
reported beside the simulation so the two can be compared.
"""

from __future__ import annotations

import functools
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from foundry.errors import LabInputError
from foundry.lab.distributions import Dist
from foundry.lab.queueing import check_positive, check_workers
from foundry.lab.sim import EventLoop, sim_label
from foundry.lab.stats import estimate, quantile

__all__ = ["BOUNDS", "MODELS", "ServerResult", "ServerSettings", "compare", "sweep_concurrency"]

MODELS: tuple[str, ...] = ("thread-per-request", "fixed pool", "async")
BOUNDS = "asymptotic bounds (operational laws)"


@dataclass(frozen=True, slots=True)
class ServerSettings:
    concurrency: int = 200
    """Requests in flight at once (the knob)."""
    cpu: float = 0.002
    """CPU time per request (s)."""
    wait: float = 0.048
    """Waiting time per request (s): upstream calls, queries."""
    cores: int = 8
    pool: int = 32
    """Threads in the fixed pool."""
    stack: int = 1024 * 1024
    """Bytes per thread stack (estimate: 1 MiB; glibc reserves 8 MiB, touches far less)."""
    task_frame: int = 4 * 1024
    """Bytes per async task (coroutine frame + task object, estimate)."""
    spawn: float = 0.0001
    """CPU time to start one thread (s), paid per request by thread-per-request."""
    gil: bool = False
    """Threads share one interpreter lock: their CPU phases run one at a time."""
    cv: float = 1.0
    """Coefficient of variation of the CPU and wait phases."""
    memory_limit: int | None = None
    """Bytes available; a model whose estimate exceeds it is marked as failing."""
    requests: int = 20_000
    """Completions simulated per replication (a fifth discarded as warm-up)."""

    def checked(self) -> ServerSettings:
        check_workers("concurrency", self.concurrency, "give at least 1 request in flight")
        check_positive("cpu", self.cpu, 'give the CPU time per request, e.g. "2ms"')
        check_positive("wait", self.wait, 'give the waiting time per request, e.g. "48ms"', allow_zero=True)
        check_workers("cores", self.cores, "give at least 1 core")
        check_workers("pool", self.pool, "give at least 1 pool thread")
        check_workers("stack", self.stack, 'give a stack size, e.g. "1MiB"')
        check_workers("task_frame", self.task_frame, 'give a task size, e.g. "4KiB"')
        check_positive("spawn", self.spawn, 'give a thread start-up cost, e.g. "0.1ms"', allow_zero=True)
        check_positive("cv", self.cv, "give a coefficient of variation ≥ 0", allow_zero=True)
        if self.memory_limit is not None:
            check_workers("memory_limit", self.memory_limit, 'give a memory size, e.g. "2GiB"')
        if not isinstance(self.requests, int) or self.requests < 50:
            raise LabInputError(
                "requests", self.requests, "is fewer than 50", "simulate at least 50 requests"
            )
        return self

    @property
    def offered(self) -> float:
        """Offered load (requests/s): concurrency ÷ (cpu + wait)."""
        return self.concurrency / (self.cpu + self.wait)

    def as_dict(self) -> dict[str, object]:
        return {
            "concurrency": self.concurrency,
            "cpu_s": self.cpu,
            "wait_s": self.wait,
            "cores": self.cores,
            "pool": self.pool,
            "stack_bytes": self.stack,
            "task_frame_bytes": self.task_frame,
            "spawn_s": self.spawn,
            "gil": self.gil,
            "cv": self.cv,
            "memory_limit_bytes": self.memory_limit,
            "offered_per_s": self.offered,
        }


@dataclass(frozen=True, slots=True)
class ServerResult:
    model: str
    throughput: float
    throughput_hw: float
    latency: float
    """Mean latency (s), simulated."""
    latency_hw: float
    p99: float
    p99_hw: float
    memory: int
    """Estimated bytes."""
    max_throughput: float
    """Upper bound from the operational laws."""
    min_latency: float
    """Lower bound on mean latency from the operational laws."""
    bottleneck: str
    fails: str | None
    """Why this model fails outright at these settings (memory), or ``None``."""
    method: str

    def as_dict(self) -> dict[str, object]:
        return {
            "model": self.model,
            "throughput_per_s": self.throughput,
            "throughput_ci_half_width": self.throughput_hw,
            "mean_latency_s": self.latency,
            "mean_latency_ci_half_width": self.latency_hw,
            "p99_s": self.p99,
            "p99_ci_half_width": self.p99_hw,
            "memory_bytes": self.memory,
            "max_throughput_per_s": self.max_throughput,
            "min_latency_s": self.min_latency,
            "bottleneck": self.bottleneck,
            "fails": self.fails,
            "method": self.method,
            "bounds_method": BOUNDS,
        }


class _Server:
    """FCFS servers with ``slots`` places; ``acquire(fn)`` runs ``fn`` when one is free."""

    __slots__ = ("free", "waiting")

    def __init__(self, slots: int) -> None:
        self.free = slots
        self.waiting: deque[Callable[[], None]] = deque()

    def acquire(self, then: Callable[[], None]) -> None:
        if self.free > 0:
            self.free -= 1
            then()
        else:
            self.waiting.append(then)

    def release(self) -> None:
        if self.waiting:
            self.waiting.popleft()()
        else:
            self.free += 1


def _simulate(model: str, s: ServerSettings, rng: random.Random) -> tuple[float, float, float]:
    """(throughput, mean latency, p99) of one replication."""
    loop = EventLoop()
    cpu = Dist.of(s.cpu, s.cv).sampler(rng)
    wait: Callable[[], float] = Dist.of(s.wait, s.cv).sampler(rng) if s.wait > 0 else (lambda: 0.0)
    thread_cores = 1 if s.gil else s.cores
    cores = [_Server(1) for _ in range(s.cores)] if model == "async" else [_Server(thread_cores)]
    pool = _Server(s.pool) if model == "fixed pool" else None
    spawn = s.spawn if model == "thread-per-request" else 0.0
    warm = s.requests // 5
    done = [0]
    latencies: list[float] = []
    window = [0.0, 0.0]

    def start(client: int) -> None:
        sent = loop.now
        core = cores[client % len(cores)]

        def finish() -> None:
            if pool is not None:
                pool.release()
            done[0] += 1
            if done[0] == warm:
                window[0] = loop.now
            elif done[0] > warm:
                latencies.append(loop.now - sent)
                window[1] = loop.now
            if done[0] < s.requests:
                start(client)

        def compute() -> None:
            def computed() -> None:
                core.release()
                loop.after(wait(), finish)

            loop.after(cpu() + spawn, computed)

        def run() -> None:
            core.acquire(compute)

        if pool is not None:
            pool.acquire(run)
        else:
            run()

    for client in range(s.concurrency):
        loop.after(0.0, functools.partial(start, client))
    loop.run(max_events=20 * s.requests + 10 * s.concurrency)
    latencies.sort()
    span = window[1] - window[0]
    throughput = len(latencies) / span if span > 0 else 0.0
    return throughput, math.fsum(latencies) / max(1, len(latencies)), quantile(latencies, 0.99)


def _bounds(model: str, s: ServerSettings) -> tuple[float, float, str]:
    per_request = s.cpu + s.wait
    cpu_slots = s.cores if model == "async" or not s.gil else 1
    cpu_each = s.cpu + (s.spawn if model == "thread-per-request" else 0.0)
    cpu_name = f"CPU ({cpu_slots} {'core' if cpu_slots == 1 else 'cores'}"
    cpu_name += " under the GIL)" if cpu_slots == 1 and s.gil else ")"
    limits = {
        "offered load (concurrency ÷ service)": s.concurrency / (per_request + (cpu_each - s.cpu)),
        cpu_name: cpu_slots / cpu_each,
    }
    if model == "fixed pool":
        limits[f"pool ({s.pool} threads held through the wait)"] = s.pool / per_request
    bottleneck = min(limits, key=lambda k: limits[k])
    x = limits[bottleneck]
    return x, max(per_request + cpu_each - s.cpu, s.concurrency / x), bottleneck


def _memory(model: str, s: ServerSettings) -> int:
    if model == "thread-per-request":
        return s.concurrency * s.stack
    if model == "fixed pool":
        return s.pool * s.stack
    return s.cores * s.stack + s.concurrency * s.task_frame


def compare(
    settings: ServerSettings | None = None,
    *,
    models: Sequence[str] = MODELS,
    replications: int = 3,
    seed: int = 0,
    confidence: float = 0.95,
) -> list[ServerResult]:
    """Each model under the same offered load: simulated figures with CIs, plus bounds."""
    s = (settings or ServerSettings()).checked()
    if not isinstance(replications, int) or replications < 2:
        raise LabInputError("replications", replications, "is fewer than 2", "run at least 2 replications")
    out: list[ServerResult] = []
    for model in models:
        if model not in MODELS:
            raise LabInputError("model", model, "is not a server model", f"use one of {', '.join(MODELS)}")
        memory = _memory(model, s)
        max_x, min_w, bottleneck = _bounds(model, s)
        fails = None
        if s.memory_limit is not None and memory > s.memory_limit:
            fails = (
                f"needs ~{memory / 2**20:,.0f} MiB of stacks, more than the "
                f"{s.memory_limit / 2**20:,.0f} MiB available: the process is OOM-killed or thread "
                "creation fails"
            )
        reps = [_simulate(model, s, random.Random(f"{seed}/{model}/{r}")) for r in range(replications)]
        x, w, p99 = (estimate([rep[i] for rep in reps], confidence) for i in range(3))
        out.append(
            ServerResult(
                model,
                x.mean,
                x.half_width,
                w.mean,
                w.half_width,
                p99.mean,
                p99.half_width,
                memory,
                max_x,
                min_w,
                bottleneck,
                fails,
                sim_label(confidence),
            )
        )
    return out


def sweep_concurrency(
    concurrencies: Sequence[int], settings: ServerSettings | None = None, **kwargs: object
) -> dict[int, list[ServerResult]]:
    """:func:`compare` at each concurrency (for a plot of throughput and latency vs load)."""
    base = settings or ServerSettings()
    out: dict[int, list[ServerResult]] = {}
    for n in concurrencies:
        out[n] = compare(replace(base, concurrency=n), **kwargs)  # type: ignore[arg-type]
    return out
