"""``foundry schedules list [APP]``: each schedule with its next and last runs.

    foundry schedules list                  # the schedules recorded in the app's queue store
    foundry schedules list app.py           # the app's declared schedules, with their records
    foundry schedules list --url redis://127.0.0.1:6379/0 --json

The records live beside the jobs, in the queue's engine (``--url``, else
``FOUNDRY_QUEUE`` / ``foundry.toml`` / ``<project>/.foundry``; with ``APP``, the app's
queue): the watermark of each schedule, the last tick enqueued and its job. Without
``APP`` the next run is computed from the expression and zone the record holds. A
schedule whose due ticks are not enqueued says so: no ``foundry run`` is up to enqueue
them. stderr names the store it read; a SQLite store that does not exist yet is not
created.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

from foundry.cli._target import Problem, console, reports_problems

__all__ = ["add_parser"]

_SLACK = 5.0


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "schedules", help="schedules with their next and last runs (foundry schedules list)"
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    p = actions.add_parser(
        "list",
        help="each schedule: when, missed-tick policy, next run, last tick and its job",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("app", nargs="?", help="module[:app] or file.py that declares the schedules (optional)")
    p.add_argument("--url", help="queue URL (default: the app's, or FOUNDRY_QUEUE, foundry.toml, .foundry)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_list)

    def usage(args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(func=usage)


def _when(t: float | None, zone: Any, now: float) -> str:
    if t is None:
        return "-"
    local = dt.datetime.fromtimestamp(t, zone).strftime("%Y-%m-%d %H:%M:%S %Z")
    delta = t - now
    span = abs(delta)
    text = f"{span:.0f}s" if span < 120 else f"{span / 60:.0f}m" if span < 7200 else f"{span / 3600:.1f}h"
    if span >= 172800:
        text = f"{span / 86400:.1f}d"
    return f"{local} ({'in ' + text if delta >= 0 else text + ' ago'})"


def _rows(declared: dict[str, Any], records: dict[str, Any], now: float) -> list[dict[str, Any]]:
    from zoneinfo import ZoneInfo

    from foundry.errors import DeclarationError
    from foundry.schedules import Schedule

    rows = []
    for name in sorted(set(declared) | set(records)):
        schedule, record = declared.get(name), records.get(name)
        if schedule is None and record is not None:
            try:
                cron = not record.expression.lower().startswith("every")
                schedule = Schedule(name, record.expression, tz=record.tz if cron else None)
            except DeclarationError:
                schedule = None
        last = record.last_tick if record is not None and record.last_job else None
        nxt = schedule.next_after(now) if schedule is not None else None
        behind = 0
        if schedule is not None and record is not None:
            settled = now - _SLACK  # a tick that came due a moment ago may be on its way
            due = schedule.due(record.last_tick, settled, settled)
            behind = len(due.run) + due.skipped
        state = "declared" if name in declared else "recorded only (not declared in this app)"
        if name in declared and record is None:
            state = "declared, not seen by a scheduler yet"
        elif behind:
            state = f"{behind} due tick(s) not enqueued: is `foundry run` up?"
        source: Any = schedule if schedule is not None else record
        rows.append(
            {
                "unit": name,
                "schedule": source.expression,
                "tz": source.tz,
                "missed": schedule.policy if schedule is not None else "-",
                "next": nxt,
                "last": last,
                "last_job": record.last_job if last is not None and record is not None else None,
                "state": state,
                "zone": schedule.zone if schedule is not None else ZoneInfo("UTC"),
            }
        )
    return rows


@reports_problems("schedules")
def _list(args: argparse.Namespace) -> int:
    from foundry.cli._state import store

    declared: dict[str, Any] = {}
    app = None
    if args.app:
        from foundry.cli.workflows import load_app

        app = load_app(args.app)
        declared = {n: u.schedule for n, u in app.units.items() if u.schedule is not None}
    settings = app.settings if app is not None else None
    # a store not there yet holds no schedules: "no schedules", nothing created
    url, home = store("schedules list", "queue", args.url, settings=settings, must_exist=False)
    try:
        records = _records(url, home)
    finally:
        if app is not None:
            app.close()
    now = time.time()
    rows = _rows(declared, {r.name: r for r in records}, now)
    if args.json:
        print(json.dumps([{k: v for k, v in row.items() if k != "zone"} for row in rows], indent=2))
        return 0
    if not rows:
        print("no schedules (declare one with @app.work(schedule=...); `foundry run` records it)")
        return 0
    from rich.table import Table

    table = Table(title=f"schedules ({len(rows)})", title_justify="left")
    for col in ("unit", "schedule", "missed", "next run", "last tick", "last job", "state"):
        table.add_column(col, overflow="fold")
    for row in rows:
        when = (
            row["schedule"]
            if row["schedule"].lower().startswith("every")
            else f"{row['schedule']} ({row['tz']})"
        )
        table.add_row(
            row["unit"],
            when,
            row["missed"],
            _when(row["next"], row["zone"], now),
            _when(row["last"], row["zone"], now),
            row["last_job"] or "-",
            row["state"],
        )
    console().print(table)
    return 0


def _records(url: str, home: Path) -> list[Any]:
    """The schedule records at ``url``; none (and nothing created) for a SQLite file that
    does not exist yet."""
    from foundry.backends.queue.schedules import schedule_store
    from foundry.cli._backends import backend_at
    from foundry.config import sqlite_path

    if url.startswith("sqlite://") and not Path(sqlite_path(url)).is_file():
        return []
    if url.startswith("memory://"):
        raise Problem(f"queue {url!r} is private to one process: it holds no schedules another can read", 2)
    with backend_at("queue", url, home) as backend:
        return schedule_store(backend).records()
