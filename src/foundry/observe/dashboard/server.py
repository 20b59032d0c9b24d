"""The dashboard's web server: the page, its static files and the API, standard library
only (``http.server``), one daemon thread per request.

Security model (docs/dashboard.md says the same):

* **Where it listens.** 127.0.0.1 by default. Any other address needs a token
  (``token=`` / ``--token`` / ``FOUNDRY_DASHBOARD_TOKEN``); without one the server
  refuses to start. With a token, every request must carry it: ``Authorization: Bearer
  <token>``, or the cookie set by opening ``/?token=<token>`` once (HttpOnly,
  SameSite=Strict).
* **Who may talk to it.** On a loopback address the ``Host`` header must name a
  loopback host (``127.0.0.1``, ``localhost``, ``[::1]``): a web page elsewhere cannot
  reach it through DNS rebinding.
* **Actions.** Only POST changes anything, and a POST must carry the page's CSRF token
  in ``X-Foundry-CSRF`` (a random value per server, embedded in the page, unreadable
  from another origin), have ``Content-Type: application/json`` and, when the browser
  sends an ``Origin``, come from this very origin. GET never changes state.
* **What the page shows.** Every value reaches the page as JSON and is inserted as
  text (``textContent``), never as markup; a Content-Security-Policy without
  ``unsafe-inline`` forbids any script but the dashboard's own file. Engine URLs are
  shown masked and every response is scrubbed of the configured passwords.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from foundry.config import safe_url
from foundry.errors import ConfigError
from foundry.observe.dashboard.api import Api
from foundry.observe.dashboard.sources import Sources

__all__ = ["DashboardServer", "is_loopback"]

MAX_BODY = 256 * 1024
_STATIC = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_COOKIE = "foundry_dashboard"


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _asset(name: str) -> bytes:
    return resources.files("foundry.observe.dashboard").joinpath("static", name).read_bytes()


class DashboardServer:
    """A running dashboard; ``url`` is where it listens, ``close()`` stops it."""

    def __init__(
        self,
        sources: Sources,
        host: str = "127.0.0.1",
        port: int = 8464,
        *,
        token: str | None = None,
        poll: float = 2.0,
        ttl: float = 1.0,
        api: Api | None = None,
    ) -> None:
        token = token if token is not None else (os.environ.get("FOUNDRY_DASHBOARD_TOKEN") or None)
        if not is_loopback(host) and not token:
            raise ConfigError(
                f"dashboard: refusing to listen on {host!r} without a token: anyone who reaches that "
                "address could retry, cancel and purge jobs. Fix: pass --token (or set "
                "FOUNDRY_DASHBOARD_TOKEN), or keep the default --host 127.0.0.1 and use an SSH tunnel"
            )
        if token is not None and len(token) < 16:
            raise ConfigError(
                "dashboard: the token is shorter than 16 characters. Fix: e.g. `openssl rand -hex 24`"
            )
        self.sources = sources
        self.api = api or Api(sources, ttl=ttl, poll=poll)
        self.token = token
        self.csrf = secrets.token_urlsafe(32)
        self._session = (
            None
            if token is None
            else hmac.new(token.encode(), b"foundry-dashboard", hashlib.sha256).hexdigest()
        )
        self.loopback_only = is_loopback(host)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "foundry-dashboard"
            sys_version = ""

            def do_GET(self) -> None:
                outer._serve(self, "GET")

            def do_POST(self) -> None:
                outer._serve(self, "POST")

            def do_PUT(self) -> None:
                self._method_not_allowed()

            def do_DELETE(self) -> None:
                self._method_not_allowed()

            def do_PATCH(self) -> None:
                self._method_not_allowed()

            def _method_not_allowed(self) -> None:
                outer._send(self, 405, b'{"error": "reads are GET, actions are POST"}', "application/json")

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.host, self.port = str(self._server.server_address[0]), int(self._server.server_address[1])
        shown = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{shown}:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="foundry-dashboard", daemon=True
        )
        self._thread.start()

    # -- security checks -----------------------------------------------------------------

    def _host_ok(self, handler: BaseHTTPRequestHandler) -> bool:
        if not self.loopback_only:
            return True
        host = handler.headers.get("Host", "")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return is_loopback(name.strip("[]")) or name.strip("[]") == "localhost"

    def _authorized(self, handler: BaseHTTPRequestHandler) -> bool:
        if self.token is None:
            return True
        auth = handler.headers.get("Authorization", "")
        if auth.startswith("Bearer ") and hmac.compare_digest(auth[7:].encode(), self.token.encode()):
            return True
        for part in handler.headers.get("Cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if (
                name == _COOKIE
                and self._session
                and hmac.compare_digest(value.encode(), self._session.encode())
            ):
                return True
        return False

    def _csrf_ok(self, handler: BaseHTTPRequestHandler) -> str | None:
        """``None`` when the POST may proceed, else why not."""
        sent = handler.headers.get("X-Foundry-CSRF", "")
        if not sent or not hmac.compare_digest(sent.encode(), self.csrf.encode()):
            return "missing or wrong X-Foundry-CSRF header: actions come from the dashboard page only"
        if handler.headers.get("Content-Type", "").split(";")[0].strip() != "application/json":
            return "actions must be sent as application/json"
        origin = handler.headers.get("Origin")
        if origin is not None:
            host = handler.headers.get("Host", "")
            if urlsplit(origin).netloc != host:
                return f"cross-origin action refused (Origin {origin!r})"
        return None

    # -- serving -------------------------------------------------------------------------

    def _send(
        self,
        handler: BaseHTTPRequestHandler,
        code: int,
        body: bytes,
        content_type: str,
        extra: dict[str, str] | None = None,
    ) -> None:
        handler.send_response(code)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.send_header("Cache-Control", "no-store")
        handler.send_header("Content-Security-Policy", _CSP)
        handler.send_header("X-Content-Type-Options", "nosniff")
        handler.send_header("X-Frame-Options", "DENY")
        handler.send_header("Referrer-Policy", "no-referrer")
        handler.send_header("Cross-Origin-Resource-Policy", "same-origin")
        for key, value in (extra or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(body)

    def _json(self, handler: BaseHTTPRequestHandler, code: int, payload: Any) -> None:
        text = json.dumps(payload, default=str, allow_nan=False, separators=(",", ":"))
        self._send(handler, code, self.sources.redact(text).encode(), "application/json; charset=utf-8")

    def _page(self) -> bytes:
        html = _asset("index.html").decode()
        return self.sources.redact(html.replace("{{csrf}}", self.csrf)).encode()

    def _serve(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        try:
            self._route(handler, method)
        except (BrokenPipeError, ConnectionResetError):
            return

    def _route(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        if not self._host_ok(handler):
            self._json(handler, 421, {"error": "this dashboard answers only to a loopback Host header"})
            return
        parts = urlsplit(handler.path)
        query = parse_qs(parts.query, keep_blank_values=True)
        path = parts.path
        if method == "GET" and path in ("/", "/index.html") and self.token is not None:
            given = (query.get("token") or [""])[0]
            if given and hmac.compare_digest(given.encode(), self.token.encode()):
                cookie = f"{_COOKIE}={self._session}; HttpOnly; SameSite=Strict; Path=/"
                self._send(handler, 303, b"", "text/plain", {"Location": "/", "Set-Cookie": cookie})
                return
        if not self._authorized(handler):
            self._json(handler, 401, {"error": "this dashboard needs its token: open /?token=<token> once"})
            return
        if method == "GET" and path in ("/", "/index.html"):
            self._send(handler, 200, self._page(), "text/html; charset=utf-8")
            return
        if method == "GET" and path.startswith("/static/"):
            name = path[len("/static/") :]
            if name in _STATIC:
                self._send(handler, 200, _asset(name), _STATIC[name])
            else:
                self._json(handler, 404, {"error": "no such file"})
            return
        if method == "GET" and path == "/healthz":
            self._send(handler, 200, b"ok\n", "text/plain")
            return
        body: Any = None
        if method == "POST":
            refused = self._csrf_ok(handler)
            if refused is not None:
                self._json(handler, 403, {"error": refused})
                return
            try:
                length = int(handler.headers.get("Content-Length", "0"))
            except ValueError:
                length = -1
            if length < 0 or length > MAX_BODY:
                self._json(handler, 413, {"error": f"the body must be 0..{MAX_BODY} bytes"})
                return
            raw = handler.rfile.read(length) if length else b"{}"
            try:
                body = json.loads(raw)
            except ValueError:
                self._json(handler, 400, {"error": "the body is not JSON"})
                return
        status, payload = self.api.handle(method, path, query, body)
        self._json(handler, status, payload)

    def describe(self) -> str:
        engines = ", ".join(f"{k} {v}" for k, v in self.sources.engines().items())
        return f"Foundry dashboard on {self.url}/ ({engines})" + (
            f"; exporters {', '.join(safe_url(u) for u in self.sources.exporters)}"
            if self.sources.exporters
            else ""
        )

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self.sources.close()

    def __enter__(self) -> DashboardServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
