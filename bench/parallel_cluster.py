"""``parallel`` on a cluster vs the cluster's own plain API, over the same chunks.

    python bench/parallel_cluster.py                   # 5 paired rounds on Dask and Ray
    python bench/parallel_cluster.py --engines dask    # one engine
    python bench/parallel_cluster.py --quick --json    # a few seconds, machine-readable
    python bench/parallel_cluster.py --dask tcp://…:8786 --ray ray://…:10001  # your clusters

Without addresses it starts a Dask ``LocalCluster`` (2 worker processes, 1 thread each)
and a private local Ray instance (2 CPUs) and shuts them down at the end.

Each round maps the same CPU-bound function over the same items twice, in alternating
order: once with Foundry (``ParallelExecutor(cluster=…).map``, the planner's chunks, at
most two chunks per worker in flight, results merged in order) and once with the plain
tool over *the same chunks* (Dask: ``client.map`` of a list-comprehension over each chunk,
then ``client.gather``; Ray: one ``ray.remote`` task per chunk, then ``ray.get``). The
ratio is the plain run's wall time ÷ Foundry's (Foundry's throughput as a share of the
plain tool's; goal ≥ 0.9 on Dask); the median of the per-round ratios is reported with
its range.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

# Keep bench/ off sys.path: no script here may shadow a library module (bench/ holds no
# dask.py or ray.py, but foundry's engines are named so).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

from foundry.execute.parallel import ParallelExecutor  # noqa: E402

ITEMS = 20_000
QUICK_ITEMS = 2_000


def work(n: int) -> int:
    """~0.2 ms of pure-Python CPU work, varying a little by item."""
    total = 0
    for i in range(1500 + (n % 5) * 100):
        total += (i * n) % 7
    return total


def run_list(chunk: list[int]) -> list[int]:
    return [work(n) for n in chunk]


# -- the clusters ---------------------------------------------------------------------


@contextmanager
def dask_cluster(address: str | None) -> Iterator[str]:
    if address:
        yield address
        return
    import logging

    from distributed import LocalCluster

    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address="127.0.0.1:0",
        silence_logs=logging.ERROR,
    ) as cluster:
        yield str(cluster.scheduler_address)


@contextmanager
def ray_cluster(address: str | None) -> Iterator[str]:
    from foundry.backends.cluster import open_cluster

    url = address or "ray://local?num_cpus=2"
    holder = open_cluster(url)  # the one Ray connection of this process, shared
    try:
        yield url
    finally:
        holder.close()


# -- one side of a round ----------------------------------------------------------------


def _chunks(items: list[int], size: int) -> list[list[int]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def plain_dask(client: Any) -> Callable[[list[list[int]]], list[int]]:
    def run(chunks: list[list[int]]) -> list[int]:
        futures = client.map(run_list, chunks, pure=False)
        out: list[int] = []
        for part in client.gather(futures):
            out.extend(part)
        return out

    return run


def plain_ray() -> Callable[[list[list[int]]], list[int]]:
    import ray

    remote = ray.remote(num_cpus=1)(run_list)

    def run(chunks: list[list[int]]) -> list[int]:
        out: list[int] = []
        for part in ray.get([remote.remote(c) for c in chunks]):
            out.extend(part)
        return out

    return run


def measure(engines: dict[str, str], items: int, rounds: int) -> dict[str, Any]:
    """Paired rounds per engine; returns {engine: {rounds: [...], median, low, high, plan}}."""
    data = list(range(items))
    expected = [work(n) for n in data[:50]]
    report: dict[str, Any] = {"items": items, "rounds": rounds, "engines": {}}
    for engine, url in engines.items():
        executor = ParallelExecutor(workers=None, name=f"bench-{engine}", cluster=url)
        with ExitStack() as stack:
            if engine == "dask":
                from distributed import Client

                client = stack.enter_context(Client(url, set_as_default=False))
                plain = plain_dask(client)
            else:
                plain = plain_ray()
            stack.callback(executor.close)
            # Warm both sides up (imports on the workers, Ray's worker processes), and learn
            # the plan: the plain side uses the very same chunks.
            assert executor.map(work, data)[:50] == expected
            plan = executor.last_plan
            assert plan is not None
            assert plan.mode == "processes", plan
            assert plain(_chunks(data, plan.chunksize))[:50] == expected
            rows = []
            for number in range(rounds):
                sides = ["foundry", "plain"] if number % 2 == 0 else ["plain", "foundry"]
                took: dict[str, float] = {}
                for side in sides:
                    began = time.perf_counter()
                    if side == "foundry":
                        out = executor.map(work, data, est=plan.est, chunksize=plan.chunksize)
                    else:
                        out = plain(_chunks(data, plan.chunksize))
                    took[side] = time.perf_counter() - began
                    assert len(out) == items
                rows.append(
                    {
                        "foundry_s": took["foundry"],
                        "plain_s": took["plain"],
                        "ratio": took["plain"] / took["foundry"],
                        "first": sides[0],
                    }
                )
            ratios = [r["ratio"] for r in rows]
            report["engines"][engine] = {
                "url": url,
                "chunksize": plan.chunksize,
                "chunks": len(_chunks(data, plan.chunksize)),
                "workers": plan.workers,
                "rounds": rows,
                "median": statistics.median(ratios),
                "low": min(ratios),
                "high": max(ratios),
                "foundry_items_per_s": items / statistics.median(r["foundry_s"] for r in rows),
                "plain_items_per_s": items / statistics.median(r["plain_s"] for r in rows),
            }
    return report


def _print(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"parallel on a cluster: {report['items']} items, {report['rounds']} paired rounds")
    for column in ("engine", "chunks × size", "Foundry items/s", "plain items/s", "ratio (median)", "range"):
        table.add_column(column, justify="right" if column != "engine" else "left")
    for engine, row in report["engines"].items():
        plain = "client.map" if engine == "dask" else "ray.remote"
        table.add_row(
            f"{engine} vs {plain}",
            f"{row['chunks']} × {row['chunksize']}",
            f"{row['foundry_items_per_s']:,.0f}",
            f"{row['plain_items_per_s']:,.0f}",
            f"{row['median']:.2f}×",
            f"{row['low']:.2f}–{row['high']:.2f}×",
        )
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--engines", default="dask,ray", help="comma-separated: dask, ray")
    parser.add_argument("--dask", help="an existing scheduler (tcp://HOST:8786); default: a LocalCluster")
    parser.add_argument("--ray", help="an existing Ray cluster (ray://HEAD:10001); default: ray://local")
    parser.add_argument("--items", type=int)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--quick", action="store_true", help="a few seconds: few items, one round")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    items = args.items or (QUICK_ITEMS if args.quick else ITEMS)
    rounds = args.rounds or (1 if args.quick else 5)
    wanted = [e.strip() for e in args.engines.split(",") if e.strip()]
    with ExitStack() as stack:
        engines: dict[str, str] = {}
        if "dask" in wanted:
            engines["dask"] = stack.enter_context(dask_cluster(args.dask))
        if "ray" in wanted:
            engines["ray"] = stack.enter_context(ray_cluster(args.ray))
        report = measure(engines, items, rounds)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
