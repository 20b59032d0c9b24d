"""Durable queue benchmark: Foundry vs Celery, Dramatiq, RQ and Huey on the same brokers,
and the raw clients as the ceiling.

    python bench/queues.py                      # everything (a few minutes)
    python bench/queues.py --quick              # seconds: Foundry SQLite vs huey+SQLite (the smoke run)
    python bench/queues.py --n 2000 --only foundry-redis huey-redis raw-redis
    python bench/queues.py --rounds 5           # more rounds: steadier medians on a noisy machine

For each system: its documented worker runs in a subprocess started and stopped here
(one worker process × 8 threads: ``foundry worker -c 8``, ``celery worker --pool threads
-c 8``, ``dramatiq --processes 1 --threads 8``, ``huey_consumer -w 8 -k thread``; RQ has
no threads — ``rq worker`` forks per job, as shipped), and a producer process submits:

* **throughput** — ``--n`` no-op jobs (10,000; RQ ``--rq-n`` 1,000, it forks per job) as
  fast as one thread can submit them;
  the clock runs from the first submit until the last job has run (for Foundry: until
  the last completion record is written, which is stricter);
* **latency** — ``--m`` jobs (200) submitted one at a time ``--gap`` apart (10 ms) to an
  idle worker; submit→start p50/p99 (the task notes when it started).

The raw clients move one message at a time with no framework: redis-py ``LPUSH`` /
``BRPOP``; aio-pika publishing persistent messages (no confirms) and consuming with one
ack per message. Redis runs in database 13 (flushed before and after each system);
RabbitMQ systems share a private vhost created and deleted by the run. Every system gets
the same warm-up job first.

**Rounds and medians.** On a shared 2-core machine the same system's rate moves by ±40 %
from one minute to the next (other tenants, caches, frequency), so one run of each system
compares moments, not systems. The run repeats every system ``--rounds`` times (3),
forward in odd rounds and backward in even ones so that a drift in the machine's speed
falls on both sides, and reports per system the median of its rounds. The ratios are
*paired*: within each round Foundry's rate is divided by the peer's (or raw client's)
rate of that same round, and the table shows the median of those ratios with their
range.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# bench/ on sys.path would let this file shadow the standard library's ``queue``
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

ROOT = HERE.parent
PEERS = HERE / "queue_peers"
REDIS = os.environ.get("QBENCH_REDIS", "redis://127.0.0.1:6379/13")
AMQP = os.environ.get("QBENCH_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
LINE = 31

# system -> (broker, label)
SYSTEMS: dict[str, tuple[str, str]] = {
    "raw-redis": ("redis", "redis-py LPUSH/BRPOP, one at a time (ceiling)"),
    "foundry-redis": ("redis", "Foundry"),
    "foundry-redis-many": ("redis", "Foundry, submit_many (500 per chunk)"),
    "huey-redis": ("redis", "Huey 3"),
    "dramatiq-redis": ("redis", "Dramatiq 2"),
    "celery-redis": ("redis", "Celery 5"),
    "rq": ("redis", "RQ 3 (forks per job)"),
    "raw-amqp": ("rabbitmq", "aio-pika publish/consume, one at a time (ceiling)"),
    "foundry-amqp": ("rabbitmq", "Foundry (state: SQLite, the default)"),
    "foundry-amqp-redis": ("rabbitmq", "Foundry (state: Redis)"),
    "foundry-amqp-many": ("rabbitmq", "Foundry, submit_many (500 per chunk)"),
    "dramatiq-amqp": ("rabbitmq", "Dramatiq 2"),
    "celery-amqp": ("rabbitmq", "Celery 5"),
    "foundry-sqlite": ("sqlite", "Foundry (embedded)"),
    "foundry-sqlite-many": ("sqlite", "Foundry, submit_many (500 per chunk)"),
    "huey-sqlite": ("sqlite", "Huey 3 (SqliteHuey)"),
}
QUICK = ("foundry-sqlite", "huey-sqlite")


# -- the child: one system, end to end ---------------------------------------------------


class Run:
    """One system's worker subprocess, producer and latency file."""

    def __init__(self, system: str, tmp: Path, vhost: str) -> None:
        self.system = system
        self.tmp = tmp
        self.queue = f"qbench{uuid.uuid4().hex[:8]}"
        self.lat = tmp / "lat.txt"
        self.lat.touch()
        amqp = AMQP.rstrip("/") + "/" + vhost
        broker = {
            "foundry-redis": f"{REDIS}?prefix={self.queue}",
            "foundry-redis-many": f"{REDIS}?prefix={self.queue}",
            "foundry-amqp": f"{amqp}?prefix={self.queue}",
            "foundry-amqp-many": f"{amqp}?prefix={self.queue}",
            "foundry-amqp-redis": f"{amqp}?prefix={self.queue}&state="
            + REDIS.replace(":", "%3A").replace("/", "%2F"),
            "foundry-sqlite": f"sqlite:///{tmp / 'queue.db'}",
            "foundry-sqlite-many": f"sqlite:///{tmp / 'queue.db'}",
            "huey-sqlite": str(tmp / "huey.db"),
        }.get(system, amqp if system.endswith("amqp") else REDIS)
        self.broker = broker
        self.env = {
            **os.environ,
            # the peers' tasks first, then the caller's path (the Foundry tree under test)
            "PYTHONPATH": os.pathsep.join(p for p in (str(PEERS), os.environ.get("PYTHONPATH", "")) if p),
            "QBENCH_SYSTEM": system,
            "QBENCH_BROKER": broker,
            "QBENCH_QUEUE": self.queue,
            "QBENCH_LAT": str(self.lat),
            "FOUNDRY_HOME": str(tmp / "home"),
        }
        os.environ.update({k: v for k, v in self.env.items() if k.startswith(("QBENCH_", "FOUNDRY_"))})
        sys.path.insert(0, str(PEERS))
        self.worker: subprocess.Popen[bytes] | None = None

    def worker_command(self) -> list[str]:
        s = self.system
        if s.startswith("foundry"):
            return ["foundry", "worker", "qbench_tasks:app", "-c", "8", "--quiet"]
        if s.startswith("celery"):
            return [
                "celery", "-A", "qbench_tasks", "worker", "--pool", "threads", "-c", "8", "-Q", self.queue,
                "--loglevel", "WARNING", "--without-gossip", "--without-mingle", "--without-heartbeat",
            ]  # fmt: skip
        if s.startswith("dramatiq"):
            return ["dramatiq", "qbench_tasks", "--processes", "1", "--threads", "8", "--queues", self.queue]
        if s.startswith("huey"):
            return ["huey_consumer", "qbench_tasks.huey", "-w", "8", "-k", "thread", "-q"]
        if s == "rq":
            return ["rq", "worker", "-u", REDIS, "-q", self.queue]
        return [sys.executable, str(PEERS / "qbench_tasks.py"), s]

    def start(self) -> None:
        log = open(self.tmp / "worker.log", "wb")  # noqa: SIM115 - lives as long as the worker
        self.worker = subprocess.Popen(
            self.worker_command(), env=self.env, cwd=PEERS, stdout=log, stderr=log, start_new_session=True
        )
        log.close()

    def stop(self) -> None:
        if self.worker is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.worker.pid, signal.SIGTERM)
        try:
            self.worker.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.worker.pid, signal.SIGKILL)
            self.worker.wait(10)

    def lines(self) -> int:
        return self.lat.stat().st_size // LINE

    def wait_lines(self, n: int, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while self.lines() < n:
            if self.worker is not None and self.worker.poll() is not None:
                log = (self.tmp / "worker.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{self.system}: the worker exited ({self.worker.returncode}): {log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.system}: {what}: {self.lines()} of {n} jobs ran in {timeout:.0f}s")
            time.sleep(0.002)

    def read(self, start: int, n: int) -> list[tuple[float, float]]:
        with open(self.lat, "rb") as f:
            f.seek(start * LINE)
            data = f.read(n * LINE)
        out = []
        for i in range(n):
            lat, end = data[i * LINE : (i + 1) * LINE].split()
            out.append((float(lat), float(end)))
        return out


def producer(run: Run) -> tuple[Callable[[float], Any], Callable[[int], None], Callable[[], None]]:
    """(submit one, submit n as fast as possible, close) for ``run.system``."""
    s = run.system
    close: Callable[[], None] = lambda: None  # noqa: E731
    import qbench_tasks as tasks  # type: ignore[import-not-found]

    if s.startswith("foundry"):
        unit = tasks.app.units["noop"]
        submit: Callable[[float], Any] = unit.submit
        close = tasks.app.close
    elif s.startswith("celery"):
        submit = tasks.noop.delay
    elif s.startswith("dramatiq"):
        submit = tasks.noop.send
    elif s.startswith("huey"):
        submit = tasks.noop
    elif s == "rq":
        import redis
        from rq import Queue

        q = Queue(run.queue, connection=redis.Redis.from_url(REDIS))
        submit = lambda ts: q.enqueue("qbench_tasks.noop", ts)  # noqa: E731
    elif s == "raw-redis":
        import redis

        r = redis.Redis.from_url(REDIS)
        submit = lambda ts: r.lpush(run.queue, repr(ts))  # noqa: E731
    else:  # raw-amqp: one persistent publish at a time, on one event loop
        import asyncio

        import aio_pika

        async def setup() -> tuple[Any, Any]:
            conn = await aio_pika.connect(run.broker)
            channel = await conn.channel(publisher_confirms=False)
            await channel.declare_queue(run.queue, durable=True)
            return conn, channel

        loop = asyncio.new_event_loop()
        conn, channel = loop.run_until_complete(setup())

        async def publish(ts: float) -> None:
            message = aio_pika.Message(repr(ts).encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
            await channel.default_exchange.publish(message, routing_key=run.queue)

        async def many(n: int) -> None:
            for _ in range(n):
                await publish(time.time())

        def close_amqp() -> None:
            loop.run_until_complete(conn.close())
            loop.close()

        return (
            (lambda ts: loop.run_until_complete(publish(ts))),
            (lambda n: loop.run_until_complete(many(n))),
            close_amqp,
        )

    def burst(n: int) -> None:
        if s.endswith("-many"):
            unit = tasks.app.units["noop"]
            for start in range(0, n, 500):
                unit.submit_many([time.time()] * min(500, n - start))
            return
        for _ in range(n):
            submit(time.time())

    return submit, burst, close


def drained(run: Run) -> float:
    """Foundry: when every completion record is written (the queue shows nothing left)."""
    from foundry.backends.queue import open_queue_backend

    backend = open_queue_backend(run.broker)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            st = backend.stats(run.queue)
            if st.depth == 0 and st.running == 0 and st.scheduled == 0:
                return time.time()
            time.sleep(0.002)
        raise TimeoutError(f"{run.system}: completion records not all written in 120s")
    finally:
        backend.close()


def child(system: str, n: int, m: int, gap: float, vhost: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="qbench-") as d:
        tmp = Path(d)
        run = Run(system, tmp, vhost)
        if SYSTEMS[system][0] == "redis":
            flush_redis()
        run.start()
        try:
            submit, burst, close = producer(run)
            try:
                submit(time.time())  # warm-up: also proves the worker is up
                run.wait_lines(1, 120, "warm-up")
                time.sleep(0.2)
                base = run.lines()
                meter = CpuMeter(run)
                meter.start()
                t0 = time.time()
                burst(n)
                submitted = time.time() - t0
                run.wait_lines(base + n, max(120.0, n / 20), "throughput")
                end = max(e for _, e in run.read(base, n))
                if system.startswith("foundry"):
                    end = max(end, drained(run))
                elapsed = end - t0
                cpu = meter.stop()
                time.sleep(0.3)
                base = run.lines()
                for _ in range(m):
                    submit(time.time())
                    time.sleep(gap)
                run.wait_lines(base + m, 120, "latency")
                lats = sorted(lat for lat, _ in run.read(base, m))
            finally:
                close()
        finally:
            run.stop()
            if SYSTEMS[system][0] == "redis":
                flush_redis()
    return {
        "system": system,
        "n": n,
        "rate": n / elapsed,
        "submit_rate": n / submitted,
        "cpu_us": [c / n * 1e6 for c in cpu],
        "p50": statistics.median(lats) * 1000,
        "p99": lats[min(len(lats) - 1, round(0.99 * (len(lats) - 1)))] * 1000,
    }


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_cpu(pid: int) -> float:
    """CPU seconds of a process and its reaped children (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / _TICK  # utime stime cutime cstime


def _tree(pid: int) -> list[int]:
    """``pid`` and its live descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError), open(f"/proc/{p}/task/{p}/children") as f:
            todo.extend(int(c) for c in f.read().split())
    return out


def _broker_pids(system: str) -> list[int]:
    """The broker's server processes: for Redis the one serving ``QBENCH_REDIS`` (it says
    its pid: another Redis on the machine, say a private one, is not counted), else every
    process of the broker's name."""
    if SYSTEMS[system][0] == "redis":
        import redis

        with contextlib.closing(redis.Redis.from_url(REDIS)) as r:
            pid = int(r.info("server")["process_id"])
        if Path(f"/proc/{pid}").exists():  # a server on this machine, seen from here
            return [pid]
    name = {"redis": "redis-server", "rabbitmq": "beam.smp"}.get(SYSTEMS[system][0])
    if name is None:
        return []
    found = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True, check=False)
    return [int(x) for x in found.stdout.split()]


