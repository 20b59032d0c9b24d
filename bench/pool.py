"""Work pool: Foundry's pool against raw NATS request-reply, a plain gRPC thread-pool
server, and ProcessPoolExecutor, on the same work, side by side in one run.

    python bench/pool.py                  # 3 paired rounds, 2000 requests each
    python bench/pool.py --rounds 5 --requests 4000
    python bench/pool.py --quick --json   # a few seconds (the test suite's smoke run)
    python bench/pool.py --tail           # raw NATS vs the pool: p50/p90/p99 at 50 % load
    python bench/pool.py --private-nats   # on a nats-server of the run's own (CPU measured too)

The work is a ~200 µs CPU spin per request (``bench_pool_work.spin``), 2 workers
everywhere (this machine has 2 cores). Per round, in alternating order:

* **throughput**: a closed loop of 8 callers, each sending its next request when the
  last was answered, until ``--requests`` are done;
* **latency at 50 % load** (network peers): an open loop at a fixed rate of half of
  *each system's own* throughput measured in that round (never above its capacity), p50
  and p99 of scheduled-send-to-answer; the three systems run side by side and their open
  loops are cut in 8 blocks, interleaved, so background load falls on all of them alike;
* **CPU per request**: user + system seconds of this (client) process and of the
  server's processes (and, with ``--private-nats``, of the nats-server) during the
  throughput run, divided by the requests.

Peers: **raw NATS** is the plainest fast use of nats-py request-reply: two worker
processes, each one connection with a plain queue-group subscription whose callback
spins and ``msg.respond``s; the client ``await nc.request(...)``s (nats-py's shared
response inbox) on one asyncio loop thread, called from the same 8 caller threads
through ``run_coroutine_threadsafe`` as Foundry's sync API is. It has none of the pool's
semantics (a request queues behind a busy subscriber; a dead worker is a client timeout).
A gRPC server (``grpcio``, generic handler, a thread pool of 2). Against them, Foundry's
pool over NATS (``foundry pool serve``: one host process with the dispatcher, 2 worker
processes); the embedded pool (``local://``) against ``ProcessPoolExecutor(2)``. Ratios
are Foundry ÷ peer per round; the median of those with their range is what to read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent / "src"))
sys.path.insert(0, str(_HERE / "pool_peers"))

import bench_pool_work  # noqa: E402 (after the sys.path fix above)

NATS_URL = os.environ.get("FOUNDRY_TEST_NATS", "nats://127.0.0.1:4222")
BROKER_PID = 0  # the nats-server's pid when this run started its own (--private-nats)
CALLERS = 8
WORKERS = 2


@contextlib.contextmanager
def private_nats() -> Iterator[None]:
    """A nats-server of this run's own on a free port (``--private-nats``): no other
    tenant's traffic on it, and its CPU per request is measured too."""
    global NATS_URL, BROKER_PID
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        ["nats-server", "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the private nats-server did not start") from None
                time.sleep(0.05)
        NATS_URL, BROKER_PID = f"nats://127.0.0.1:{port}", proc.pid
        yield
    finally:
        proc.terminate()
        proc.wait(10)


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_HERE.parent / "src"), str(_HERE / "pool_peers")])
    return env


