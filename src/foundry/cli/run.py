"""``foundry run APP``: run everything the app declares, in one process.

    foundry run app.py                                  # every component the app declares
    foundry run pkg.module:app --queue emails=4 -c 8 --workflow-concurrency 16 --metrics-port 9464
    foundry run app.py --only queue,schedules           # some of it (the rest runs elsewhere)
    foundry run app.py --reload                         # development: restart on code changes

What it starts (``foundry.supervisor``), each the machinery of its own command:

  queue worker      the app's durable units' queues     (as ``foundry worker``)
  workflow worker   the app's workflows                 (as ``foundry workflows worker``)
  stream consumers  every declared consumer group       (as ``foundry streams consume``)
  pool server       the pool units, when the app's pool URL is local://served or nats://
                                                        (as ``foundry pool serve``)
  scheduler         the ticks of units declared with schedule=: one job per tick however
                    many ``foundry run`` processes are up (see docs/production.md)

All of it shares one metrics endpoint (``--metrics-port``) and one fleet heartbeat
(role ``supervisor``). SIGTERM or Ctrl-C drains all of it at once: the scheduler stops
enqueuing, the queue worker gives back jobs not started and gives running ones ``--grace``
to finish, workflows hand back at their next durable call, consumers finish the event in
hand and commit, pool workers finish their request. A second SIGTERM or Ctrl-C ends the
grace: running jobs go back for immediate redelivery, and it exits.

Exit status:
  0  stopped by SIGTERM/SIGINT, everything drained
  1  a component stopped by itself (a queue worker thread failed, a stream consumer died,
     the scheduler failed), or a store could not be reached at start: stderr names the
     component, the reason and the fix; the rest was drained
  2  bad command line, or an app that declares nothing ``foundry run`` runs

``--reload`` (development only) runs the app in a child process and restarts it when a
``.py`` or ``.toml`` file under the app's directory (or package) changes, polling their
modification times every half second (at most 5000 files).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import Any

from foundry.cli._target import Problem, reports_problems
from foundry.cli.worker import parse_queues
from foundry.errors import DeclarationError
from foundry.supervisor import KINDS
from foundry.traits import parse_duration

__all__ = ["add_parser", "child_argv"]

_KINDS = KINDS


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "run",
        help="run everything an app declares: queues, workflows, streams, pool, schedules",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("app", help="module, module:app, or file.py[:app]")
    parser.add_argument(
        "--only",
        metavar="KINDS",
        help=f"comma-separated components to run ({','.join(_KINDS)}; default: all)",
    )
    queue = parser.add_argument_group("queue worker")
    queue.add_argument(
        "--queue", "-Q", action="append", metavar="Q[=N]", help="a queue to serve, with its own concurrency"
    )
    queue.add_argument("--concurrency", "-c", type=int, default=8, help="jobs run at once per queue (8)")
    queue.add_argument(
        "--prefetch", type=int, help="jobs held per queue, running + waiting (2 x concurrency)"
    )
    queue.add_argument(
        "--lease", default="30s", help="lease per job or workflow, extended every lease/3 (30s)"
    )
    queue.add_argument("--backoff", default="1s", help="first retry delay for units that declare none (1s)")
    others = parser.add_argument_group("workflows, streams, pool")
    others.add_argument("--workflow-concurrency", type=int, default=8, help="workflows run at once (8)")
    others.add_argument("--consumers", type=int, default=1, help="consumers per stream group (1)")
    others.add_argument("--pool-min", type=int, help="fewest pool workers per unit (the unit's min_workers)")
    others.add_argument("--pool-max", type=int, help="most pool workers per unit (the unit's max_workers)")
    parser.add_argument("--grace", default="30s", help="time running work gets to finish on SIGTERM (30s)")
    parser.add_argument(
        "--metrics-port", type=int, help="serve /metrics and the dashboard on this port (0: a free one)"
    )
    parser.add_argument("--reload", action="store_true", help="restart on code changes (development)")
    parser.add_argument("--quiet", "-q", action="store_true", help="print only warnings")
    parser.set_defaults(func=run)


def _seconds(flag: str, value: str) -> float:
    try:
        return parse_duration(value, unit="foundry run", field_name=flag)
    except DeclarationError as exc:
        raise Problem(f"{flag} {value!r}: {exc.problem}. Fix: {exc.fix}", 2) from exc


def _only(value: str | None) -> list[str] | None:
    if value is None:
        return None
    kinds = [k.strip() for k in value.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in _KINDS]
    if unknown or not kinds:
        raise Problem(
            f"--only {value!r}: {', '.join(unknown) or 'nothing'} is not a component. "
            f"Fix: a comma-separated list of {', '.join(_KINDS)}",
            2,
        )
    return kinds


def child_argv(args: argparse.Namespace) -> list[str]:
    """The command line of ``args`` without ``--reload``: what the reloader's child runs."""
    argv = [args.app]
    for value in args.queue or []:
        argv += ["--queue", value]
    flags = (
        ("--only", "only"),
        ("--concurrency", "concurrency"),
        ("--prefetch", "prefetch"),
        ("--lease", "lease"),
        ("--backoff", "backoff"),
        ("--workflow-concurrency", "workflow_concurrency"),
        ("--consumers", "consumers"),
        ("--pool-min", "pool_min"),
        ("--pool-max", "pool_max"),
        ("--grace", "grace"),
        ("--metrics-port", "metrics_port"),
    )
    for flag, attr in flags:
        value = getattr(args, attr)
        if value is not None:
            argv += [flag, str(value)]
    if args.quiet:
        argv.append("--quiet")
    return argv


