"""What the dashboard costs the workers it watches.

    python bench/dashboard.py               # 3 paired rounds, 1500 jobs, 10 tabs
    python bench/dashboard.py --quick       # seconds (the smoke run)

Two measurements:

* **the heartbeat** — the only thing a worker does for the dashboard: one
  ``Beacon.beat()`` per second (a compact copy of the in-memory registry, one file
  replace). Timed here over many beats with a registry of realistic size; reported as
  milliseconds per beat and as the fraction of one core at 1 beat/s.
* **open tabs** — a real ``foundry worker`` (SQLite queue, 8 threads) drains ``--n``
  no-op jobs while a dashboard server is polled by ``--tabs`` clients every second
  (``/api/live`` and ``/api/jobs``, what an open page asks), against the same drain
  with the dashboard idle. Rounds alternate which side runs first; the ratio is the
  median of the per-round paired ratios (with their range). The dashboard's engine
  reads are counted from its cache: however many tabs, one read per key per TTL.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]


def beat_cost(beats: int) -> float:
    """Seconds of CPU per beat, with ~60 series in the registry."""
    from foundry.observe import names
    from foundry.observe.fleet import Beacon
    from foundry.observe.metrics import Registry

    registry = Registry()
    for i in range(20):
        labels = (f"unit{i}", "queue")
        registry.counter(names.UNIT_COMPLETED, "c", ("unit", "model")).labels(*labels).inc(i)
        registry.gauge(names.UNIT_IN_FLIGHT, "g", ("unit", "model")).labels(*labels).set(i)
        h = registry.histogram(names.UNIT_DURATION, "h", ("unit", "model")).labels(*labels)
        h.observe_many([0.01 * k for k in range(200)])
    with tempfile.TemporaryDirectory() as tmp:
        beacon = Beacon(Path(tmp, "fleet").as_uri(), role="bench", registry=registry)
        beacon.beat()
        start = time.process_time()
        for _ in range(beats):
            beacon.beat()
        return (time.process_time() - start) / beats


def drain(env: dict[str, str], n: int, tabs: int, url: str | None) -> tuple[float, int]:
    """Seconds for a worker to drain ``n`` jobs while ``tabs`` clients poll ``url``."""
    import importlib

    import bench._dashboard_app as appmod

    app = importlib.reload(appmod).app
    stop = threading.Event()
    polls = [0]

    def tab() -> None:
        while not stop.is_set():
            for path in ("/api/live", "/api/jobs"):
                with urllib.request.urlopen(url + path, timeout=30) as resp:  # type: ignore[operator]
                    resp.read()
                polls[0] += 1
            stop.wait(1.0)

    threads = [threading.Thread(target=tab, daemon=True) for _ in range(tabs if url else 0)]
    worker = subprocess.Popen(
        [sys.executable, "-m", "foundry.cli", "worker", "bench._dashboard_app:app", "-q", "-c", "8"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    try:
        app.units["noop"].submit(0).result(timeout=60)  # the worker is up
        for t in threads:
            t.start()
        time.sleep(1.0)
        start = time.perf_counter()
        handles = app.units["noop"].submit_many(range(n))
        for h in handles:
            h.result(timeout=300)
        took = time.perf_counter() - start
    finally:
        stop.set()
        worker.terminate()
        worker.wait(timeout=30)
        app.close()
    return took, polls[0]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=1500)
    parser.add_argument("--tabs", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--beats", type=int, default=2000)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.n, args.rounds, args.beats, args.tabs = 200, 1, 200, 3

    per_beat = beat_cost(args.beats)
    print(f"heartbeat: {per_beat * 1e3:.3f} ms CPU per beat = {per_beat * 100:.3f} % of one core at 1 beat/s")

    from foundry.observe.dashboard import serve_dashboard

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp, ".foundry")
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
            "FOUNDRY_HOME": str(home),
            "FOUNDRY_QUEUE": f"sqlite:///{home / 'queue.db'}",
            "FOUNDRY_FLEET": (home / "fleet").as_uri(),
        }
        os.environ.update({k: env[k] for k in ("FOUNDRY_HOME", "FOUNDRY_QUEUE", "FOUNDRY_FLEET")})
        import bench._dashboard_app as appmod

        server = serve_dashboard(appmod.app, port=0, poll=1.0)
        ratios, idle, watched = [], [], []
        try:
            for r in range(args.rounds):
                order = [False, True] if r % 2 == 0 else [True, False]
                times = {}
                for with_tabs in order:
                    took, polls = drain(env, args.n, args.tabs, server.url if with_tabs else None)
                    times[with_tabs] = took
                    if with_tabs:
                        print(f"round {r + 1}: {args.tabs} tabs made {polls} requests", flush=True)
                idle.append(args.n / times[False])
                watched.append(args.n / times[True])
                ratios.append(watched[-1] / idle[-1])
                print(
                    f"round {r + 1}: idle {idle[-1]:.0f} jobs/s, watched {watched[-1]:.0f} jobs/s", flush=True
                )
            misses = server.api.cache.misses
            hits = server.api.cache.hits
        finally:
            server.close()
    print(
        f"worker throughput with {args.tabs} open tabs / with none: median {statistics.median(ratios):.2f}x "
        f"(range {min(ratios):.2f}-{max(ratios):.2f}) over {args.rounds} paired round(s); "
        f"dashboard engine reads {misses}, served from cache {hits}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
