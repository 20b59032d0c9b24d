"""The embedded SQLite queue with 1, 2, 4 worker processes on one machine.

    python bench/sqlite_scaling.py                    # 10,000 jobs, 1/2/4 workers, 3 rounds
    python bench/sqlite_scaling.py --quick            # seconds: 500 jobs, 1 round (the smoke run)
    python bench/sqlite_scaling.py --workers 1 4 --rounds 5 --n 5000
    python bench/sqlite_scaling.py --before /work/main/src   # and the tree before a change, same run

Each measurement is one child process that starts ``--workers`` ``foundry worker
qbench_tasks:app -c 8`` processes on one fresh ``sqlite:///`` file (the task of
``bench/queues.py``) and submits from one thread:

* **throughput** — ``--n`` no-op jobs (10,000) one ``submit`` at a time, as fast as the
  thread goes; the clock runs from the first submit until the last completion record is
  written. Each ``submit`` is timed too: the *submitter's* p50/p99 while the workers
  drain the queue beside it.
* **latency** — ``--m`` jobs (500) at a fixed ``--rate`` (500/s, well below capacity),
  on a schedule (a late submit does not push the next one back); submit→start p50/p99
  (the task notes when it started) and the submitter's per-submit p50/p99 again.

The plain tool beside it — what a user would otherwise write — is a loop of single-row
write transactions (``BEGIN IMMEDIATE``, ``UPDATE``, ``COMMIT``) on a WAL file with
``synchronous=NORMAL``, run by the same numbers of processes at once: SQLite's own
single-writer ceiling in commits/s on this machine (``--ceiling-s`` seconds each).

**Rounds.** The worker counts run in ``--rounds`` rounds (3), forward in odd rounds and
backward in even ones; the ratios are *paired*: within a round, the rate with N workers
over the rate with one. The table shows per count the median of each figure and the
median (range) of the paired ratios. With ``--before SRC`` every round also measures
each count with that source tree (``PYTHONPATH``), the two trees alternating too, and
the table adds the paired ratio of this tree's rate over that tree's.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sqlite3  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(HERE))
from queues import PEERS, Run, _proc_cpu, _tree, drained  # noqa: E402

SYSTEM = "foundry-sqlite"


class Fleet(Run):
    """``bench/queues.py``'s run of the embedded queue, with several worker processes."""

    def __init__(self, workers: int, tmp: Path) -> None:
        super().__init__(SYSTEM, tmp, "")
        self.count = workers
        self.fleet: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        for i in range(self.count):
            log = open(self.tmp / f"worker{i}.log", "wb")  # noqa: SIM115 - lives as long as the worker
            self.fleet.append(
                subprocess.Popen(
                    self.worker_command(),
                    env=self.env,
                    cwd=PEERS,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                )
            )
            log.close()
        self.worker = self.fleet[0]  # Run.wait_lines notices a worker that exited

    def cpu(self) -> tuple[float, float]:
        """CPU seconds so far: (this process, the worker processes' trees)."""
        t = os.times()
        return t.user + t.system, sum(_proc_cpu(p) for w in self.fleet for p in _tree(w.pid))

    def stop(self) -> None:
        for proc in self.fleet:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.fleet:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def child(workers: int, n: int, m: int, rate: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sqscale-") as d:
        run = Fleet(workers, Path(d))
        run.start()
        try:
            import qbench_tasks as tasks  # type: ignore[import-not-found]

            submit = tasks.app.units["noop"].submit
            try:
                for _ in range(workers):  # warm-up: every worker is up and has claimed once
                    submit(time.time())
                run.wait_lines(workers, 120, "warm-up")
                time.sleep(0.3)
                base = run.lines()
                burst: list[float] = []
                cpu0 = run.cpu()
                t0 = time.time()
                for _ in range(n):
                    a = time.perf_counter()
                    submit(time.time())
                    burst.append(time.perf_counter() - a)
                submitted = time.time() - t0
                run.wait_lines(base + n, max(120.0, n / 20), "throughput")
                end = max(max(e for _, e in run.read(base, n)), drained(run))
                elapsed = end - t0
                cpu = [b - a for a, b in zip(cpu0, run.cpu(), strict=True)]
                time.sleep(0.3)
                base = run.lines()
                steady: list[float] = []
                start = time.perf_counter()
                for i in range(m):
                    left = start + i / rate - time.perf_counter()
                    if left > 0:
                        time.sleep(left)
                    a = time.perf_counter()
                    submit(time.time())
                    steady.append(time.perf_counter() - a)
                run.wait_lines(base + m, 120, "latency")
                lats = [lat for lat, _ in run.read(base, m)]
            finally:
                tasks.app.close()
        finally:
            run.stop()
    return {
        "workers": workers,
        "rate": n / elapsed,
        "submit_rate": n / submitted,
        "burst_p50": pct(burst, 0.5) * 1e3,
        "burst_p99": pct(burst, 0.99) * 1e3,
        "steady_p50": pct(steady, 0.5) * 1e3,
        "steady_p99": pct(steady, 0.99) * 1e3,
        "p50": pct(lats, 0.5) * 1e3,
        "p99": pct(lats, 0.99) * 1e3,
        "cpu_submitter": cpu[0] / n * 1e6,
        "cpu_workers": cpu[1] / n * 1e6,
    }


# -- the plain tool: one-row write transactions from N processes ------------------------------


def _committer(path: str, seconds: float, out: Any) -> None:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)
    conn.execute("PRAGMA synchronous=NORMAL")
    done, stop = 0, time.monotonic() + seconds
    while time.monotonic() < stop:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE c SET n = n + 1 WHERE id = ?", (done % 64,))
        conn.execute("COMMIT")
        done += 1
    out.put(done)
    conn.close()


