"""In-process benchmarks, part a: sequential vs a plain call, bounded_pool vs
``ThreadPoolExecutor``, processes vs ``ProcessPoolExecutor`` and loky.

    python bench/inprocess.py            # full run (a minute or two on 2 cores)
    python bench/inprocess.py --quick    # a few seconds (the test suite's smoke run)
    python bench/inprocess.py --only pools

Every case runs its variants in this one process, interleaved repetition by repetition
(so drift in the machine's load hits all of them alike), and reports the median. Foundry
runs with its metrics on (every unit's counters, histogram and gauges are live and are
read once at the end of each run, to prove they are right). Ratios: ``overhead`` is
Foundry's time ÷ the plain call's (≤ 1.05 is the target); ``vs peer`` is Foundry's
throughput ÷ the peer's (≥ 0.9 is the target).

Cases are functions in :data:`CASES` (name, function(quick) -> rows); ``bench/inprocess_b.py``
keeps part b's cases (async, parallel, the watchdog) in a list of its own.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

Row = tuple[str, str, float, str, str]  # case, variant, seconds, throughput, ratio


# -- workloads (importable by child processes as __mp_main__.<name>) ----------------------


def ten_us(n: int) -> int:
    """About 10 µs of pure Python (calibrated below)."""
    total = n
    for i in range(_LOOPS):
        total += i
    return total


def tiny(n: int) -> int:
    return n + 1


_LOOPS = 160


def _calibrate() -> None:
    """Size ``ten_us`` to 10 µs on this machine (best of many short runs: load only adds)."""
    global _LOOPS
    for _ in range(3):
        best = float("inf")
        for _ in range(20):
            started = time.perf_counter()
            for i in range(200):
                ten_us(i)
            best = min(best, (time.perf_counter() - started) / 200)
        _LOOPS = max(10, int(_LOOPS * 10e-6 / best))


# -- sequential vs a plain call -------------------------------------------------------------------


def bench_sequential(quick: bool) -> list[Row]:
    """Two functions — an empty one (the call path's own cost) and ~10 µs of Python (what
    that cost is worth on real work) — each called as a plain function, through a
    do-nothing ``functools.wraps`` decorator (the floor of any wrapper) and as a
    sequential unit with its metrics on. Rounds alternate the variants' order; per round,
    the unit's extra nanoseconds per call and its throughput ÷ the plain call's are
    taken against the plain run of that same round, and the table shows their median
    and range."""
    from foundry import Foundry
    from foundry.observe import names

    _calibrate()
    app = Foundry("bench-seq")
    rows: list[Row] = []
    # many short rounds: this machine's speed drifts by tens of percent within a second,
    # and a round is only compared with the rounds right next to it
    for fn, calls, rounds in ((tiny, 40_000, 5 if quick else 101), (ten_us, 500, 5 if quick else 801)):
        unit = app.work(model="sequential", name=fn.__name__)(fn)

        def loop(call: Callable[[int], int], calls: int = calls) -> Callable[[], float]:
            def run() -> float:
                started = time.perf_counter()
                for i in range(calls):
                    call(i)
                return time.perf_counter() - started

            return run

        variants = {
            "plain call": loop(fn),
            "a functools.wraps decorator": loop(_decorated(fn)),
            "foundry sequential unit (metrics on)": loop(unit),
        }
        samples = _alternate(variants, rounds)
        completed = app.metrics.value(names.UNIT_COMPLETED, unit=fn.__name__)
        assert completed == calls * (rounds + 1), completed  # the metrics counted every call
        plain = samples["plain call"]
        per_call = statistics.median(plain) / calls
        for name, times in samples.items():
            extra = sorted((t - p) / calls * 1e9 for t, p in zip(times, plain, strict=True))
            ratio = sorted(p / t for t, p in zip(times, plain, strict=True))
            goal = ""
            if name.startswith("foundry"):
                goal = " (goal ≤ +100 ns)" if fn is tiny else " (goal ≥ 0.97×)"
            rows.append(
                (
                    f"sequential, {calls:,} calls × {rounds} rounds of a {per_call * 1e9:,.0f} ns function",
                    name,
                    sum(times),
                    f"{statistics.median(extra):+,.0f} ns/call ({extra[0]:+,.0f} to {extra[-1]:+,.0f})",
                    f"{statistics.median(ratio):.3f}× ({ratio[0]:.3f}–{ratio[-1]:.3f}){goal}",
                )
            )
    app.close()
    return rows


def _decorated(fn: Callable[[int], int]) -> Callable[[int], int]:
    @functools.wraps(fn)
    def wrapper(n: int) -> int:
        return fn(n)

    return wrapper


def _alternate(variants: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """One warm-up run each, then ``rounds`` rounds of every variant, forward in even
    rounds and backward in odd ones (a drift in the machine's speed falls on both sides)."""
    for run in variants.values():
        run()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_ in range(rounds):
        for name in names if round_ % 2 == 0 else reversed(names):
            samples[name].append(variants[name]())
    return samples


# -- bounded_pool vs ThreadPoolExecutor ----------------------------------------------------------


def _drive(submit: Callable[[int], Any], tasks: int) -> float:
    """Submit ``tasks`` tiny tasks, then wait for every result (futures and handles alike)."""
    started = time.perf_counter()
    handles = [submit(i) for i in range(tasks)]
    for handle in handles:
        handle.result()
    return time.perf_counter() - started


def _interleave(variants: dict[str, Callable[[], float]], reps: int) -> dict[str, list[float]]:
    """One warm-up run each, then ``reps`` rounds of every variant in turn."""
    for run in variants.values():
        run()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(reps):
        for name, run in variants.items():
            samples[name].append(run())
    return samples


def bench_pools(quick: bool) -> list[Row]:
    import concurrent.futures as cf

    from foundry import Foundry
    from foundry.observe import names

    tasks = 2_000 if quick else 50_000
    reps = 2 if quick else 9
    workers = 4
    app = Foundry("bench-pools")
    unbounded = app.work(model="bounded_pool", workers=workers, max_pending=tasks, name="tiny_wide")(tiny)
    bounded = app.work(model="bounded_pool", workers=workers, name="tiny_bounded")(tiny)  # 4 × workers
    executor = cf.ThreadPoolExecutor(max_workers=workers)
    samples = _interleave(
        {
            "ThreadPoolExecutor (unbounded queue)": lambda: _drive(lambda i: executor.submit(tiny, i), tasks),
            "foundry bounded_pool, max_pending=tasks": lambda: _drive(unbounded.submit, tasks),
            "foundry bounded_pool, default intake (16: the producer blocks)": lambda: _drive(
                bounded.submit, tasks
            ),
        },
        reps,
    )
    done = app.metrics.value(names.UNIT_COMPLETED, unit="tiny_wide")
    assert done == tasks * (reps + 1), done
    executor.shutdown()
    app.close()
    return _throughput_rows(f"threads, {tasks:,} tiny tasks, {workers} workers", samples, tasks)


# -- processes vs ProcessPoolExecutor and loky --------------------------------------------------


def bench_processes(quick: bool) -> list[Row]:
    import concurrent.futures as cf
    import multiprocessing

    from loky import get_reusable_executor

    from foundry import Foundry
    from foundry.observe import names

    tasks = 1_000 if quick else 20_000
    reps = 1 if quick else 7
    workers = 2
    app = Foundry("bench-procs")
    unit = app.work(model="processes", workers=workers, max_pending=tasks, name="tiny_procs")(tiny)
    ppe = cf.ProcessPoolExecutor(max_workers=workers)  # the default start method (fork on Linux)
    ppe_fs = cf.ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("forkserver"))
    loky = get_reusable_executor(max_workers=workers)
    samples = _interleave(
        {
            "ProcessPoolExecutor (fork)": lambda: _drive(lambda i: ppe.submit(tiny, i), tasks),
            "ProcessPoolExecutor (forkserver)": lambda: _drive(lambda i: ppe_fs.submit(tiny, i), tasks),
            "loky": lambda: _drive(lambda i: loky.submit(tiny, i), tasks),
            "foundry processes (forkserver)": lambda: _drive(unit.submit, tasks),
        },
        reps,
    )
    done = app.metrics.value(names.UNIT_COMPLETED, unit="tiny_procs")
    assert done == tasks * (reps + 1), done
    ppe.shutdown()
    ppe_fs.shutdown()
    loky.shutdown()
    app.close()
    return _throughput_rows(f"processes, {tasks:,} tiny tasks, {workers} workers", samples, tasks)


