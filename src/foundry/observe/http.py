"""Expose a registry over HTTP: ``/metrics`` (Prometheus text), ``/metrics.json``
(the snapshot), ``/`` (the dashboard page), ``/healthz``.

Standard library only (``http.server``), one daemon thread, bound to 127.0.0.1 unless
told otherwise. The server never writes secrets: it serves metric names and labels,
which are unit, queue, stage and group names chosen by the app.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from foundry.observe.metrics import Registry

__all__ = ["MetricsServer", "serve_metrics"]

Snapshot = Callable[[], dict[str, Any]]
Text = Callable[[], str]


def _dashboard_html() -> bytes:
    return resources.files("foundry.observe").joinpath("dashboard.html").read_bytes()


class MetricsServer:
    """A running exporter; ``close()`` stops it. ``url`` is where it listens."""

    def __init__(self, snapshot: Snapshot, prometheus: Text, host: str = "127.0.0.1", port: int = 0) -> None:
        started = time.time()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, prometheus().encode(), "text/plain; version=0.0.4; charset=utf-8")
                elif path == "/metrics.json":
                    body = {"time": time.time(), "started": started, "metrics": snapshot()}
                    self._send(200, json.dumps(body).encode(), "application/json")
                elif path in ("/", "/index.html"):
                    self._send(200, _dashboard_html(), "text/html; charset=utf-8")
                elif path == "/healthz":
                    self._send(200, b"ok\n", "text/plain")
                else:
                    self._send(404, b"not found: try /metrics, /metrics.json or /\n", "text/plain")

            def _send(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return  # quiet: scrapes every few seconds would flood the worker's log

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.host, self.port = str(self._server.server_address[0]), int(self._server.server_address[1])
        self.url = f"http://{self.host}:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="foundry-metrics", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_metrics(registry: Registry, host: str = "127.0.0.1", port: int = 0) -> MetricsServer:
    """Serve ``registry`` on ``host:port`` (port 0 picks a free one; see ``.url``)."""
    return MetricsServer(registry.snapshot, registry.prometheus, host, port)