class CpuMeter:
    """CPU seconds spent by the producer (this process), the worker (its process tree)
    and the broker's server processes between ``start`` and ``stop``."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.brokers = _broker_pids(run.system)

    def _now(self) -> tuple[float, float, float]:
        t = os.times()
        worker = self.run.worker.pid if self.run.worker is not None else None
        return (
            t.user + t.system,
            sum(_proc_cpu(p) for p in _tree(worker)) if worker else 0.0,
            sum(_proc_cpu(p) for p in self.brokers),
        )

    def start(self) -> None:
        self.begin = self._now()

    def stop(self) -> tuple[float, float, float]:
        end = self._now()
        return (end[0] - self.begin[0], end[1] - self.begin[1], end[2] - self.begin[2])


def flush_redis() -> None:
    import redis

    with contextlib.closing(redis.Redis.from_url(REDIS)) as r:
        r.flushdb()


# -- the parent: every system, one table ----------------------------------------------------


def rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=120)


def measure(system: str, args: argparse.Namespace, vhost: str) -> dict[str, Any]:
    n = min(args.n, args.rq_n) if system == "rq" else args.n
    cmd = [sys.executable, __file__, "--child", system, "--n", str(n), "--m", str(args.m)]
    cmd += ["--gap", str(args.gap), "--vhost", vhost]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"system": system, "error": " | ".join(tail)[-300:]}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One system's rounds folded into one row: the median of each figure (a failed round
    is dropped; a system that failed every round keeps the last error)."""
    ok = [r for r in runs if "rate" in r]
    if not ok:
        return runs[-1]
    row: dict[str, Any] = {"system": ok[0]["system"], "rounds": len(ok), "of": len(runs)}
    for field in ("rate", "submit_rate", "p50", "p99"):
        row[field] = statistics.median(r[field] for r in ok)
    row["cpu_us"] = [statistics.median(r["cpu_us"][i] for r in ok) for i in range(3)]
    row["rates"] = [r.get("rate") for r in runs]
    return row


