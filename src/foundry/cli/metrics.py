"""`foundry metrics`: print a process's metrics once, as Prometheus text or JSON."""

from __future__ import annotations

import argparse
import json
import urllib.request
from typing import Any

from foundry.errors import BackendUnavailableError


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser("metrics", help="print a process's metrics once")
    parser.add_argument("--url", default="http://127.0.0.1:9464", help="the process's metrics exporter")
    parser.add_argument("--json", action="store_true", help="the JSON snapshot instead of Prometheus text")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from foundry.observe.top import fetch_snapshot

    if args.json:
        print(json.dumps(fetch_snapshot(args.url), indent=2, sort_keys=True))
        return 0
    target = args.url.rstrip("/") + "/metrics"
    try:
        with urllib.request.urlopen(target, timeout=5) as response:
            print(response.read().decode(), end="")
    except OSError as exc:
        from foundry.config import safe_url

        raise BackendUnavailableError(f"cannot read {safe_url(target)}: {exc}") from exc
    return 0