def percentiles(latencies: list[float]) -> tuple[float, float]:
    data = sorted(latencies)
    if not data:
        return 0.0, 0.0
    return data[len(data) // 2], data[min(len(data) - 1, int(len(data) * 0.99))]


def closed_loop(call: Callable[[int], Any], n: int) -> float:
    """Requests per second with CALLERS threads, each calling back to back."""
    counter = iter(range(n))
    lock = threading.Lock()

    def caller() -> None:
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            call(i)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=caller) for _ in range(CALLERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return n / (time.perf_counter() - t0)


def open_loop(call: Callable[[int], Any], rate: float, n: int) -> list[float]:
    """Scheduled-start-to-answer seconds of ``n`` requests sent at ``rate`` requests/s
    (a fixed schedule, whatever the answers do: an open loop)."""
    latencies: list[float] = []
    lock = threading.Lock()
    start = time.perf_counter() + 0.05

    def one(i: int) -> None:
        due = start + i / rate
        pause = due - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        call(i)
        with lock:
            latencies.append(time.perf_counter() - due)

    with ThreadPoolExecutor(64) as pool:
        list(pool.map(one, range(n)))
    return latencies


# -- raw NATS -----------------------------------------------------------------------


class RawNats:
    """Two ``bench_pool_work`` raw subscriber processes and an asyncio client thread."""

    uses_nats = True

    def __init__(self) -> None:
        self.subject = f"bench.raw.{uuid.uuid4().hex[:8]}"
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "bench_pool_work", "raw-nats", NATS_URL, self.subject], env=child_env()
            )
            for _ in range(WORKERS)
        ]
        import nats

        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.nc = asyncio.run_coroutine_threadsafe(nats.connect(NATS_URL), self.loop).result(10)
        deadline = time.monotonic() + 30
        while True:  # until both subscribers answer
            try:
                self(0)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def server_pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def __call__(self, i: int) -> bytes:
        future = asyncio.run_coroutine_threadsafe(self.nc.request(self.subject, b"x", timeout=10), self.loop)
        return bytes(future.result(20).data)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.nc.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        for p in self.procs:
            p.terminate()
            p.wait(10)


# -- gRPC ---------------------------------------------------------------------------


class Grpc:
    def __init__(self) -> None:
        import grpc

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench_pool_work", "grpc", "0"], env=child_env(), stdout=subprocess.PIPE
        )
        assert self.proc.stdout is not None
        port = int(self.proc.stdout.readline())
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = self.channel.unary_unary("/bench.Pool/Spin")
        grpc.channel_ready_future(self.channel).result(timeout=30)

    def server_pids(self) -> list[int]:
        return [self.proc.pid]

    def __call__(self, i: int) -> bytes:
        return bytes(self.stub(b"x", timeout=10))

    def close(self) -> None:
        self.channel.close()
        self.proc.terminate()
        self.proc.wait(10)


# -- Foundry ------------------------------------------------------------------------


class FoundryNats:
    """``foundry pool serve`` with 2 workers in another process, and a client app."""

    uses_nats = True

    def __init__(self) -> None:
        from foundry import Foundry

        prefix = f"b{uuid.uuid4().hex[:8]}"
        self.url = f"{NATS_URL}?prefix={prefix}"
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (open for the server's life)
            prefix="bench-pool-serve-", suffix=".log", delete=False
        )
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "foundry.cli",
                "pool",
                "serve",
                "bench_pool_work:app",
                "--url",
                self.url,
                "-q",
            ],
            env=child_env(),
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.app = Foundry("benchpool", pool=self.url)
        self.unit = self.app.work(model="pool", idempotent=True, workers=WORKERS, name="spin")(
            bench_pool_work.spin_fn
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                self(0)
                break
            except Exception:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.1)

    def server_pids(self) -> list[int]:
        return [self.proc.pid]

    @property
    def host_pid(self) -> int:
        return self.proc.pid

    def __call__(self, i: int) -> Any:
        return self.unit(b"x".decode())

    def close(self) -> None:
        self.app.close()
        self.proc.terminate()
        self.proc.wait(30)
        os.unlink(self.log.name)


class FoundryLocal:
    def __init__(self) -> None:
        from foundry import Foundry

        self.app = Foundry("benchlocal", pool="local://")
        self.unit = self.app.work(model="pool", idempotent=True, workers=WORKERS, name="spin")(
            bench_pool_work.spin_fn
        )
        self(0)

    def __call__(self, i: int) -> Any:
        return self.unit("x")

    def close(self) -> None:
        self.app.close()


class ProcessPool:
    def __init__(self) -> None:
        import multiprocessing

        self.pool = ProcessPoolExecutor(WORKERS, mp_context=multiprocessing.get_context("forkserver"))
        self(0)

    def __call__(self, i: int) -> Any:
        return self.pool.submit(bench_pool_work.spin_fn, "x").result()

    def close(self) -> None:
        self.pool.shutdown()


# -- the run ------------------------------------------------------------------------


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) of one process so far; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return out


