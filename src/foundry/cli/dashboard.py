"""``foundry dashboard [APP]``: the web dashboard — plan, charts, jobs, workflows,
streams and the fleet, with actions.

    foundry dashboard app.py                      # the app's plan and its engines
    foundry dashboard pkg.module:app --port 8464
    foundry dashboard --queue redis://... --journal postgresql://...   # engines only, no plan
    foundry dashboard app.py --url http://10.0.0.5:9464 --url ...     # plus exporters
    foundry dashboard app.py --host 0.0.0.0 --token "$(openssl rand -hex 24)"

``APP`` (``module``, ``module:app`` or ``file.py``) gives the plan and the engines (the
app's queue, stream and journal URLs); without it the engines come from ``FOUNDRY_*`` /
``foundry.toml`` / ``./.foundry``. Workers appear by themselves: ``foundry worker``,
``foundry workflows worker`` and ``foundry streams consume`` report to the fleet store
(``--fleet`` / ``FOUNDRY_FLEET``, else derived from the engines). Listening anywhere
but 127.0.0.1 needs ``--token``. See docs/dashboard.md.
"""

from __future__ import annotations

import argparse
import threading
from typing import Any

from foundry.cli._target import Problem, reports_problems
from foundry.config import safe_url

__all__ = ["add_parser", "merged_snapshot", "run"]


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "dashboard",
        help="web dashboard: plan with live figures, charts, jobs, workflows, streams, fleet",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "app", nargs="?", help="module, module:app or file.py (gives the plan and the engines)"
    )
    parser.add_argument(
        "--url",
        action="append",
        default=[],
        help="an exporter to include (repeatable), e.g. http://host:9464",
    )
    parser.add_argument("--queue", help="queue URL (default: the app's)")
    parser.add_argument("--stream", help="stream URL (default: the app's)")
    parser.add_argument("--journal", help="workflow journal URL (default: the app's)")
    parser.add_argument("--fleet", help="fleet store URL (default: FOUNDRY_FLEET, else derived)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    parser.add_argument("--port", type=int, default=8464, help="port (8464; 0 picks a free one)")
    parser.add_argument("--token", help="required on any address but loopback (or FOUNDRY_DASHBOARD_TOKEN)")
    parser.add_argument("--poll", type=float, default=2.0, help="seconds between page refreshes (>= 1)")
    parser.set_defaults(func=run)


def merged_snapshot(urls: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Several exporters' snapshots as one, each sample labelled with its ``instance``;
    ``foundry_exporter_up`` says which answered."""
    from foundry.errors import BackendUnavailableError
    from foundry.observe.top import fetch_snapshot

    merged: dict[str, list[dict[str, Any]]] = {}
    for url in urls:
        instance = safe_url(url).split("://", 1)[-1].rstrip("/")
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


@reports_problems("dashboard")
def run(args: argparse.Namespace) -> int:
    from foundry.observe.dashboard import serve_dashboard

    if not args.poll >= 1.0:
        raise Problem(f"--poll {args.poll}: at least 1 second. Fix: e.g. --poll 2", 2)
    app = None
    if args.app:
        from foundry.cli.workflows import load_app

        app = load_app(args.app)
    try:
        server = serve_dashboard(
            app,
            host=args.host,
            port=args.port,
            token=args.token,
            exporters=args.url,
            queue=args.queue,
            stream=args.stream,
            journal=args.journal,
            fleet=args.fleet,
            poll=args.poll,
        )
    except OSError as exc:
        raise Problem(
            f"cannot listen on {args.host}:{args.port} ({exc.strerror or exc}). Fix: pick another --port "
            "(0 picks a free one)"
        ) from exc
    print(server.describe() + " (Ctrl-C to stop)", flush=True)
    if server.token is not None:
        print(f"open {server.url}/?token=<your token> once; the page keeps a cookie", flush=True)
    try:
        threading.Event().wait()
    finally:
        server.close()
    return 0
