"""``foundry streams``: look into event streams and move consumer groups, from any machine
that reaches the log.

    foundry streams list                         streams, partitions, events, groups
    foundry streams lag [STREAM] [--group G]     per group and partition: committed, end, lag
    foundry streams replay STREAM GROUP --offset N | --time T | --beginning | --end
    foundry streams dead STREAM [--group G] [--limit 20] [--payload]
    foundry streams consume APP [--stream S] [--group G] [--consumers N]

Reads the log only (``--url URL``, else ``FOUNDRY_STREAM`` / ``foundry.toml`` /
``<project>/.foundry/stream.db``), so every command but ``consume`` needs none of the
application's code. ``consume`` runs an app's consumer groups until SIGINT/SIGTERM, or
until one of its consumers dies (exit status 1, for a supervisor to restart it; the
dead consumer's partitions went to the group's other members meanwhile).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import signal
import threading
import time
from contextlib import AbstractContextManager
from typing import Any

from foundry.cli._state import shared_options
from foundry.cli._target import Problem, console, reports_problems

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "streams", help="event streams: lag per group and partition, replay, dead letters, consumers"
    )
    common = shared_options(  # consume takes neither: it runs the app's consumers on its own stream
        parser,
        (("--url",), {"help": "stream URL (default: FOUNDRY_STREAM, foundry.toml, <project>/.foundry)"}),
        (("--json",), {"action": "store_true", "help": "print JSON"}),
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    p = actions.add_parser("list", parents=[common], help="streams with partitions, retained events, groups")
    p.set_defaults(func=_list)
    p = actions.add_parser(
        "lag", parents=[common], help="committed offset, end and lag per group and partition"
    )
    p.add_argument("stream", nargs="?", help="one stream (default: all)")
    p.add_argument("--group", action="append", help="only these groups")
    p.set_defaults(func=_lag)
    p = actions.add_parser("replay", parents=[common], help="move a group to an offset or a time")
    p.add_argument("stream")
    p.add_argument("group")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--offset", type=int, help="the first offset to deliver again (every partition)")
    where.add_argument("--time", help="unix seconds, ISO 8601, or a duration ago (30m)")
    where.add_argument("--beginning", action="store_true", help="the first retained event")
    where.add_argument("--end", action="store_true", help="skip everything published so far")
    p.add_argument("--partition", type=int, action="append", help="only these partitions")
    p.set_defaults(func=_replay)
    p = actions.add_parser("dead", parents=[common], help="dead letters with their reasons, oldest first")
    p.add_argument("stream")
    p.add_argument("--group")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--payload", action="store_true", help="show the events too")
    p.set_defaults(func=_dead)
    p = actions.add_parser("consume", help="run an app's consumer groups until interrupted")
    p.add_argument("app", help="module[:app] or file.py that declares the streams")
    p.add_argument("--stream", action="append", help="only these streams (default: all declared)")
    p.add_argument("--group", action="append", help="only these groups (default: all declared)")
    p.add_argument("--consumers", type=int, default=1, help="consumers per group in this process")
    p.set_defaults(func=_consume)

    def usage(args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(func=usage)


def _opened(args: argparse.Namespace) -> AbstractContextManager[Any]:
    """The stream store the action reads."""
    from foundry.cli._backends import open_store

    return open_store(f"streams {args.action}", "stream", args.url)


def _limit(name: str, value: float) -> str:
    if name == "max_age":
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
            if value >= size and value % size == 0:
                return f"max_age={int(value // size)}{unit}"
        return f"max_age={value:g}s"
    return f"{name}={int(value)}"


def _when(t: float) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


@reports_problems("streams")
def _list(args: argparse.Namespace) -> int:
    from rich.table import Table

    with _opened(args) as backend:
        shown = backend.url  # masked
        rows = []
        for name in backend.streams():
            info = backend.info(name)
            c = info.config
            rows.append(
                {
                    "stream": name,
                    "partitions": c.partitions,
                    "events": info.events,
                    "first": list(info.first),
                    "last": list(info.last),
                    "groups": list(info.groups),
                    "retention": {"max_age": c.max_age, "max_events": c.max_events, "max_bytes": c.max_bytes},
                    "dedup_window": c.dedup_window,
                }
            )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table(title=f"streams at {shown}")
    for column in ("stream", "partitions", "retained events", "offsets", "groups", "retention"):
        table.add_column(
            column,
            justify="right" if column in ("partitions", "retained events") else "left",
            overflow="fold",
        )
    for r in rows:
        offsets = " ".join(
            f"{f}..{last}" if last >= f else "-" for f, last in zip(r["first"], r["last"], strict=True)
        )
        limits = ", ".join(_limit(k, v) for k, v in r["retention"].items() if v is not None) or "forever"
        table.add_row(
            r["stream"],
            str(r["partitions"]),
            str(r["events"]),
            offsets,
            ", ".join(r["groups"]) or "-",
            limits,
        )
    console().print(table if rows else "[dim]no streams[/dim]")
    return 0


@reports_problems("streams")
def _lag(args: argparse.Namespace) -> int:
    from rich.table import Table

    with _opened(args) as backend:
        rows = []
        for name in [args.stream] if args.stream else backend.streams():
            groups = backend.groups(name)
            for group in args.group or groups:
                for part in backend.lag(name, group):
                    rows.append(
                        {
                            "stream": name,
                            "group": group,
                            "partition": part.partition,
                            "committed": part.committed,
                            "end": part.end,
                            "first": part.first,
                            "pending": part.pending,
                            "lag": part.lag,
                        }
                    )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table(title="consumer lag (events after the committed offset)")
    for column in ("stream", "group", "partition", "committed", "end", "pending", "lag"):
        table.add_column(
            column, justify="left" if column in ("stream", "group") else "right", overflow="fold"
        )
    for r in rows:
        lag = r["lag"]
        style = "green" if lag == 0 else ("yellow" if lag < 1000 else "red")
        behind = " (behind retention)" if r["committed"] < r["first"] - 1 else ""
        table.add_row(
            r["stream"],
            r["group"],
            str(r["partition"]),
            str(r["committed"]),
            str(r["end"]),
            str(r["pending"]),
            f"[{style}]{lag}[/{style}]{behind}",
        )
    console().print(table if rows else "[dim]no consumer groups[/dim]")
    return 0


def parse_time(text: str) -> float:
    """Unix seconds, an ISO 8601 time, or a duration meaning "that long ago"."""
    from foundry.errors import DeclarationError
    from foundry.traits import parse_duration

    try:
        return float(text)
    except ValueError:
        pass
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        pass
    try:
        return time.time() - parse_duration(text, unit="streams replay", field_name="--time")
    except DeclarationError:
        raise Problem(
            f"--time {text!r} is not a time. Fix: unix seconds (1700000000), ISO 8601 "
            "(2026-01-31T12:00:00) or a duration ago (30m, 2h)",
            2,
        ) from None


@reports_problems("streams")
def _replay(args: argparse.Namespace) -> int:
    from foundry.backends.stream import Start

    if args.offset is not None:
        start = Start.at(args.offset)
    elif args.time is not None:
        start = Start.since(parse_time(args.time))
    elif args.beginning:
        start = Start.beginning()
    else:
        start = Start.end()
    with _opened(args) as backend:
        before = {p.partition: p for p in backend.lag(args.stream, args.group)}
        backend.seek(args.stream, args.group, start, args.partition)
        after = backend.lag(args.stream, args.group)
    moved = [p for p in after if args.partition is None or p.partition in args.partition]
    if args.json:
        print(json.dumps([{"partition": p.partition, "committed": p.committed, "lag": p.lag} for p in moved]))
        return 0
    for p in moved:
        console().print(
            f"{args.stream}/{args.group} partition {p.partition}: committed "
            f"{before[p.partition].committed} → {p.committed}; {p.lag} events to (re)deliver"
        )
    console().print(
        "[dim]running consumers of the group finish the batch they hold, then continue from here[/dim]"
    )
    return 0


@reports_problems("streams")
def _dead(args: argparse.Namespace) -> int:
    from rich.table import Table

    with _opened(args) as backend:
        letters = backend.dead_letters(args.stream, args.group, args.limit)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "group": d.group,
                        "partition": d.partition,
                        "offset": d.offset,
                        "last_offset": d.last_offset,
                        "id": d.id,
                        "key": d.key,
                        "reason": d.reason,
                        "deliveries": d.deliveries,
                        "dead_at": d.dead_at,
                        "payload": None if d.payload is None else d.payload.decode(errors="replace"),
                        "error": None if d.error is None else json.loads(d.error),
                    }
                    for d in letters
                ],
                indent=2,
            )
        )
        return 0
    table = Table(title=f"dead letters of {args.stream}" + (f" group {args.group}" if args.group else ""))
    for column in ("when", "group", "where", "event", "deliveries", "reason"):
        table.add_column(column, overflow="fold")
    if args.payload:
        table.add_column("event data", overflow="fold")
    for d in letters:
        where = f"p{d.partition}@{d.offset}" + (f"..{d.last_offset}" if d.last_offset is not None else "")
        row = [
            _when(d.dead_at),
            d.group,
            where,
            d.id or "-",
            str(d.deliveries),
            f"[magenta]{d.reason}[/magenta]",
        ]
        if args.payload:
            row.append("-" if d.payload is None else d.payload.decode(errors="replace")[:200])
        table.add_row(*row)
    console().print(table if letters else "[green]no dead letters[/green]")
    return 0


@reports_problems("streams")
def _consume(args: argparse.Namespace) -> int:
    import logging

    from foundry.cli.workflows import load_app

    if args.url or args.json:  # given before the action: `foundry streams --url U consume APP`
        raise Problem(
            "consume runs the app's consumers on the app's own stream and prints no JSON, so it takes "
            "neither --url nor --json. Fix: set the stream with FOUNDRY_STREAM or in foundry.toml",
            2,
        )
    app = load_app(args.app)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    streams = [app.streams[n] for n in args.stream] if args.stream else list(app.streams.values())
    if not streams:
        raise Problem(f"{args.app!r} declares no streams. Fix: declare one with app.stream(...)")
    missing = [n for n in args.stream or [] if n not in app.streams]
    if missing:
        raise Problem(f"no stream {missing[0]!r} in {args.app!r}. Known: {', '.join(app.streams)}")
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    from foundry.cli._state import announce

    announce("streams consume", app.settings.describe("stream"))
    running = []
    try:
        for decl in streams:
            groups = [g for g in decl.groups if not args.group or g in args.group]
            if groups:
                running.append(decl.run(groups, consumers=args.consumers))
                console().print(f"consuming {decl.name}: groups {', '.join(groups)} × {args.consumers}")
        if not running:
            raise Problem(f"none of the groups {args.group} are declared. Fix: check --group")
        from foundry.observe.fleet import fleet_beacon

        def owned() -> dict[str, Any]:
            return {
                "streams": [
                    {
                        "stream": c.runtime.name,
                        "group": m.group,
                        "consumer": m.name,
                        "owned": sorted(m.owned),
                    }
                    for c in running
                    for m in c.members
                ]
            }

        beacon = fleet_beacon(app, "stream-consumer", owned)
        try:
            while not stop.wait(0.5):
                failures = [f for consumers in running for f in consumers.failures]
                if failures:
                    # A dead consumer already left its group (others take its partitions);
                    # this process is not what it was started as: stop and say so.
                    name, error = failures[0]
                    console().print(
                        f"[red]consumer {name} died: {type(error).__name__}: {error}[/red] "
                        f"({len(failures)} failed; traceback in the log). Stopping with exit status 1"
                    )
                    return 1
        finally:
            beacon.stop()
    finally:
        for consumers in running:
            consumers.stop()
        app.close()
    return 0
