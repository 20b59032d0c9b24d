"""Before/after of a change to the durable queue: the same Foundry systems of
``bench/queues.py``, measured with two source trees in alternating order, round after
round, and compared as paired ratios (after ÷ before within a round).

    python bench/queues_ab.py --before /work/main/src --after src
    python bench/queues_ab.py --before ../main/src --after src --only foundry-sqlite --rounds 8 --n 3000

Each measurement is one ``bench/queues.py --child SYSTEM`` process run with
``PYTHONPATH`` set to that tree (throughput of ``--n`` no-op jobs through ``foundry worker
-c 8``, then the latency run), so the two trees never share a process. A shared machine
drifts by tens of percent within minutes: read the median of the paired ratios and its
range, not one round; the worker's CPU per job (from ``/proc``) drifts less than its rate.
Redis runs in ``QBENCH_REDIS`` (database 13 unless set).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SYSTEMS = ("foundry-sqlite", "foundry-redis", "foundry-sqlite-many", "foundry-redis-many")  # no vhost needed


def measure(src: Path, system: str, n: int, m: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, str(HERE / "queues.py"), "--child", system, "--n", str(n), "--m", str(m)]
    cmd += ["--gap", "0.01", "--vhost", ""]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{system} with {src} failed: {(done.stderr or done.stdout)[-500:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", type=Path, required=True, help="the src folder of the tree before the change")
    p.add_argument("--after", type=Path, required=True, help="the src folder of the tree after the change")
    p.add_argument("--only", nargs="+", choices=SYSTEMS, default=["foundry-sqlite", "foundry-redis"])
    p.add_argument("--rounds", type=int, default=6, help="rounds; each measures both trees (6)")
    p.add_argument("--n", type=int, default=5000, help="jobs in each throughput run (5,000)")
    p.add_argument("--m", type=int, default=50, help="jobs in each latency run (50)")
    args = p.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    rates: dict[str, dict[str, list[float]]] = {
        s: {"before": [], "after": [], "ratio": []} for s in args.only
    }
    p50: dict[str, dict[str, list[float]]] = {s: {"before": [], "after": []} for s in args.only}
    cpu: dict[str, list[float]] = {s: [] for s in args.only}  # worker CPU per job, after / before
    server: dict[str, dict[str, list[float]]] = {s: {"before": [], "after": []} for s in args.only}
    for r in range(args.rounds):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")  # a drift lands on both
        for system in args.only:
            got = {side: measure(trees[side], system, args.n, args.m) for side in order}
            for side in order:
                rates[system][side].append(got[side]["rate"])
                p50[system][side].append(got[side]["p50"])
                server[system][side].append(got[side]["cpu_us"][2])  # the broker's or store's server
            rates[system]["ratio"].append(got["after"]["rate"] / got["before"]["rate"])
            cpu[system].append(got["after"]["cpu_us"][1] / got["before"]["cpu_us"][1])
            print(
                f"round {r + 1} {system}: before {got['before']['rate']:,.0f}/s, after "
                f"{got['after']['rate']:,.0f}/s, ratio {rates[system]['ratio'][-1]:.2f}",
                flush=True,
            )
    for system in args.only:
        x, lat = rates[system], p50[system]
        print(
            f"{system}: jobs/s median before {statistics.median(x['before']):,.0f}, after "
            f"{statistics.median(x['after']):,.0f}; after/before paired median "
            f"{statistics.median(x['ratio']):.2f} (range {min(x['ratio']):.2f}-{max(x['ratio']):.2f}); "
            f"p50 latency ms before {statistics.median(lat['before']):.2f}, "
            f"after {statistics.median(lat['after']):.2f}; worker CPU per job after/before paired median "
            f"{statistics.median(cpu[system]):.2f} (range {min(cpu[system]):.2f}-{max(cpu[system]):.2f})"
        )
        srv = server[system]
        if any(srv["before"]):  # a server process was measured (Redis: the one serving QBENCH_REDIS)
            ratios = [a / b for a, b in zip(srv["after"], srv["before"], strict=True) if a and b]
            print(
                f"{system}: server CPU µs per job median before {statistics.median(srv['before']):.0f}, "
                f"after {statistics.median(srv['after']):.0f}; after/before paired median "
                f"{statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f})"
            )


if __name__ == "__main__":
    main()