def paired(mine: dict[str, Any], other: dict[str, Any], unit: str = "") -> str:
    """Median (and range) over the rounds of ``mine``'s rate ÷ ``other``'s in the same round."""
    ratios = [a / b for a, b in zip(mine["rates"], other["rates"], strict=True) if a and b]
    if not ratios:
        return ""
    med = statistics.median(ratios)
    if len(ratios) == 1:
        return f"{med:.2f}{unit}"
    return f"{med:.2f}{unit} ({min(ratios):.2f}–{max(ratios):.2f})"


def table(rounds: list[list[dict[str, Any]]], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    systems = [r["system"] for r in rounds[0]]
    results = [median_of([rnd[i] for rnd in rounds]) for i in range(len(systems))]
    by = {r["system"]: r for r in results}
    t = Table(
        title=f"{args.n:,} no-op jobs (RQ: {min(args.n, args.rq_n):,}); latency: {args.m} jobs "
        f"{args.gap * 1000:g} ms apart to an idle worker; median of {len(rounds)} round(s), "
        "ratios paired per round (range)"
    )
    for col in (
        "broker",
        "system",
        "jobs/s",
        "vs best peer",
        "× raw client",
        "submits/s",
        "p50 ms",
        "p99 ms",
        "CPU µs/job: producer·worker·broker",
    ):
        t.add_column(col, justify="left" if col in ("broker", "system") else "right")
    for broker in ("redis", "rabbitmq", "sqlite"):
        rows = [r for r in results if SYSTEMS[r["system"]][0] == broker]
        peers = [r for r in rows if "rate" in r and not r["system"].startswith(("foundry", "raw"))]
        best = max(peers, key=lambda r: r["rate"]) if peers else None
        raw = {"redis": by.get("raw-redis"), "rabbitmq": by.get("raw-amqp")}.get(broker)
        for r in rows:
            label = SYSTEMS[r["system"]][1]
            if "error" in r:
                t.add_row(broker, label, "failed", "", "", "", "", r["error"][:60])
                continue
            mine = r["system"].startswith("foundry")
            vs = paired(r, best, "×") if mine and best else ""
            if best is r:
                label += " (best peer)"
            x_raw = paired(r, raw) if mine and raw and "rate" in raw else ""
            if r["rounds"] < r["of"]:
                label += f" [{r['of'] - r['rounds']} round(s) failed]"
            t.add_row(
                broker,
                label,
                f"{r['rate']:,.0f}",
                vs,
                x_raw,
                f"{r['submit_rate']:,.0f}",
                f"{r['p50']:.2f}",
                f"{r['p99']:.2f}",
                "·".join(f"{c:,.0f}" for c in r["cpu_us"]) + f" = {sum(r['cpu_us']):,.0f}",
            )
    Console(width=190).print(t)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=10_000, help="jobs in the throughput run (10,000)")
    p.add_argument("--m", type=int, default=200, help="jobs in the latency run (200)")
    p.add_argument("--gap", type=float, default=0.01, help="seconds between latency submissions (0.01)")
    p.add_argument("--rq-n", type=int, default=1000, help="jobs in RQ's throughput run (it forks per job)")
    p.add_argument("--only", nargs="+", choices=sorted(SYSTEMS), help="run only these systems")
    p.add_argument("--rounds", type=int, default=3, help="times each system runs; medians are shown (3)")
    p.add_argument("--quick", action="store_true", help="200 jobs, Foundry SQLite vs huey+SQLite, one round")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--vhost", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.n, args.m, args.gap, args.vhost)))
        return
    systems = list(args.only or SYSTEMS)
    if args.quick:
        systems = list(args.only or QUICK)
        args.n, args.m, args.rounds = min(args.n, 200), min(args.m, 20), 1
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    vhost = ""
    if any(SYSTEMS[s][0] == "rabbitmq" for s in systems):
        vhost = f"qbench-{uuid.uuid4().hex[:8]}"
        rabbitmqctl("add_vhost", vhost)
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    rounds: list[list[dict[str, Any]]] = []
    try:
        for k in range(args.rounds):
            order = systems if k % 2 == 0 else systems[::-1]
            got = {}
            for system in order:
                r = got[system] = measure(system, args, vhost)
                done = f"{r['rate']:,.0f} jobs/s" if "rate" in r else r["error"]
                print(f"  round {k + 1}/{args.rounds} {system}: {done}", file=sys.stderr, flush=True)
            rounds.append([got[s] for s in systems])
    finally:
        if vhost:
            rabbitmqctl("delete_vhost", vhost)
    table(rounds, args)


if __name__ == "__main__":
    main()
