"""``foundry worker APP``: run the queued jobs of an app.

    foundry worker app.py                      # every queue the app's durable units use
    foundry worker pkg.module:app --queue emails=4 --queue default --concurrency 8
    foundry worker app.py --prefetch 1 --grace 30s --burst

``APP`` is ``module``, ``module:app`` or a ``file.py`` (``file.py:app``). The queue URL is
the app's (``Foundry(queue=...)``, ``FOUNDRY_QUEUE``, ``foundry.toml``, ``<project>/.foundry``)
unless ``--url`` names another. SIGTERM or Ctrl-C stops gracefully: no new claims,
jobs not started go back to the queue, running ones get ``--grace`` to finish, the rest
go back for immediate redelivery. A second SIGTERM or Ctrl-C ends the grace at once: what
still runs goes back for immediate redelivery, and the worker exits.

Exit status: 0 after a stop or (``--burst``) an empty queue; 1 when the worker stopped by
itself — one of its threads failed, or (``--burst``) the store refuses writes (a full
disk, a read-only file) — with the reason and the fix on stderr.

``--metrics-port`` serves ``/metrics`` (and the dashboard): the jobs' metrics and, when
the app has ``async def`` units, the lag of the worker's event loop and what held it
(``FOUNDRY_WATCHDOG=off`` turns that watchdog off).
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from typing import Any

from foundry.cli._target import Problem, reports_problems
from foundry.errors import DeclarationError
from foundry.traits import parse_duration, queue_name_problem

__all__ = ["add_parser", "parse_queues"]


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "worker",
        help="run an app's queued jobs (durable queue workers)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("app", help="module, module:app, or file.py[:app]")
    parser.add_argument(
        "--queue", "-Q", action="append", metavar="Q[=N]", help="a queue to serve, with its own concurrency"
    )
    parser.add_argument("--concurrency", "-c", type=int, default=8, help="jobs run at once per queue (8)")
    parser.add_argument(
        "--prefetch", type=int, help="jobs held per queue, running + waiting (2 x concurrency)"
    )
    parser.add_argument("--lease", default="30s", help="lease per job, extended every lease/3 (30s)")
    parser.add_argument("--grace", default="30s", help="time running jobs get to finish on SIGTERM (30s)")
    parser.add_argument("--backoff", default="1s", help="first retry delay for units that declare none (1s)")
    parser.add_argument("--burst", action="store_true", help="exit when the queues are empty")
    parser.add_argument("--url", help="queue URL (default: the app's)")
    parser.add_argument(
        "--metrics-port", type=int, help="serve /metrics and the dashboard on this port (0: a free one)"
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="print only warnings")
    parser.set_defaults(func=run)


def _seconds(flag: str, value: str) -> float:
    try:
        return parse_duration(value, unit="foundry worker", field_name=flag)
    except DeclarationError as exc:
        raise Problem(f"{flag} {value!r}: {exc.problem}. Fix: {exc.fix}", 2) from exc


def parse_queues(values: list[str] | None, concurrency: int) -> dict[str, int] | None:
    """``["emails=4", "default"]`` -> ``{"emails": 4, "default": concurrency}``."""
    if not values:
        return None
    plan: dict[str, int] = {}
    for value in values:
        name, sep, count = value.partition("=")
        if not name or (sep and not count.isdigit()) or (sep and int(count) < 1):
            raise Problem(f"--queue {value!r} is not Q or Q=N. Fix: e.g. --queue emails=4", 2)
        problem = queue_name_problem(name)
        if problem is not None:
            raise Problem(f"--queue {value!r}: {name!r} {problem}. Fix: e.g. --queue emails=4", 2)
        plan[name] = int(count) if sep else concurrency
    return plan


@reports_problems("worker")
def run(args: argparse.Namespace) -> int:
    from foundry.cli.workflows import load_app
    from foundry.deliver.worker import JobEvent, Worker
    from foundry.observe.fleet import fleet_beacon

    if args.concurrency < 1 or (args.prefetch is not None and args.prefetch < 1):
        raise Problem("--concurrency and --prefetch must be at least 1. Fix: e.g. --prefetch 1", 2)
    lease, grace, backoff = (
        _seconds(f, v)
        for f, v in (("--lease", args.lease), ("--grace", args.grace), ("--backoff", args.backoff))
    )
    if lease <= 0:
        raise Problem("--lease must be positive. Fix: e.g. --lease 30s", 2)
    app = load_app(args.app)
    queued = [name for name, unit in app.units.items() if unit.decision.delivery == "queue"]
    if not queued and not args.queue:
        from foundry.supervisor import describe_app

        app.close()
        fixes = [f"`foundry run {args.app}` runs everything it declares"]
        if app.workflows:
            fixes.append(f"`foundry workflows worker {args.app}` runs its workflows")
        raise Problem(
            f"app {app.name!r} declares no durable queue units, so a queue worker has nothing to run (it "
            f"declares: {describe_app(app)}). Fix: {'; '.join(fixes)}; or name a queue with --queue Q",
            2,
        )
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    counts: dict[str, int] = {}
    lock = threading.Lock()

    def count(event: JobEvent) -> None:
        with lock:
            counts[event.kind] = counts.get(event.kind, 0) + 1
        if event.kind in ("retry", "failed", "dead", "timeout", "released", "alone"):
            logging.getLogger("foundry.worker").info(
                "%s %s (%s, delivery %d): %s",
                event.kind,
                event.job_id,
                event.unit,
                event.delivery,
                event.detail,
            )

    worker = Worker(
        app,
        queues=parse_queues(args.queue, args.concurrency),
        concurrency=args.concurrency,
        prefetch=args.prefetch,
        lease=lease,
        grace=grace,
        burst=args.burst,
        backoff=backoff,
        url=args.url,
        on_event=None if args.quiet else count,  # --quiet logs and prints neither
    )
    server = app.serve_metrics(port=args.metrics_port) if args.metrics_port is not None else None
    beacon = fleet_beacon(
        app,
        "queue-worker",
        {
            "name": worker.name,
            "queues": worker.queues,
            "units": sorted(app.units),
            "exporter": None if server is None else server.url,
        },
    )
    stop = threading.Event()
    signals = {"n": 0}

    def on_signal(signum: int, frame: Any) -> None:
        signals["n"] += 1
        if signals["n"] > 1:
            worker.hurry()  # a second signal: skip the rest of the grace period, release what runs
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    scheduled = [name for name, unit in app.units.items() if unit.schedule is not None]
    if scheduled and not args.quiet:
        print(
            f"foundry worker {worker.name}: runs the jobs of the schedules of {', '.join(scheduled)}; their "
            f"ticks are enqueued by `foundry run {args.app}` (any number of them: one job per tick)",
            flush=True,
        )
    if not args.quiet:
        plan = ", ".join(
            f"{loop.queue}x{loop.concurrency} (prefetch {loop.prefetch})" for loop in worker.loops
        )
        print(
            f"foundry worker {worker.name}: {plan} on {worker.backend.url}; "
            f"lease {lease:g}s, grace {grace:g}s" + (", burst" if args.burst else "") + "; "
            f"home {app.settings.home}, from {app.settings.source}",
            flush=True,
        )
    if server is not None and not args.quiet:
        watched = app.settings.watchdog
        loops = f"loop watchdog {watched * 1e3:.0f} ms" if watched is not None else "loop watchdog off"
        print(f"foundry worker {worker.name}: metrics on {server.url}/metrics ({loops})", flush=True)
    try:
        worker.run(until=stop)
    finally:
        worker.stop()
        beacon.stop()
        if server is not None:
            server.close()
        app.close()
    if not args.quiet:
        done = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "no jobs"
        print(f"foundry worker {worker.name}: stopped ({done})", flush=True)
    return 0
