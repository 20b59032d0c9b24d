"""``foundry dashboard``: the web page people open first — the plan with the live figures
each decision says to watch, charts, jobs, workflows, streams and the fleet, with the
actions each engine offers. See docs/dashboard.md.

    from foundry.observe.dashboard import serve_dashboard
    server = serve_dashboard(app, port=8464)      # server.url, server.close()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from foundry.observe.dashboard.server import DashboardServer
from foundry.observe.dashboard.sources import Sources

__all__ = ["DashboardServer", "Sources", "serve_dashboard"]


def serve_dashboard(
    app: Any = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8464,
    token: str | None = None,
    exporters: Sequence[str] = (),
    queue: str | None = None,
    stream: str | None = None,
    journal: str | None = None,
    fleet: str | None = None,
    poll: float = 2.0,
) -> DashboardServer:
    """Serve the dashboard of ``app`` (a ``Foundry``; ``None``: the engines configured by
    ``FOUNDRY_*`` / ``foundry.toml``) on ``host:port`` (port 0 picks a free one)."""
    sources = Sources(app, queue=queue, stream=stream, journal=journal, fleet=fleet, exporters=exporters)
    return DashboardServer(sources, host, port, token=token, poll=poll)
