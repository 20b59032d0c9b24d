"""`foundry top`: a live terminal view of a Foundry process's metrics."""

from __future__ import annotations

import argparse
import time
from typing import Any

from foundry.traits import parse_duration


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "top", help="live view of a running process's metrics (loop lag, queue age, exits ...)"
    )
    parser.add_argument("--url", default="http://127.0.0.1:9464", help="the process's metrics exporter")
    parser.add_argument("--interval", default="1s", help="refresh interval (default 1s)")
    parser.add_argument("--once", action="store_true", help="print one snapshot and exit")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from foundry.observe.top import fetch_snapshot, render_snapshot

    console = Console()
    interval = parse_duration(args.interval, unit="foundry top", field_name="--interval")
    if args.once or not console.is_terminal:
        console.print(render_snapshot(fetch_snapshot(args.url)))
        return 0
    with Live(render_snapshot(fetch_snapshot(args.url)), console=console, screen=False) as live:
        while True:
            time.sleep(interval)
            live.update(render_snapshot(fetch_snapshot(args.url)))