def ceiling(processes: int, seconds: float) -> float:
    """Commits/s of ``processes`` plain loops of one-row write transactions on one WAL file."""
    with tempfile.TemporaryDirectory(prefix="sqceil-") as d:
        path = os.path.join(d, "c.db")
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE c (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
        conn.executemany("INSERT INTO c VALUES (?, 0)", [(i,) for i in range(64)])
        conn.close()
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        procs = [ctx.Process(target=_committer, args=(path, seconds, out)) for _ in range(processes)]
        for p in procs:
            p.start()
        total = sum(int(out.get(timeout=seconds + 60)) for _ in procs)
        for p in procs:
            p.join()
        return total / seconds


# -- the parent ----------------------------------------------------------------------------------


def measure(workers: int, args: argparse.Namespace, src: str | None = None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", str(workers), "--n", str(args.n), "--m", str(args.m)]
    cmd += ["--rate", str(args.rate)]
    env = {**os.environ, "PYTHONPATH": src} if src else None
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False, env=env)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"workers": workers, "error": " | ".join(tail)[-300:]}
    got: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if src is None:
        got["ceiling"] = ceiling(workers, args.ceiling_s)
    return got


def ratio(values: list[float]) -> str:
    med = statistics.median(values)
    return f"{med:.2f}×" if len(values) == 1 else f"{med:.2f}× ({min(values):.2f}–{max(values):.2f})"


def table(
    rounds: list[dict[int, dict[str, Any]]], before: list[dict[int, dict[str, Any]]], args: argparse.Namespace
) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(
        title=f"{args.n:,} no-op jobs, one submitter; latency: {args.m} jobs at {args.rate:g}/s; "
        f"median of {len(rounds)} round(s), ratios paired per round vs 1 worker (range)"
    )
    cols = (
        "tree",
        "workers",
        "jobs/s",
        "vs 1 worker",
        "submit ms p50/p99 (burst)",
        "submit ms p50/p99 (at rate)",
        "submit→start ms p50/p99",
        "CPU µs/job submitter·workers",
        "plain SQLite commits/s",
        "vs 1 process",
    )
    for col in cols:
        t.add_column(col, justify="right")
    for tree, runs in (("before", before), ("this", rounds)):
        if runs:
            rows(t, tree, runs, rounds if tree == "before" else before, args)
    Console(width=200).print(t)


