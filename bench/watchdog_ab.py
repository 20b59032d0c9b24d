"""The loop watchdog's cost, this tree's against an earlier commit's, in one process.

    python bench/watchdog_ab.py                 # against main
    python bench/watchdog_ab.py --base 5c950e5  # against a commit
    python bench/watchdog_ab.py --quick

Runs ``bench/inprocess_b.py``'s async case (10,000 coroutines × 5 rounds under 100
permits; raw ``asyncio.gather`` + ``Semaphore``, and a Foundry ``async`` unit with metrics
on) three ways in this one process — no watchdog, the base commit's
``foundry.observe.watchdog`` (loaded from ``git show``), and this tree's — in rotating
order each repetition, so the machine's drift lands on every variant alike. Two
process-wide runs minutes apart on a shared machine differ more than the watchdog
costs; variants paired within a repetition do not.

Figures per variant: the median over repetitions of its CPU time ÷ the no-watchdog run
next to it (the A/B), and of the cost the watchdog accounts for itself — its (watching)
thread's CPU plus its callbacks' time on the loop — as a share of the run's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from foundry.observe import watchdog as current  # noqa: E402
from foundry.observe.metrics import Registry  # noqa: E402

ROOT = Path(_HERE).parent


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def base_watchdog(commit: str, into: Path) -> ModuleType:
    """The base commit's watchdog module (it imports the rest of Foundry from this tree)."""
    source = subprocess.run(
        ["git", "show", f"{commit}:src/foundry/observe/watchdog.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = into / "foundry_watchdog_base.py"
    path.write_text(source)
    return _load("foundry_watchdog_base", path)


Sample = tuple[float, float, float]  # wall s, CPU s, the watchdog's accounted CPU s


def timed(make: Callable[[], Awaitable[None]], module: ModuleType | None) -> Sample:
    async def main() -> Sample:
        dog: Any = None
        if module is not None:
            dog = module.Watchdog(registry=Registry(), threshold=0.1, log_reports=False).start()
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            await make()
        finally:
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if dog is not None:
                dog.stop()
        if dog is None:
            return wall, cpu, 0.0
        cost = dog.overhead()
        return wall, cpu, cost["thread_cpu"] + cost["loop_seconds"]

    return asyncio.run(main())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", default="main", help="the commit to compare with (main)")
    parser.add_argument("--quick", action="store_true", help="a few seconds: small sizes, few repetitions")
    args = parser.parse_args()
    tasks, rounds, reps = (2000, 1, 3) if args.quick else (10_000, 5, 15)
    part_b = _load("bench_inprocess_b", ROOT / "bench" / "inprocess_b.py")
    with tempfile.TemporaryDirectory() as tmp:
        base = base_watchdog(args.base, Path(tmp))
        foundry = part_b.FoundryAsync(tasks, 100)

        async def raw() -> None:
            for _ in range(rounds):
                await part_b.raw_gather(tasks, 100)

        async def unit() -> None:
            for _ in range(rounds):
                await foundry.run()

        workloads = {"raw asyncio.gather + Semaphore(100)": raw, "foundry async unit (metrics on)": unit}
        variants: dict[str, ModuleType | None] = {
            "no watchdog": None,
            f"watchdog at {args.base}": base,
            "watchdog, this tree": current,
        }
        samples: dict[tuple[str, str], list[Sample]] = {(w, v): [] for w in workloads for v in variants}
        for make in workloads.values():  # warm up
            for module in variants.values():
                timed(make, module)
        names = list(variants)
        for rep in range(reps):
            order = names[rep % 3 :] + names[: rep % 3]  # rotate who goes first
            for workload, make in workloads.items():
                for variant in order:
                    samples[(workload, variant)].append(timed(make, variants[variant]))
        foundry.app.close()
    table = Table(
        title=f"watchdog cost, {args.base} vs this tree — {os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.2f}, {reps} repetitions of {tasks:,} tasks × {rounds}"
    )
    for column in ("workload", "variant", "wall s (median)", "CPU vs no watchdog", "accounted share of CPU"):
        table.add_column(column)
    for workload in workloads:
        off = samples[(workload, "no watchdog")]
        for variant in variants:
            runs = samples[(workload, variant)]
            wall = statistics.median(s[0] for s in runs)
            if variants[variant] is None:
                table.add_row(workload, variant, f"{wall:.3f}", "1 (reference)", "-")
                continue
            ratios = [s[1] / o[1] for s, o in zip(runs, off, strict=True)]
            shares = [s[2] / s[1] for s in runs]
            table.add_row(
                workload,
                variant,
                f"{wall:.3f}",
                f"{(statistics.median(ratios) - 1) * 100:+.1f}% ({(min(ratios) - 1) * 100:+.0f}…"
                f"{(max(ratios) - 1) * 100:+.0f}%)",
                f"{statistics.median(shares) * 100:.2f}% ({min(shares) * 100:.2f}–{max(shares) * 100:.2f}%)",
            )
    Console(width=200).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
