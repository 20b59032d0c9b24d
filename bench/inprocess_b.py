"""In-process benchmarks, part b: async vs raw asyncio, the watchdog's cost, and
``parallel`` vs ``multiprocessing.Pool.map`` and joblib.

    python bench/inprocess_b.py                  # full run (a few minutes on 2 cores)
    python bench/inprocess_b.py --quick          # a few seconds (the test suite's smoke run)
    python bench/inprocess_b.py --only async     # or --only parallel
    python bench/inprocess_b.py --only parallel --rounds 5
    python bench/inprocess_b.py --only parallel --case 1us --rounds 15   # issue 17's row alone

Every case runs in this one process, variants interleaved repetition by repetition (so
drift in the machine's load hits all of them alike), medians reported.

Ratios. Async rows: the variant's throughput ÷ raw asyncio's, as the median of paired
repetitions, by wall clock and by CPU time of the process (every thread, so the
watchdog's own thread counts; CPU time is what survives a machine shared with other
jobs). The third variant runs the same unit on a Foundry loop thread — the class of the
managed loop, uvloop when installed — where the watchdog is on by default. Watchdog
cost: the same unit with the watchdog on ÷ off (A/B, on and off alternating which goes
first; noisy on a shared machine), and the cost the watchdog accounts for itself — the
watching thread's CPU time plus the time its callbacks took on the loop — as a share of
the run's CPU. Each async timing is one ``asyncio.run`` of 10,000 tasks, as a script
would run them. Parallel rows: Foundry's throughput ÷ that row's, round by round (≥ 1:
Foundry is faster), median and range; the ~1 µs case is issue 17's: 2M items against
``Pool.map(chunksize=10000)`` and joblib over explicit 10,000-item chunks, and the last
row of each case is Foundry against the faster peer of each round.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

# Keep bench/ off sys.path: no script here may shadow a library module.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from foundry.execute.asyncio_loop import LoopThread  # noqa: E402
from foundry.execute.parallel import ParallelExecutor  # noqa: E402
from foundry.observe.metrics import Registry  # noqa: E402
from foundry.observe.watchdog import Watchdog  # noqa: E402

Row = tuple[str, str, float, str, str]  # case, variant, seconds, throughput, ratio
Sample = tuple[float, float, float]  # wall seconds, CPU seconds, the watchdog's accounted CPU seconds


# -- workloads ------------------------------------------------------------------------


def kernel_heavy(n: int) -> str:
    """~1 ms of CPU (hashing), as a CPU-bound map item."""
    digest = n.to_bytes(8, "little")
    for _ in range(1000):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()[:8]


def kernel_tiny(n: int) -> int:
    """Well under a microsecond: the case where the plan decides everything."""
    return (n * 2654435761) % 4294967296


# -- async: 10k tasks under a semaphore ------------------------------------------------------


async def raw_gather(tasks: int, permits: int) -> None:
    semaphore = asyncio.Semaphore(permits)

    async def one() -> None:
        async with semaphore:
            await asyncio.sleep(0)

    await asyncio.gather(*(one() for _ in range(tasks)))


class FoundryAsync:
    """Foundry's async unit, with the app's metrics on (read and checked at the end)."""

    def __init__(self, tasks: int, permits: int) -> None:
        from foundry import Foundry

        self.app = Foundry("bench-async")
        self.tasks = tasks

        @self.app.work(bound="io", concurrency=permits, est="1ms", model="async", name="tick")
        async def tick() -> None:
            await asyncio.sleep(0)

        self.tick = tick
        self.app.runner_for(tick.spec)

    async def run(self) -> None:
        await asyncio.gather(*(self.tick() for _ in range(self.tasks)))

    def completed(self) -> float:
        from foundry.observe import names

        return self.app.metrics.value(names.UNIT_COMPLETED, unit="tick", model="async")


def time_async(make: Callable[[], Awaitable[None]], watchdog: bool) -> Sample:
    """(wall seconds, CPU seconds of this process — every thread, the watchdog's included —,
    and the watchdog's own accounted cost: its thread's CPU plus its callbacks on the loop)."""

    async def timed() -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        await make()
        return time.perf_counter() - wall, time.process_time() - cpu

    async def main() -> tuple[float, float, float]:
        if not watchdog:
            return (*await timed(), 0.0)
        dog = Watchdog(registry=Registry(), threshold=0.1, log_reports=False)
        async with dog:
            wall, cpu = await timed()
        cost = dog.overhead()
        return wall, cpu, cost["thread_cpu"] + cost["loop_seconds"]

    return asyncio.run(main())


def time_on_thread(thread: LoopThread, make: Callable[[], Awaitable[None]], watchdog: bool) -> Sample:
    """The same on a Foundry loop thread (the managed loop's class: uvloop when installed),
    with the watchdog Foundry starts on it by default, or without (the opt-out)."""

    async def timed() -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        await make()
        return time.perf_counter() - wall, time.process_time() - cpu

    if not watchdog:
        return (*thread.run(timed()), 0.0)
    dog = Watchdog(thread.loop, registry=Registry(), name="foundry", threshold=0.1, log_reports=False)
    dog.start()
    try:
        wall, cpu = thread.run(timed())
    finally:
        dog.stop()
    cost = dog.overhead()
    return wall, cpu, cost["thread_cpu"] + cost["loop_seconds"]


def bench_async(tasks: int, rounds: int, reps: int) -> list[Row]:
    permits = 100
    foundry = FoundryAsync(tasks, permits)
    thread = LoopThread("bench-foundry-loop")  # no watchdog of its own: each timed run adds one or not

    async def raw() -> None:
        for _ in range(rounds):
            await raw_gather(tasks, permits)

    async def fnd() -> None:
        for _ in range(rounds):
            await foundry.run()

    raw_name, fnd_name = "raw asyncio.gather + Semaphore(100)", "foundry async unit (metrics on)"
    managed_name = "foundry async unit on a Foundry loop thread (uvloop, as the managed loop)"
    cases: dict[str, Callable[[], Awaitable[None]]] = {raw_name: raw, fnd_name: fnd, managed_name: fnd}
    timers: dict[str, Callable[[Callable[[], Awaitable[None]], bool], Sample]] = {
        raw_name: time_async,
        fnd_name: time_async,
        managed_name: lambda make, watch: time_on_thread(thread, make, watch),
    }
    samples: dict[tuple[str, bool], list[Sample]] = {(name, w): [] for name in cases for w in (False, True)}
    for name, make in cases.items():  # warm up: imports, the runner, the loop's first tasks
        timers[name](make, True)
    for rep in range(reps):  # interleaved, so drift in load hits every variant alike
        order = (False, True) if rep % 2 == 0 else (True, False)  # and on/off alternate who goes first
        for name, make in cases.items():
            for watch in order:
                samples[(name, watch)].append(timers[name](make, watch))
    thread.stop()
    runs = (reps * 2 + 1) * rounds * tasks * 2
    assert foundry.completed() == runs, f"metrics counted {foundry.completed()} of {runs} units"
    foundry.app.close()
    total = tasks * rounds
    case = f"async {tasks // 1000}k tasks ×{rounds}"

    def ratios(a: tuple[str, bool], b: tuple[str, bool], which: int) -> list[float]:
        """Per repetition, a's time ÷ b's: b's throughput relative to a's (pairs share the machine's mood)."""
        return [x[which] / y[which] for x, y in zip(samples[a], samples[b], strict=True)]

    def paired(a: tuple[str, bool], b: tuple[str, bool], which: int) -> float:
        """Median over repetitions of b's time ÷ a's."""
        return 1 / statistics.median(ratios(a, b, which))

    def spread(a: tuple[str, bool], b: tuple[str, bool], which: int) -> str:
        values = ratios(a, b, which)
        return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"

    rows: list[Row] = []
    for key, times in samples.items():
        name, watch = key
        wall = statistics.median(t[0] for t in times)
        ratio = (
            "1.00 (reference)"
            if key == (raw_name, False)
            else (f"wall {spread((raw_name, False), key, 0)}, cpu {spread((raw_name, False), key, 1)}")
        )
        variant = f"{name} + watchdog" if watch else name
        rows.append((case, variant, wall, f"{total / wall:,.0f}/s", ratio))
    for name in cases:
        wall = paired((name, False), (name, True), 0)
        cpu = paired((name, False), (name, True), 1)
        accounted = statistics.median(t[2] / t[1] for t in samples[(name, True)])
        rows.append(
            (
                "watchdog cost",
                name,
                -1.0,  # a ratio, not a time
                f"A/B wall {(wall - 1) * 100:+.1f}%, cpu {(cpu - 1) * 100:+.1f}%",
                f"accounted {accounted * 100:.2f}% of the run's CPU (≤ 3%)",
            )
        )
    return rows


# -- parallel map ------------------------------------------------------------------------


def kernel_1us(n: int) -> int:
    """About a microsecond of integer arithmetic (12 rounds of a multiplicative hash):
    the issue's "2M × ~1 µs items", where shipping per item costs about as much as the
    item but shipping per chunk of 10,000 is nothing."""
    x = n
    for _ in range(12):
        x = (x * 2654435761 + 1) & 0xFFFFFFFF
    return x


def chunk_of(fn: Callable[[int], Any], chunk: list[int]) -> list[Any]:
    """What joblib runs per task when the user chunks by hand (one task per chunk)."""
    return [fn(x) for x in chunk]


def paired(times: dict[str, list[float]], ours: str, other: str) -> str:
    """``other``'s time ÷ ours, round by round: the median and the range (≥ 1: ours is faster)."""
    ratios = [b / a for a, b in zip(times[ours], times[other], strict=True)]
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})"