def _throughput_rows(case: str, samples: dict[str, list[float]], tasks: int) -> list[Row]:
    meds = {name: statistics.median(times) for name, times in samples.items()}
    peers = {n: m for n, m in meds.items() if not n.startswith("foundry")}
    rows: list[Row] = []
    for name, med in meds.items():
        if name.startswith("foundry"):
            ratio = ", ".join(f"{peer / med:.2f}× {n.split(' (')[0]}" for n, peer in peers.items())
        else:
            ratio = ""
        rows.append((case, name, med, f"{tasks / med:,.0f}/s", ratio))
    return rows


CASES: list[tuple[str, Callable[[bool], list[Row]]]] = [
    ("sequential", bench_sequential),
    ("pools", bench_pools),
    ("processes", bench_processes),
]


def _not_from_bench_dir() -> None:
    """Keep bench/ off sys.path: no script here may shadow a library module."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]


def main() -> int:
    _not_from_bench_dir()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a few seconds: small sizes, few repetitions")
    parser.add_argument("--only", choices=[name for name, _ in CASES], help="run one group of cases")
    args = parser.parse_args()
    rows: list[Row] = []
    for name, case in CASES:
        if args.only in (None, name):
            rows.extend(case(args.quick))
    console = Console(width=160)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    python = sys.version.split()[0]
    table = Table(title=f"in-process, part a — {os.cpu_count()} cores, load average {load}, Python {python}")
    for column in ("case", "variant", "seconds (median)", "throughput", "ratio"):
        table.add_column(column)
    for case_name, variant, seconds, throughput, ratio in rows:
        table.add_row(case_name, variant, f"{seconds:.4f}", throughput, ratio)
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