def rows(
    t: Any,
    tree: str,
    rounds: list[dict[int, dict[str, Any]]],
    other: list[dict[int, dict[str, Any]]],
    args: Any,
) -> None:
    """One tree's rows; "this" tree's rate also as a paired ratio over the ``other`` tree's."""
    first = args.workers[0]
    for w in args.workers:
        ok = [r[w] for r in rounds if "rate" in r[w]]
        if not ok:
            t.add_row(tree, str(w), "failed", "", "", "", "", "", "", rounds[-1][w]["error"][:60])
            continue

        def med(field: str, rows: list[dict[str, Any]] = ok) -> float:
            return float(statistics.median(r[field] for r in rows))

        pairs = [r for r in rounds if "rate" in r[w] and "rate" in r[first]]
        vs = ratio([r[w]["rate"] / r[first]["rate"] for r in pairs]) if pairs else ""
        if tree == "this" and other:
            mine = [
                (a[w], b[w]) for a, b in zip(rounds, other, strict=True) if "rate" in a[w] and "rate" in b[w]
            ]
            vs += f"; {ratio([a['rate'] / b['rate'] for a, b in mine])} before" if mine else ""
        ceil = [r for r in pairs if "ceiling" in r[w]]
        t.add_row(
            tree,
            str(w),
            f"{med('rate'):,.0f}",
            vs,
            f"{med('burst_p50'):.3f} / {med('burst_p99'):.3f}",
            f"{med('steady_p50'):.3f} / {med('steady_p99'):.3f}",
            f"{med('p50'):.2f} / {med('p99'):.2f}",
            f"{med('cpu_submitter'):,.0f}·{med('cpu_workers'):,.0f}",
            f"{med('ceiling', [r[w] for r in ceil]):,.0f}" if ceil else "",
            ratio([r[w]["ceiling"] / r[first]["ceiling"] for r in ceil]) if ceil else "",
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4], help="worker process counts (1 2 4)")
    p.add_argument("--n", type=int, default=10_000, help="jobs in the throughput run (10,000)")
    p.add_argument("--m", type=int, default=500, help="jobs in the latency run (500)")
    p.add_argument("--rate", type=float, default=500.0, help="submissions/s in the latency run (500)")
    p.add_argument("--rounds", type=int, default=3, help="rounds; each measures every count (3)")
    p.add_argument("--ceiling-s", type=float, default=1.0, help="seconds of each plain SQLite loop (1)")
    p.add_argument("--quick", action="store_true", help="500 jobs, 100 at the rate, one round")
    p.add_argument("--before", help="also measure this source tree (its src folder) in every round")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.n, args.m, args.rate)))
        return
    if args.quick:
        args.n, args.m, args.rounds, args.ceiling_s = min(args.n, 500), min(args.m, 100), 1, 0.3
    if args.rounds < 1 or min(args.workers) < 1:
        p.error("--rounds and --workers must be at least 1")
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    rounds: list[dict[int, dict[str, Any]]] = []
    before: list[dict[int, dict[str, Any]]] = []
    trees: list[str | None] = [None, args.before] if args.before else [None]
    for k in range(args.rounds):
        order = args.workers if k % 2 == 0 else args.workers[::-1]
        got: dict[str | None, dict[int, dict[str, Any]]] = {tree: {} for tree in trees}
        for i, w in enumerate(order):
            for tree in trees if (k + i) % 2 == 0 else trees[::-1]:
                r = got[tree][w] = measure(w, args, tree)
                done = f"{r['rate']:,.0f} jobs/s" if "rate" in r else r["error"]
                name = "before" if tree else "this"
                print(
                    f"  round {k + 1}/{args.rounds} {name} {w} worker(s): {done}", file=sys.stderr, flush=True
                )
        rounds.append(got[None])
        if args.before:
            before.append(got[args.before])
    table(rounds, before, args)


if __name__ == "__main__":
    main()
