"""What the dashboard reads: the app (its plan), the engines (its settings), the fleet
and any exporters named on the command line.

``foundry dashboard app:app`` gives all of them: the app's decisions, its queue,
stream and journal URLs (``Foundry(queue=...)``, ``FOUNDRY_*``, ``foundry.toml``,
``./.foundry``), and the fleet store those settings imply (:func:`fleet_url`). Without
an app the engines come from the environment and the plan is empty. Each engine is
opened on first use, one connection each, and used by one request at a time.

Secrets: every URL is shown through :func:`~foundry.config.safe_url`, and every response
the server sends passes :meth:`Sources.redact`, which removes the password, token and
secret options of every configured URL wherever they appear — defence in depth for
an engine error message that quoted its URL.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from foundry.config import Settings, load_settings, safe_url
from foundry.observe.fleet import FleetStore, fleet_url, open_fleet

__all__ = ["Sources", "secrets_of"]

_SECRET_WORDS = ("password", "secret", "token")


def secrets_of(url: str) -> set[str]:
    """The secret substrings of ``url``: passwords (raw and decoded), a NATS token,
    secret query options, recursively for URLs inside options (``state=…``)."""
    found: set[str] = set()
    try:
        parts = urlsplit(url)
    except ValueError:
        return found
    netloc = parts.netloc
    for userinfo in (chunk.rsplit("@", 1)[0] for chunk in netloc.split(",") if "@" in chunk):
        user, colon, password = userinfo.partition(":")
        secret = password if colon else (user if parts.scheme.lower() in ("nats", "tls") else "")
        if secret:
            found.update({secret, unquote(secret)})
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if any(word in name.lower() for word in _SECRET_WORDS) and value:
            found.update({value, unquote(value)})
        if "://" in value:
            found |= secrets_of(value)
    return {s for s in found if len(s) >= 3}


class Sources:
    """The app, the engines, the fleet and the exporters of one dashboard."""

    def __init__(
        self,
        app: Any = None,
        *,
        settings: Settings | None = None,
        queue: str | None = None,
        stream: str | None = None,
        journal: str | None = None,
        fleet: str | None = None,
        exporters: Sequence[str] = (),
    ) -> None:
        self.app = app
        base = settings or (app.settings if app is not None else load_settings())
        self.settings = Settings(
            home=base.home,
            queue=queue or base.queue,
            stream=stream or base.stream,
            journal=journal or base.journal,
        )
        self.fleet_url = fleet_url(self.settings, fleet)
        self.exporters = [u.rstrip("/") for u in exporters]
        self._open: dict[str, Any] = {}
        self._locks = {name: threading.Lock() for name in ("queue", "stream", "journal", "fleet")}
        self._secrets: set[str] = set()
        for url in (*self.urls().values(), *self.exporters):
            self._secrets |= secrets_of(url)

    @property
    def app_name(self) -> str:
        return str(getattr(self.app, "name", "")) if self.app is not None else ""

    def urls(self) -> dict[str, str]:
        return {
            "queue": self.settings.queue,
            "stream": self.settings.stream,
            "journal": self.settings.journal,
            "fleet": self.fleet_url,
        }

    def engines(self) -> dict[str, str]:
        """Every engine URL as the page may show it (passwords masked)."""
        return {name: self.redact(safe_url(url)) for name, url in self.urls().items()}

    def redact(self, text: str) -> str:
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return text

    def _opener(self, name: str) -> Any:
        url = self.urls()[name]
        if name == "queue":
            from foundry.backends.queue import open_queue_backend

            return open_queue_backend(url)
        if name == "stream":
            from foundry.backends.stream import open_stream_backend

            return open_stream_backend(url)
        if name == "journal":
            from foundry.backends.journal import open_journal

            return open_journal(url)
        store: FleetStore = open_fleet(url)
        return store

    @contextlib.contextmanager
    def using(self, name: str) -> Iterator[Any]:
        """The engine ``name`` ("queue", "stream", "journal", "fleet"), opened on first
        use and held by one caller at a time. A failure to open is raised (and retried
        by the next caller)."""
        with self._locks[name]:
            backend = self._open.get(name)
            if backend is None:
                backend = self._opener(name)
                self._open[name] = backend
            yield backend

    def close(self) -> None:
        for name, lock in self._locks.items():
            with lock:
                backend = self._open.pop(name, None)
            if backend is not None:
                with contextlib.suppress(Exception):
                    backend.close()