def measure(target: Any, n: int) -> dict[str, float]:
    """Capacity (a closed loop), and the CPU each request cost in this (client) process,
    in the server's processes and (with ``--private-nats``, for the NATS peers) in the
    nats-server."""
    servers = [p for root in getattr(target, "server_pids", list)() for p in _tree(root)]
    broker = BROKER_PID if getattr(target, "uses_nats", False) else 0
    host = getattr(target, "host_pid", 0)  # Foundry's dispatcher process (its workers are children)
    client0, server0, broker0 = _cpu(os.getpid()), sum(_cpu(p) for p in servers), _cpu(broker)
    host0 = _cpu(host)
    out = {"throughput": closed_loop(target, n)}
    if servers:
        out["cpu_client_us"] = (_cpu(os.getpid()) - client0) / n * 1e6
        out["cpu_server_us"] = (sum(_cpu(p) for p in servers) - server0) / n * 1e6
    if host:
        out["cpu_host_us"] = (_cpu(host) - host0) / n * 1e6
    if broker:
        out["cpu_broker_us"] = (_cpu(broker) - broker0) / n * 1e6
    return out


BLOCKS = 8  # latency: each system's open loop is cut in blocks, interleaved with the others'


def one_round(r: int, n: int) -> dict[str, dict[str, float]]:
    """One paired round. The network systems run side by side: each one's capacity
    first (closed loops, in alternating order), then an open loop at 50 % of *its own*
    capacity, cut in blocks interleaved with the others' blocks so that every system
    sees the same background load; p50/p99 over all its blocks. Then the embedded pool
    and ProcessPoolExecutor, throughput only."""
    out: dict[str, dict[str, float]] = {}
    network: list[tuple[str, Callable[[], Any]]] = [
        ("raw", RawNats),
        ("grpc", Grpc),
        ("foundry", FoundryNats),
    ]
    local: list[tuple[str, Callable[[], Any]]] = [("ppe", ProcessPool), ("local", FoundryLocal)]
    if r % 2:
        network.reverse()
        local.reverse()
    targets = {name: make() for name, make in network}
    try:
        for name, _ in network:
            out[name] = measure(targets[name], n)
        latencies: dict[str, list[float]] = {name: [] for name, _ in network}
        block = max(25, n // 2 // BLOCKS)
        for b in range(BLOCKS):
            for name, _ in network if b % 2 == 0 else list(reversed(network)):
                rate = out[name]["throughput"] / 2
                latencies[name] += open_loop(targets[name], rate, block)
        for name, _ in network:
            out[name]["rate"] = out[name]["throughput"] / 2
            out[name]["p50"], out[name]["p99"] = percentiles(latencies[name])
    finally:
        for target in targets.values():
            target.close()
    for name, make in local:
        target = make()
        try:
            out[name] = measure(target, n)
        finally:
            target.close()
    return out


def tail(blocks: int = 10, per_block: int = 200) -> int:
    """``--tail``: raw NATS and the pool over NATS only, each at 50 % of its capacity, the
    open loops in interleaved blocks; the latency distribution of each."""
    targets = {"raw": RawNats(), "foundry": FoundryNats()}
    try:
        capacity = {name: closed_loop(t, 2000) for name, t in targets.items()}
        latencies: dict[str, list[float]] = {name: [] for name in targets}
        names = list(targets)
        for b in range(blocks):
            for name in names if b % 2 == 0 else names[::-1]:
                latencies[name] += open_loop(targets[name], capacity[name] / 2, per_block)
    finally:
        for t in targets.values():
            t.close()
    print(f"{blocks} interleaved blocks of {per_block} requests at 50 % of each one's capacity")
    for name, xs in latencies.items():
        xs.sort()
        cut = " ".join(
            f"p{q:g} {xs[min(len(xs) - 1, int(len(xs) * q / 100))] * 1000:.2f}" for q in (50, 90, 99)
        )
        print(f"{name:<8} capacity {capacity[name]:,.0f}/s  {cut} ms")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="200 requests, one round: a smoke run")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--tail", action="store_true", help="raw NATS vs the pool: latency distribution only")
    parser.add_argument(
        "--private-nats", action="store_true", help="run a nats-server of its own (and measure its CPU)"
    )
    args = parser.parse_args(argv)
    with private_nats() if args.private_nats else contextlib.nullcontext():
        return run(args)