def run_case(
    variants: dict[str, Callable[[], list[Any]]], check: Callable[[list[Any]], bool], reps: int
) -> dict[str, list[float]]:
    """Every variant once per round, the order reversed every other round (so drift in the
    machine's load and what one variant leaves in the caches hit them all alike)."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for rep in range(reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            started = time.perf_counter()
            out = variants[name]()
            times[name].append(time.perf_counter() - started)
            assert check(out), f"{name} returned wrong results"
    return times


PARALLEL_CASES = ("1 ms items", "~1 µs items", "tiny items")


NOT_AHEAD = "foundry parallel, no chunk handed ahead"


def bench_parallel(
    heavy_items: int,
    micro_items: int,
    tiny_items: int,
    reps: int,
    only: str | None = None,
    ahead_ab: bool = False,
) -> list[Row]:
    import joblib

    workers = 2
    chunk = 10_000
    rows: list[Row] = []
    executor = ParallelExecutor(workers=workers, name="bench")
    not_ahead = ParallelExecutor(workers=workers, name="bench-not-ahead", ahead=0)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers) as pool, joblib.parallel_config(backend="loky", n_jobs=workers):
        par = joblib.Parallel(n_jobs=workers)

        def joblib_chunks(fn: Callable[[int], Any], data: list[int]) -> list[Any]:
            parts = par(joblib.delayed(chunk_of)(fn, data[i : i + chunk]) for i in range(0, len(data), chunk))
            return [y for part in parts for y in part]

        cases: list[tuple[str, Callable[[int], Any], int, dict[str, Callable[[list[int]], list[Any]]]]] = [
            (
                "1 ms items",
                kernel_heavy,
                heavy_items,
                {
                    "multiprocessing.Pool.map": lambda data: pool.map(kernel_heavy, data),
                    "joblib (loky)": lambda data: par(joblib.delayed(kernel_heavy)(x) for x in data),
                },
            ),
            (
                "~1 µs items",
                kernel_1us,
                micro_items,
                {
                    f"multiprocessing.Pool.map(chunksize={chunk})": lambda data: pool.map(
                        kernel_1us, data, chunksize=chunk
                    ),
                    f"joblib (loky) over explicit {chunk}-item chunks": lambda data: joblib_chunks(
                        kernel_1us, data
                    ),
                },
            ),
            (
                "tiny items",
                kernel_tiny,
                tiny_items,
                {
                    "multiprocessing.Pool.map": lambda data: pool.map(kernel_tiny, data),
                    "joblib (loky)": lambda data: par(joblib.delayed(kernel_tiny)(x) for x in data),
                },
            ),
        ]
        for label, fn, n, peers in cases:
            if only is not None and label != only:
                continue

            def variants_for(
                data: list[int], fn: Callable[[int], Any] = fn, peers: Any = peers
            ) -> dict[str, Callable[[], list[Any]]]:
                variants: dict[str, Callable[[], list[Any]]] = {
                    "sequential loop": lambda: [fn(x) for x in data],
                    "foundry parallel": lambda: executor.map(fn, data, progress=False),
                }
                if ahead_ab:  # the same plan, each child sent its next chunk only once it answered
                    variants[NOT_AHEAD] = lambda: not_ahead.map(fn, data, progress=False)
                variants.update({name: functools.partial(peer, data) for name, peer in peers.items()})
                return variants

            warm = list(range(min(n, 4 * chunk)))  # start every pool's workers: the pools, not the data
            run_case(variants_for(warm), lambda out, expected=[fn(x) for x in warm]: out == expected, 1)
            data = list(range(n))
            expected = [fn(x) for x in data]
            times = run_case(variants_for(data), lambda out, expected=expected: out == expected, reps)
            plan = executor.last_plan
            case = f"parallel map, {n:,} × {label}"
            for name, samples in times.items():
                med = statistics.median(samples)
                ratio = (
                    paired(times, "foundry parallel", name)
                    if name != "foundry parallel"
                    else (plan.note if plan else "")
                )
                rows.append((case, name, med, f"{n / med:,.0f}/s", ratio))
            if ahead_ab:
                rows.append(
                    (
                        case,
                        "foundry: handing one chunk ahead ÷ not, round by round",
                        -1.0,
                        "",
                        paired(times, "foundry parallel", NOT_AHEAD),
                    )
                )
            best = [min(t) for t in zip(*(times[name] for name in peers), strict=True)]
            rows.append(
                (
                    case,
                    "foundry ÷ the best peer, round by round",
                    -1.0,
                    "",
                    paired({"f": times["foundry parallel"], "b": best}, "f", "b"),
                )
            )
    executor.close()
    not_ahead.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a few seconds: small sizes, few repetitions")
    parser.add_argument("--only", choices=("async", "parallel"), help="run one group of cases")
    parser.add_argument(
        "--async-reps", type=int, default=21, help="paired repetitions of the async case (default 21)"
    )
    parser.add_argument(
        "--rounds", type=int, default=7, help="paired rounds of each parallel case (default 7)"
    )
    parser.add_argument(
        "--case",
        choices=("1ms", "1us", "tiny"),
        help="run one parallel case: 1 ms items, ~1 µs items (issue 17's row) or tiny items",
    )
    parser.add_argument(
        "--ahead-ab",
        action="store_true",
        help="also run foundry without handing chunks ahead (the dispatch before issue 17's change), paired",
    )
    args = parser.parse_args()
    case = (
        None
        if args.case is None
        else dict(zip(("1ms", "1us", "tiny"), PARALLEL_CASES, strict=True))[args.case]
    )
    console = Console(width=180)
    async_rows: list[Row] = []
    parallel_rows: list[Row] = []
    if args.only != "parallel":
        async_rows = (
            bench_async(tasks=2000, rounds=1, reps=2)
            if args.quick
            else bench_async(tasks=10_000, rounds=1, reps=args.async_reps)
        )
    if args.only != "async":
        parallel_rows = (
            bench_parallel(
                heavy_items=200,
                micro_items=200_000,
                tiny_items=20_000,
                reps=2,
                only=case,
                ahead_ab=args.ahead_ab,
            )
            if args.quick
            else bench_parallel(
                heavy_items=2000,
                micro_items=2_000_000,
                tiny_items=400_000,
                reps=args.rounds,
                only=case,
                ahead_ab=args.ahead_ab,
            )
        )
    table = Table(title=f"in-process, part b — {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    for column in ("case", "variant", "seconds (median)", "throughput", "ratio"):
        table.add_column(column)
    for case, variant, seconds, throughput, ratio in [*async_rows, *parallel_rows]:
        table.add_row(case, variant, f"{seconds:.4f}" if seconds >= 0 else "-", throughput, ratio)
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
