"""`foundry dashboard`: a web page over one or more processes' exporters.

Each source's samples get an ``instance`` label, so a worker fleet reads as one page.
"""

from __future__ import annotations

import argparse
import threading
from typing import Any


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "dashboard", help="serve a web dashboard over the metrics of one or more processes"
    )
    parser.add_argument(
        "--url", action="append", help="an exporter to show (repeatable; default http://127.0.0.1:9464)"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8464)
    parser.set_defaults(func=run)


def merged_snapshot(urls: list[str]) -> dict[str, list[dict[str, Any]]]:
    from foundry.errors import BackendUnavailableError
    from foundry.observe.top import fetch_snapshot

    merged: dict[str, list[dict[str, Any]]] = {}
    for url in urls:
        instance = url.split("://", 1)[-1].rstrip("/")
        try:
            snap = fetch_snapshot(url, timeout=2.0)
        except BackendUnavailableError:
            merged.setdefault("foundry_exporter_up", []).append(
                {"labels": {"instance": instance}, "value": 0.0}
            )
            continue
        merged.setdefault("foundry_exporter_up", []).append({"labels": {"instance": instance}, "value": 1.0})
        for name, rows in snap.items():
            for row in rows:
                labels = (
                    {**row.get("labels", {}), "instance": instance}
                    if len(urls) > 1
                    else row.get("labels", {})
                )
                merged.setdefault(name, []).append({**row, "labels": labels})
    return merged


def run(args: argparse.Namespace) -> int:
    from foundry.observe.http import MetricsServer

    urls: list[str] = args.url or ["http://127.0.0.1:9464"]

    def prometheus() -> str:
        return "# the dashboard aggregates; scrape each process's own /metrics:\n" + "".join(
            f"# {url}/metrics\n" for url in urls
        )

    server = MetricsServer(lambda: merged_snapshot(urls), prometheus, args.host, args.port)
    print(f"Foundry dashboard on {server.url}/ over {', '.join(urls)} (Ctrl-C to stop)")
    try:
        threading.Event().wait()
    finally:
        server.close()
    return 0
