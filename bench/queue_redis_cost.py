"""The Redis server's work per job of Foundry's Redis queue, script by script, for two
source trees in alternating rounds: what the single-threaded server spends between two
submits (issue 17: the queue on Redis against a raw ``LPUSH``/``BRPOP`` loop).

    python bench/queue_redis_cost.py --before /work/main/src --after src
    python bench/queue_redis_cost.py --before ../main/src --after src --rounds 9 --n 3000 --batch 8

Each round runs, once per tree and in a child process of its own, ``--n`` jobs through
the three scripts a job costs: ``enqueue`` one at a time, ``claim`` ``--batch`` at a time,
``complete_many`` per batch. Per phase it reads the server's own counters before and
after: ``INFO commandstats`` (µs inside ``EVALSHA``, the scripts' commands included) and
``INFO cpu`` (the server process's CPU, its network reads and writes included). Both
count the server's work, not the client's waiting, so they move far less with the
machine's load than a rate does; the median over rounds is shown, with the range of the
paired after/before ratios.

The counters are the whole server's: by default the script starts a private
``redis-server`` (``tests/private_servers.py``: no persistence, a free port, a temporary
directory) and removes it at the end; ``--url`` names another one (then nobody else may
use it meanwhile). Nothing is reset on the server (``CONFIG RESETSTAT`` is never sent):
the deltas are computed here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

PHASES = ("enqueue", "claim", "complete")


def _counters(client: Any) -> tuple[float, float]:
    """(µs inside EVALSHA so far, the server's CPU seconds so far); under ``--callgrind``
    (the server runs in valgrind) the instructions it has run so far instead of µs."""
    cpu = client.info("cpu")
    seconds = float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
    if os.environ.get("QCOST_CALLGRIND"):
        pid = str(client.info("server")["process_id"])
        shown = subprocess.run(["callgrind_control", "-e", pid], capture_output=True, text=True, check=True)
        counts = re.findall(r"Th \d+\s+([\d,]+)", shown.stdout)
        return float(sum(int(c.replace(",", "")) for c in counts)), seconds
    stats = client.info("commandstats").get("cmdstat_evalsha", {"usec": 0})
    return float(stats["usec"]), seconds


def child(src: str, url: str, n: int, batch: int) -> dict[str, float]:
    """One tree's run: the server's µs per job, per phase (EVALSHA and process CPU)."""
    sys.path.insert(0, src)
    import redis

    from foundry.backends.queue.base import NewJob
    from foundry.backends.queue.redis import RedisQueue

    client = redis.Redis.from_url(url)
    q = RedisQueue(f"{url}?prefix=qcost{uuid.uuid4().hex[:8]}")
    try:
        # warm-up: every script loaded, connections open
        q.enqueue(NewJob(id=uuid.uuid4().hex, queue="q", unit="u", payload=b"{}"))
        warm = q.claim("q", "w", lease=60, limit=1, timeout=1)
        q.complete_many([(c.id, c.token, b"null") for c in warm])
        jobs = [
            NewJob(id=uuid.uuid4().hex, queue="q", unit="qbench_tasks.noop", payload=b"[%d]" % i)
            for i in range(n)
        ]
        claimed: list[Any] = []

        def enqueue() -> None:
            for job in jobs:
                q.enqueue(job)

        def claim() -> None:
            while len(claimed) < n:
                got = q.claim("q", "w", lease=60, limit=batch, timeout=1)
                if not got:
                    raise RuntimeError(f"claim found nothing with {n - len(claimed)} jobs left")
                claimed.extend(got)

        def complete() -> None:
            for i in range(0, n, batch):
                done = q.complete_many([(c.id, c.token, b"null") for c in claimed[i : i + batch]])
                if not all(done):
                    raise RuntimeError("a completion was refused")

        out: dict[str, float] = {}
        steps: dict[str, Callable[[], None]] = {"enqueue": enqueue, "claim": claim, "complete": complete}
        for name in PHASES:
            usec0, cpu0 = _counters(client)
            steps[name]()
            usec1, cpu1 = _counters(client)
            out[name] = (usec1 - usec0) / n / (1000 if os.environ.get("QCOST_CALLGRIND") else 1)
            out[name + " cpu"] = (cpu1 - cpu0) * 1e6 / n
        return out
    finally:
        q.destroy()
        q.close()
        client.close()


@contextlib.contextmanager
def private_redis(callgrind: bool) -> Iterator[str]:
    """A private ``redis-server`` (``tests/private_servers.py``: a free port, a temporary
    directory, no persistence, removed afterwards), in valgrind's callgrind when asked: its URL."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for tests/
    from tests.private_servers import SERVERS, PrivateRedis, private_server

    class Callgrind(PrivateRedis):
        def command(self) -> list[str]:
            out = f"--callgrind-out-file={self.dir}/callgrind.%p"
            return ["valgrind", "--tool=callgrind", out, *super().command(), "--hz", "1"]

    SERVERS["redis-callgrind"] = Callgrind  # this process's own kind of private server
    with private_server("redis-callgrind" if callgrind else "redis", appendonly=False) as server:
        yield server.url


def measure(src: Path, url: str, n: int, batch: int) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", str(src), "--url", url, "--n", str(n), "--batch", str(batch)]
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{src} failed: {(done.stderr or done.stdout)[-800:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def compare(args: argparse.Namespace, url: str) -> None:
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for r in range(args.rounds):
        for side in ("before", "after") if r % 2 == 0 else ("after", "before"):  # a drift lands on both
            runs[side].append(measure(trees[side], url, args.n, args.batch))
    print(f"# {args.n} jobs, claims and completions {args.batch} at a time; median of {args.rounds} rounds")
    counted = os.environ.get("QCOST_CALLGRIND")
    first = "thousands of instructions (callgrind)" if counted else "µs inside EVALSHA (commandstats)"
    print(f"# the Redis server per job: {first} · µs of the process's CPU (INFO cpu)")
    for suffix, what in (("", "k instr" if counted else "EVALSHA"), (" cpu", "server CPU")):
        total = dict.fromkeys(runs, 0.0)
        for phase in (*PHASES, "total"):
            if phase == "total":
                med = total
                ratios = [
                    sum(a[p + suffix] for p in PHASES) / sum(b[p + suffix] for p in PHASES)
                    for a, b in zip(runs["after"], runs["before"], strict=True)
                ]
            else:
                med = {side: statistics.median(x[phase + suffix] for x in runs[side]) for side in runs}
                for side in runs:
                    total[side] += med[side]
                ratios = [
                    a[phase + suffix] / b[phase + suffix]
                    for a, b in zip(runs["after"], runs["before"], strict=True)
                    if b[phase + suffix]
                ]
            print(
                f"{what:10s} {phase:8s} before {med['before']:6.1f}  after {med['after']:6.1f}  "
                f"after/before {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", type=Path, help="the src folder of the tree before the change")
    p.add_argument("--after", type=Path, help="the src folder of the tree after the change")
    p.add_argument("--url", help="a Redis nobody else uses meanwhile (default: start a private one)")
    p.add_argument("--rounds", type=int, default=7, help="rounds; each measures both trees (7)")
    p.add_argument("--n", type=int, default=3000, help="jobs per run (3,000)")
    p.add_argument("--batch", type=int, default=8, help="jobs per claim and per complete_many (8)")
    p.add_argument(
        "--callgrind",
        action="store_true",
        help="run the private Redis in valgrind's callgrind and count its instructions per job "
        "instead of µs: the same on a quiet machine and a loaded one (each run is ~50× slower)",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.url, args.n, args.batch)))
        return
    if args.before is None or args.after is None:
        p.error("--before and --after are required")
    if args.url:
        compare(args, args.url)
        return
    if args.callgrind:
        os.environ["QCOST_CALLGRIND"] = "1"  # the children count instructions
    with private_redis(args.callgrind) as url:
        compare(args, url)


if __name__ == "__main__":
    main()