@reports_problems("run")
def run(args: argparse.Namespace) -> int:
    only = _only(args.only)
    for flag, value, low in (
        ("--concurrency", args.concurrency, 1),
        ("--prefetch", args.prefetch, 1),
        ("--workflow-concurrency", args.workflow_concurrency, 1),
        ("--consumers", args.consumers, 1),
        ("--pool-min", args.pool_min, 0),
        ("--pool-max", args.pool_max, 1),
    ):
        if value is not None and value < low:
            raise Problem(f"{flag} {value} is too small. Fix: {flag} {max(low, 1)} or more", 2)
    lease, grace, backoff = (
        _seconds(f, v)
        for f, v in (("--lease", args.lease), ("--grace", args.grace), ("--backoff", args.backoff))
    )
    if lease <= 0:
        raise Problem("--lease must be positive. Fix: e.g. --lease 30s", 2)
    queues = parse_queues(args.queue, args.concurrency)
    if args.reload:
        from foundry.cli._reload import reload

        return reload(child_argv(args), args.app, grace=grace, quiet=args.quiet)

    from foundry.cli.workflows import load_app
    from foundry.observe.fleet import fleet_beacon
    from foundry.supervisor import Options, Supervisor, describe_app

    app = load_app(args.app)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )

    def say(text: str) -> None:
        if not args.quiet:
            print(f"foundry run: {text}", flush=True)

    options = Options(
        queues=queues,
        concurrency=args.concurrency,
        prefetch=args.prefetch,
        lease=lease,
        grace=grace,
        backoff=backoff,
        workflow_concurrency=args.workflow_concurrency,
        consumers=args.consumers,
        pool_min=args.pool_min,
        pool_max=args.pool_max,
    )
    supervisor = Supervisor(app, options, only=only)
    if not supervisor.components:
        supervisor.stop(0.0)
        what = f" of {', '.join(only)}" if only else ""
        raise Problem(
            f"app {app.name!r} declares nothing{what} that `foundry run` runs (it declares: "
            f"{describe_app(app)}){''.join('; ' + note for note in supervisor.notes)}. Fix: declare durable "
            "units (durable=True), workflows, stream consumers or schedules"
            + (", or widen --only" if only else ""),
            2,
        )
    stop = threading.Event()
    signals = {"n": 0}

    def on_signal(signum: int, frame: Any) -> None:
        signals["n"] += 1
        if signals["n"] > 1:
            supervisor.hurry()  # a second signal: skip the rest of the grace period
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = None
    beacon = None
    failure = None
    try:
        supervisor.start()
        server = app.serve_metrics(port=args.metrics_port) if args.metrics_port is not None else None

        def details() -> dict[str, Any]:
            return {**supervisor.details(), "exporter": None if server is None else server.url}

        beacon = fleet_beacon(app, "supervisor", details)
        for line in supervisor.describe():
            say(line)
        for note in supervisor.notes:
            say(note)
        say(f"home {app.settings.home}, from {app.settings.source}; grace {grace:g}s, lease {lease:g}s")
        if server is not None:
            watched = app.settings.watchdog
            loops = f"loop watchdog {watched * 1e3:.0f} ms" if watched is not None else "loop watchdog off"
            say(f"metrics on {server.url}/metrics ({loops})")
        failure = supervisor.watch(stop)
        if failure is not None:
            fix = "" if "Fix:" in failure.reason else " Fix: see its traceback in the log above, then restart"
            print(
                f"foundry run: error: the {failure.component} stopped by itself: {failure.reason}.{fix}; "
                "draining the rest, exit status 1",
                file=sys.stderr,
                flush=True,
            )
    finally:
        supervisor.stop()
        if beacon is not None:
            beacon.stop()
        if server is not None:
            server.close()
        app.close()
    say(f"stopped ({supervisor.summary() or 'nothing ran'})")
    return 1 if failure is not None else 0
