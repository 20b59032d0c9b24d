"""``foundry pool serve APP``: run this host's workers for an app's ``pool`` units.

    foundry pool serve myapp:app                                     # this machine (local://)
    foundry pool serve myapp:app --url nats://10.0.0.5:4222          # every pool unit of the app
    foundry pool serve myapp:app --unit sign --min 2 --max 16 --metrics-port 9464

On ``local://`` (the embedded default) it serves each unit on a Unix socket under the
app's home (FOUNDRY_HOME), for apps on this machine whose pool URL is ``local://served``.
On NATS, start it on as many hosts as you like: each host subscribes to its unit's
subject while a worker is free, so the first free worker on any host answers. The URL is
the app's pool URL (``Foundry(pool=...)``, ``FOUNDRY_POOL``, ``foundry.toml``) unless
``--url`` names another. Between ``--min`` and ``--max`` workers (default: the unit's
``min_workers``/``max_workers``) each unit's pool sizes itself to hold its ``latency=``
target. SIGTERM or Ctrl-C drains: every worker finishes the request it runs (within
``--grace``) and takes no other; a second signal skips the grace.

Like every long-running Foundry process it beats into the fleet (``foundry.observe.fleet``:
role ``pool-server``, its host, pid and start time, the units it serves and their
workers), so the dashboard lists it, and shows it down within seconds when it dies.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from typing import Any

from foundry.cli._target import Problem, reports_problems
from foundry.errors import DeclarationError
from foundry.traits import parse_duration

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "pool",
        help="serve an app's work-pool units from this host (foundry pool serve)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="pool_command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="run this host's workers for the app's pool units",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("app", help="module, module:app, or file.py[:app]")
    serve.add_argument("--url", help="pool URL (default: the app's), e.g. nats://127.0.0.1:4222")
    serve.add_argument("--unit", action="append", metavar="NAME", help="serve only this unit (repeatable)")
    serve.add_argument("--min", type=int, dest="minimum", help="fewest workers per unit")
    serve.add_argument("--max", type=int, dest="maximum", help="most workers per unit")
    serve.add_argument("--grace", default="30s", help="time running requests get to finish on SIGTERM (30s)")
    serve.add_argument("--metrics-port", type=int, help="serve /metrics and the dashboard on this port")
    serve.add_argument("--quiet", "-q", action="store_true", help="print only warnings")
    serve.set_defaults(func=run)

    def usage(args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(func=usage)


@reports_problems("pool")
def run(args: argparse.Namespace) -> int:
    from foundry.cli.workflows import load_app
    from foundry.config import safe_url
    from foundry.deliver.pool.serve import PoolServer
    from foundry.observe.fleet import fleet_beacon

    try:
        grace = parse_duration(args.grace, unit="foundry pool serve", field_name="--grace")
    except DeclarationError as exc:
        raise Problem(f"--grace {args.grace!r}: {exc.problem}. Fix: {exc.fix}", 2) from exc
    for flag, value in (("--min", args.minimum), ("--max", args.maximum)):
        if value is not None and value < (0 if flag == "--min" else 1):
            raise Problem(f"{flag} {value} is too small. Fix: e.g. {flag} 2", 2)
    app = load_app(args.app)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    pooled = [name for name, unit in app.units.items() if unit.decision.delivery == "pool"]
    wanted = args.unit or pooled
    unknown = [name for name in wanted if name not in pooled]
    if unknown or not wanted:
        listing = ", ".join(pooled) or "none"
        raise Problem(
            f"{', '.join(unknown) or 'the app'}: not a pool unit of {app.name!r} (pool units: {listing}). "
            "Fix: declare it with latency= and idempotent=True, or model='pool'"
        )
    url = args.url or app.settings.pool
    server = PoolServer(
        url, [app.spec(name) for name in wanted], app.context(), minimum=args.minimum, maximum=args.maximum
    )
    metrics = app.serve_metrics(port=args.metrics_port) if args.metrics_port is not None else None

    def details() -> dict[str, Any]:
        rows = server.status()
        return {
            "pool": [row["unit"] for row in rows],
            "url": safe_url(url),
            "workers": {row["unit"]: {"live": row["live"], "busy": row["busy"]} for row in rows},
            "exporter": None if metrics is None else metrics.url,
        }

    beacon = fleet_beacon(app, "pool-server", details)
    stop = threading.Event()
    signals = {"n": 0}

    def on_signal(signum: int, frame: Any) -> None:
        signals["n"] += 1
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if not args.quiet:
        for row in server.status():
            low, high = row["bounds"]
            print(
                f"foundry pool serve: {row['unit']} on {row['where']} with {low}..{high} workers", flush=True
            )
    try:
        while not stop.wait(0.5):
            pass
    finally:
        served = ", ".join(f"{row['unit']} {row['served']}" for row in server.status())
        server.close(timeout=0.0 if signals["n"] > 1 else grace)
        beacon.stop()
        if metrics is not None:
            metrics.close()
        app.close()
    if not args.quiet:
        print(f"foundry pool serve: stopped (served {served})", flush=True)
    return 0
