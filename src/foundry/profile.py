"""Measure a callable to answer the questions its author did not: ``foundry profile``.

Runs the callable on sample input ``runs`` times and measures, per run, wall time
(``time.perf_counter``), CPU time of the calling thread (``time.thread_time``) and of
the whole process (``time.process_time``) plus its waited-for children
(``resource.getrusage``): work pushed to other threads or to a subprocess such as
ffmpeg still counts, then one extra run
under ``tracemalloc`` for peak Python memory (kept out of the timed runs: tracing
slows allocation-heavy code several-fold). The CPU/wall ratio classifies the work:

- ``>= 0.8``  compute-bound (``bound="cpu"``), above 1.2 it also used several cores;
- ``<= 0.2``  waiting-bound (``bound="io"``);
- otherwise   mixed: split the computing part into a phase.

For compute-bound work under the GIL it then asks whether the code releases the GIL
(native code: hashlib on large buffers, zlib, ``cryptography``, numpy): it runs the
callable in 2 threads at once and compares calls per second with 1 thread. About 2×
means it releases the GIL (``releases_gil=True``: a thread pool uses the cores); about
1× means pure Python holding it (process workers are needed). Where the measurement
contradicts the declaration — ``bound``, ``est`` off by 2× or more either way,
``releases_gil`` — it says so (``foundry.decide.drift``) and the decision is re-made
with the measured values (``foundry.decide.reclassify``).

Async callables run on a fresh event loop in this thread (``asyncio.run``), so the
loop's own overhead is part of the measurement, as it is in production.

``current_host()`` reads the interpreter facts the pure engine needs (cores, GIL).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import statistics
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from foundry.decide import Decision, Host, Measured, drift, reclassify
from foundry.errors import DeclarationError, SubmitError
from foundry.traits import Traits

__all__ = [
    "COMPUTE_RATIO",
    "HOLDS_GIL",
    "RELEASES_GIL",
    "WAIT_RATIO",
    "Profile",
    "Run",
    "classify",
    "current_host",
    "gil_verdict",
    "profile_callable",
]

COMPUTE_RATIO = 0.8
WAIT_RATIO = 0.2
MAX_RUNS = 10_000
RELEASES_GIL = 1.5  # 2 threads do at least this many times the calls per second of 1
HOLDS_GIL = 1.25  # ... at most this many: the threads took turns
PROBE_SECONDS = 0.05  # each probe thread runs at least this long (short calls repeat)
PROBE_MIN = 0.001  # calls shorter than this are not probed


def current_host() -> Host:
    """This interpreter: usable cores and whether the GIL is enabled.

    ``sys._is_gil_enabled()`` exists from CPython 3.13; before it, CPython always has
    the GIL.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    check = getattr(sys, "_is_gil_enabled", None)
    gil = bool(check()) if callable(check) else True
    return Host(cores=cores, gil=gil)


@dataclass(frozen=True, slots=True)
class Run:
    wall: float
    thread_cpu: float
    process_cpu: float


@dataclass(frozen=True, slots=True)
class Profile:
    """What the measurement found, the traits it infers and the decision they lead to."""

    target: str
    runs: tuple[Run, ...]
    peak_memory: int  # bytes allocated by Python at the peak of one run (tracemalloc)
    host: Host
    declared: Traits
    inferred: Traits
    decision: Decision
    disagreements: tuple[str, ...] = field(default=())
    gil_speedup: float | None = None  # 2 threads' calls per second ÷ 1 thread's (compute under the GIL)

    @property
    def releases_gil(self) -> bool | None:
        """What the 2-thread probe says (``None``: not probed, or inconclusive)."""
        return None if self.gil_speedup is None else gil_verdict(self.gil_speedup)

    @property
    def wall(self) -> float:
        return statistics.median(r.wall for r in self.runs)

    @property
    def cpu(self) -> float:
        return statistics.median(r.process_cpu for r in self.runs)

    @property
    def ratio(self) -> float:
        wall = sum(r.wall for r in self.runs)
        return sum(r.process_cpu for r in self.runs) / wall if wall > 0 else 0.0

    @property
    def bound(self) -> str:
        return classify(self.ratio)

    @property
    def kind(self) -> str:
        return {"cpu": "compute-bound", "io": "waiting-bound", "mixed": "mixed"}[self.bound]

    def as_dict(self) -> dict[str, Any]:
        walls = [r.wall for r in self.runs]
        return {
            "target": self.target,
            "runs": len(self.runs),
            "wall_seconds": {"median": self.wall, "min": min(walls), "max": max(walls)},
            "cpu_seconds": {
                "median": self.cpu,
                "thread_median": statistics.median(r.thread_cpu for r in self.runs),
            },
            "cpu_wall_ratio": self.ratio,
            "classification": self.kind,
            "peak_memory_bytes": self.peak_memory,
            "host": {"cores": self.host.cores, "gil": self.host.gil},
            "inferred_traits": {
                "est": self.inferred.est,
                "bound": self.inferred.bound,
                "releases_gil": self.inferred.releases_gil,
            },
            "gil_probe": None
            if self.gil_speedup is None
            else {"threads": 2, "speedup": self.gil_speedup, "releases_gil": self.releases_gil},
            "disagreements": list(self.disagreements),
            "decision": {
                "delivery": self.decision.delivery,
                "execution": self.decision.execution,
                "decided_by": self.decision.decided_by,
                "answer": self.decision.deciding_answer,
                "notes": list(self.decision.notes),
                "load": list(self.decision.load.lines),
                "warnings": [w.code for w in self.decision.warnings],
            },
        }


def classify(ratio: float) -> str:
    """``"cpu"``, ``"io"`` or ``"mixed"`` from a CPU/wall ratio."""
    if ratio >= COMPUTE_RATIO:
        return "cpu"
    if ratio <= WAIT_RATIO:
        return "io"
    return "mixed"