def run(args: argparse.Namespace) -> int:
    if args.tail:
        return tail()
    n = 200 if args.quick else args.requests
    rounds = 1 if args.quick else max(1, args.rounds)
    load = os.getloadavg()[0]
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in ("raw", "grpc", "foundry", "local", "ppe")}
    for r in range(rounds):
        for name, row in one_round(r, n).items():
            runs[name].append(row)

    def paired(a: str, b: str, field: str) -> dict[str, float]:
        ratios = [x[field] / y[field] for x, y in zip(runs[a], runs[b], strict=True) if y[field]]
        return {"median": statistics.median(ratios), "lo": min(ratios), "hi": max(ratios)}

    def added(a: str, b: str, field: str) -> dict[str, float]:
        diffs = [(x[field] - y[field]) * 1000 for x, y in zip(runs[a], runs[b], strict=True)]
        return {"median": statistics.median(diffs), "lo": min(diffs), "hi": max(diffs)}

    report = {
        "requests": n,
        "rounds": rounds,
        "load": f"load average {load:.1f} → {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
        "nats": "a private nats-server" if BROKER_PID else NATS_URL,
        "runs": runs,
        "foundry_vs_raw_nats_throughput": paired("foundry", "raw", "throughput"),
        "foundry_vs_grpc_throughput": paired("foundry", "grpc", "throughput"),
        "foundry_added_p99_ms_vs_raw_nats": added("foundry", "raw", "p99"),
        "local_vs_processpool_throughput": paired("local", "ppe", "throughput"),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"{n} requests of ~200 µs CPU, {WORKERS} workers, {CALLERS} callers, {rounds} paired rounds "
        f"({report['load']})\n"
    )
    print(
        f"{'variant':<34} {'req/s (median)':>15} {'p50 ms':>8} {'p99 ms':>8} "
        f"CPU µs/req client + server{' + nats-server' if BROKER_PID else ''}"
    )
    labels = {
        "raw": "raw nats-py queue group",
        "grpc": "gRPC thread pool (grpcio)",
        "foundry": "Foundry pool over NATS",
        "ppe": "ProcessPoolExecutor (forkserver)",
        "local": "Foundry pool, embedded (local://)",
    }
    for key, label in labels.items():
        rows = runs[key]
        tp = statistics.median(r["throughput"] for r in rows)
        p50 = statistics.median(r.get("p50", 0.0) for r in rows) * 1000
        p99 = statistics.median(r.get("p99", 0.0) for r in rows) * 1000
        lat = f"{p50:>8.2f} {p99:>8.2f}" if "p50" in rows[0] else f"{'':>8} {'':>8}"
        cpu = ""
        if "cpu_client_us" in rows[0]:
            client = statistics.median(r["cpu_client_us"] for r in rows)
            server = statistics.median(r["cpu_server_us"] for r in rows)
            cpu = f"{client:>11,.0f} + {server:,.0f}"
            if "cpu_broker_us" in rows[0]:
                cpu += f" + {statistics.median(r['cpu_broker_us'] for r in rows):,.0f}"
        print(f"{label:<34} {tp:>15,.0f} {lat} {cpu}")
    hosts = [r["cpu_host_us"] for r in runs["foundry"] if "cpu_host_us" in r]
    if hosts:
        server = statistics.median(r["cpu_server_us"] for r in runs["foundry"])
        host = statistics.median(hosts)
        print(f"{'  of which the host (dispatcher)':<34} {'':>15} {'':>8} {'':>8} {'':>11}   {host:,.0f}")
        print(
            f"{'  and its 2 worker processes':<34} {'':>15} {'':>8} {'':>8} {'':>11}   {server - host:,.0f}"
        )
    print()
    for key, text in (
        ("foundry_vs_raw_nats_throughput", "Foundry/raw NATS throughput (goal ≥ 0.7)"),
        ("foundry_vs_grpc_throughput", "Foundry/gRPC throughput"),
        ("local_vs_processpool_throughput", "embedded pool/ProcessPoolExecutor throughput"),
        ("foundry_added_p99_ms_vs_raw_nats", "added p99 at 50 % load, ms (goal ≤ 1)"),
    ):
        v = report[key]
        assert isinstance(v, dict)
        print(f"{text:<48} {v['median']:.2f} ({v['lo']:.2f}–{v['hi']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
