"""The queue worker's own Python CPU per job, with a backend that costs nothing.

    python bench/worker_cost.py                                   # this tree
    python bench/worker_cost.py --before /work/main/src --after src
    python bench/worker_cost.py --quick                           # a few seconds

Every durable engine (SQLite, Redis, PostgreSQL, RabbitMQ) runs its jobs through the same
worker path (``foundry.deliver.worker``: a runner takes a job, decodes its arguments,
calls the unit, encodes the result, queues the completion; the ack thread counts it). On a
small machine the engines' throughput follows total CPU per job, so this measures that
path alone: a fake backend hands out pre-built ``Claimed`` no-op jobs and accepts every
completion at no cost. Two modes:

* ``one thread``: ``Worker.start_job`` called in a loop on one thread, completions
  acknowledged inline (no claimer, no runner threads, no hand-offs);
* ``8 runners``: a real ``Worker(concurrency=8).run()`` in burst mode over the jobs
  (claimer, eight runners, the ack thread, heartbeat and cancel watcher all running).

Each (tree, mode) runs in its own subprocess with that tree's ``src`` first on the path.
With ``--before`` and ``--after`` the rounds are paired and alternate their order, and the
figure is the median of the per-round after/before CPU ratios, with their range: a shared
machine drifts more between two runs minutes apart than within one round.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]  # bench/*.py shadow nothing
MODES = ("one thread", "8 runners")


def _child(mode: str, n: int) -> dict[str, Any]:
    """Run ``n`` no-op jobs in this process (the tree on sys.path) and measure them."""
    import threading

    from foundry import Foundry
    from foundry.backends.queue.base import Claimed, QueueStats
    from foundry.deliver.worker import Worker, _Job

    home = tempfile.mkdtemp(prefix="worker-cost-")
    atexit.register(shutil.rmtree, home, True)  # the child's store (never written: the backend is fake)
    url = f"sqlite:///{home}/fake.db"
    app = Foundry("worker-cost", queue=url, home=home)
    ran = [0]

    @app.work(durable=True, queue="fq")
    def noop(submitted: float) -> None:
        ran[0] += 1

    payload = json.dumps({"args": [time.time()], "kwargs": {}}).encode()

    def claimed(count: int) -> list[Claimed]:
        now = time.time()
        return [
            Claimed(f"id{i}", "fq", "noop", payload, "json", "tok", 1e12, 1, 0, 0, 5, None, now)
            for i in range(count)
        ]

    jobs: list[Claimed] = []
    lock = threading.Lock()

    class Fake:
        """A queue backend that costs nothing: claims pop pre-built jobs, writes succeed."""

        def __init__(self) -> None:
            self.url = url

        def claim(
            self, queue: str, worker: str, *, lease: float, limit: int, timeout: float
        ) -> list[Claimed]:
            with lock:
                got = jobs[-limit:] if limit < len(jobs) else jobs[:]
                del jobs[len(jobs) - len(got) :]
            if not got:
                time.sleep(0.001)
            return got

        def complete_many(self, items: list[Any]) -> list[bool]:
            return [True] * len(items)

        def complete(self, *args: Any) -> bool:
            return True

        def stats(self, queue: str) -> QueueStats:
            return QueueStats(len(jobs), 0, 0, 0, 0.0)

        def heartbeat(self, *args: Any, **kwargs: Any) -> bool:
            return True

        def cancel_requests(self, ids: list[str], *, timeout: float) -> list[str]:
            time.sleep(min(timeout, 0.5))
            return []

        def release(self, *args: Any) -> bool:
            return True

        def purge(self) -> int:
            return 0

    def one_thread(batch: list[Claimed]) -> float:
        w = Worker(app, burst=True, concurrency=8)
        w.backend = Fake()  # type: ignore[assignment]
        loop = w.loops[0]
        loop.prefetch = 10**9  # completions wait for the inline acknowledgement below
        c0 = time.process_time()
        for c in batch:
            job = _Job(c, loop)
            loop.held[c.id] = job
            w.start_job(job)
            loop.done(job)
            if len(loop.acks) > 255:
                acks, loop.acks = loop.acks, []
                for j, _, model in acks:
                    w.acked(j, model, True)
        cpu = time.process_time() - c0
        for j, _, model in loop.acks:
            w.acked(j, model, True)
        loop.acks = []
        return cpu

    if mode == "one thread":
        one_thread(claimed(max(500, n // 10)))  # warm: first-job lookups, caches
        ran[0] = 0
        cpu = one_thread(claimed(n))
    else:
        jobs.extend(claimed(n))
        w = Worker(app, burst=True, concurrency=8)
        w.backend = Fake()  # type: ignore[assignment]
        c0 = time.process_time()
        w.run()
        cpu = time.process_time() - c0
    if ran[0] != n:
        raise SystemExit(f"{mode}: {ran[0]} of {n} jobs ran")
    return {"mode": mode, "jobs": n, "cpu_us": 1e6 * cpu / n}


def _measure(src: str, mode: str, n: int) -> float:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src)}
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(n)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"{src} ({mode}) failed:\n{out.stderr[-3000:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["cpu_us"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", help="a tree's src directory (e.g. /work/main/src)")
    parser.add_argument("--after", help="a tree's src directory (default: this tree's src)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=50_000, help="jobs per run")
    parser.add_argument("--quick", action="store_true", help="a few seconds: 2 rounds of 3,000 jobs")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child[0], int(args.child[1]))))
        return
    rounds, n = (2, 3_000) if args.quick else (args.rounds, args.jobs)
    after = args.after or str(ROOT / "src")
    trees = {"after": after} if args.before is None else {"before": args.before, "after": after}
    runs: list[dict[str, Any]] = []
    for r in range(rounds):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        one: dict[str, Any] = {"round": r + 1, "order": order}
        for mode in MODES:
            one[mode] = {name: _measure(trees[name], mode, n) for name in order}
        runs.append(one)
        if not args.json:
            shown = "  ".join(
                f"{mode}: " + ", ".join(f"{name} {one[mode][name]:.1f}" for name in order) for mode in MODES
            )
            print(f"round {r + 1}: {shown} (µs CPU per job)", flush=True)
    summary: dict[str, Any] = {}
    for mode in MODES:
        figures: dict[str, Any] = {name: statistics.median(run[mode][name] for run in runs) for name in trees}
        if "before" in trees:
            ratios = [run[mode]["after"] / run[mode]["before"] for run in runs]
            figures["ratio"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
        summary[mode] = figures
    load_avg = os.getloadavg()
    report: dict[str, Any] = {
        "jobs": n,
        "rounds": runs,
        "summary": summary,
        "trees": trees,
        "load": load_avg,
        "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if args.json:
        print(json.dumps(report))
        return
    load = ", ".join(f"{x:.2f}" for x in load_avg)
    print(f"\n{n} no-op jobs per run, {rounds} rounds, {report['at']}, load {load}")
    for mode, figures in summary.items():
        line = "  ".join(f"{name} {figures[name]:.1f} µs" for name in trees)
        if "ratio" in figures:
            ratio = figures["ratio"]
            line += f"  after/before {ratio['median']:.2f}× ({ratio['min']:.2f}–{ratio['max']:.2f})"
        print(f"  {mode:>10}: {line}  (median CPU per job)")


if __name__ == "__main__":
    main()