def gil_verdict(speedup: float) -> bool | None:
    """From the 2-thread probe: ``True`` (releases the GIL), ``False`` (holds it) or
    ``None`` when the ratio is between the two (a loaded machine; probe again)."""
    if speedup >= RELEASES_GIL:
        return True
    if speedup <= HOLDS_GIL:
        return False
    return None


def _gil_probe(
    fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], serial: Sequence[Run]
) -> float | None:
    """Calls per second of 2 threads running ``fn`` at once ÷ that of 1 (``serial``)."""
    total = sum(r.wall for r in serial)
    if total <= 0:
        return None
    median = statistics.median(r.wall for r in serial)
    calls = max(2, len(serial), min(MAX_RUNS, math.ceil(PROBE_SECONDS / max(median, 1e-6))))
    start = threading.Barrier(3)
    errors: list[BaseException] = []

    def worker() -> None:
        start.wait()
        try:
            for _ in range(calls):
                fn(*args, **kwargs)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, name=f"foundry-gil-probe-{i}") for i in range(2)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    took = time.perf_counter() - began
    if errors:
        raise errors[0]
    if took <= 0:
        return None
    return (2 * calls / took) / (len(serial) / total)


def _process_cpu() -> float:
    """CPU of every thread of this process (``process_time``: a precise clock, unlike
    ``getrusage``'s accounting ticks) plus that of children already waited for."""
    if sys.platform == "win32":  # pragma: no cover - no getrusage; children are not counted
        return time.process_time()
    import resource

    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def _invoke(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        return asyncio.run(_await(result))
    return result


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _clock() -> tuple[float, float, float]:
    # The wall clock is read innermost, the CPU clocks around it: for a call of a few
    # microseconds the cost of reading the clocks must not look like waiting.
    thread, proc = time.thread_time(), _process_cpu()
    return time.perf_counter(), thread, proc


def _since(start: tuple[float, float, float]) -> Run:
    wall = time.perf_counter()
    thread, proc = time.thread_time(), _process_cpu()
    return Run(wall - start[0], thread - start[1], proc - start[2])


def _measure_sync(
    fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], runs: int
) -> list[Run]:
    out = []
    for _ in range(runs):
        start = _clock()
        fn(*args, **kwargs)
        out.append(_since(start))
    return out


async def _measure_async(
    fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], runs: int
) -> list[Run]:
    # One loop for every run, timed around the await only: loop start-up is not the work's.
    out = []
    for _ in range(runs):
        start = _clock()
        await fn(*args, **kwargs)
        out.append(_since(start))
    return out


def _peak_memory(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
    already = tracemalloc.is_tracing()
    if not already:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base, _ = tracemalloc.get_traced_memory()
    try:
        _invoke(fn, args, kwargs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if not already:
            tracemalloc.stop()
    return max(0, peak - base)


def profile_callable(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    runs: int = 5,
    target: str = "",
    declared: Traits | None = None,
    host: Host | None = None,
    gil_probe: bool = True,
) -> Profile:
    """Run ``fn(*args, **kwargs)`` ``runs`` times (plus one traced run for memory),
    infer ``est`` and ``bound`` (and, for computing under the GIL, whether it releases
    the GIL: ``gil_probe``), and re-decide the ``declared`` traits with them.

    Exceptions from ``fn`` propagate: a profile of a failing call means nothing.
    """
    name = target or getattr(fn, "__qualname__", repr(fn))
    if isinstance(runs, bool) or not isinstance(runs, int) or not 1 <= runs <= MAX_RUNS:
        raise DeclarationError(name, "runs", runs, "is out of range", f"give --runs between 1 and {MAX_RUNS}")
    kwargs = dict(kwargs or {})
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as exc:
        raise SubmitError(
            f"{name}: these arguments do not fit its signature ({exc}). Fix: match the parameters "
            f"of {name}{_signature(fn)}"
        ) from exc
    except ValueError:
        pass  # no signature to check (some builtins): let the call decide
    if inspect.iscoroutinefunction(fn):
        measured = tuple(asyncio.run(_measure_async(fn, args, kwargs, runs)))
    else:
        measured = tuple(_measure_sync(fn, args, kwargs, runs))
    peak = _peak_memory(fn, args, kwargs)
    host = host if host is not None else current_host()
    declared = declared if declared is not None else Traits()
    wall = statistics.median(r.wall for r in measured)
    total_wall = sum(r.wall for r in measured)
    ratio = sum(r.process_cpu for r in measured) / total_wall if total_wall > 0 else 0.0
    bound = classify(ratio)
    speedup: float | None = None
    probe = gil_probe and bound == "cpu" and host.gil is not False and (host.cores or 1) >= 2
    # Below a millisecond a call is mostly the clocks' and the loop's own cost: no verdict.
    if probe and wall >= PROBE_MIN and not inspect.iscoroutinefunction(fn):
        speedup = _gil_probe(fn, args, kwargs, measured)
    verdict = None if speedup is None else gil_verdict(speedup)
    found = Measured(est=wall, bound=bound, releases_gil=verdict, source="foundry profile")
    disagreements = [
        f"{line} (CPU/wall {ratio:.2f})" if line.startswith("declared bound=") else line
        for line in drift(declared, found)
    ]
    inferred = declared.merged(
        est=wall, bound=bound, **({} if verdict is None else {"releases_gil": verdict})
    )
    return Profile(
        target=name,
        runs=measured,
        peak_memory=peak,
        host=host,
        declared=declared,
        inferred=inferred,
        decision=reclassify(declared, found, host=host),
        disagreements=tuple(disagreements),
        gil_speedup=speedup,
    )


def _signature(fn: Callable[..., Any]) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"
