"""What the cluster engines share: their URL's options, the adapter that turns a
driver's future into a :class:`~foundry.backends.cluster.base.ChunkCall`, the errors'
wording, and a quick reachability check.

URL options (query string), the same on every engine:

=====================  ==========================================================
``connect_timeout=10``  seconds to reach the cluster (and, on Dask, to see a worker)
=====================  ==========================================================
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from foundry.config import safe_url
from foundry.errors import ClusterError, ClusterUnavailableError, ConfigError
from foundry.handle import Outcome

__all__ = ["CallbackCall", "ClusterURL", "parse_url", "probe", "unavailable"]

log = logging.getLogger("foundry.cluster")

DEFAULT_CONNECT_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class ClusterURL:
    """A cluster URL taken apart: ``scheme://netloc?options``."""

    scheme: str
    netloc: str
    host: str
    port: int | None
    safe: str
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    options: dict[str, str] = field(default_factory=dict)


def parse_url(url: str, known: tuple[str, ...] = ()) -> ClusterURL:
    """Split ``url``; an unknown or malformed option is a :class:`ConfigError`."""
    parts = urlsplit(url)
    safe = safe_url(url)
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    allowed = ("connect_timeout", *known)
    for name in options:
        if name not in allowed:
            raise ConfigError(
                f"cluster URL {safe!r}: unknown option {name!r}. Fix: use one of {', '.join(allowed)}"
            )
    timeout = DEFAULT_CONNECT_TIMEOUT
    if "connect_timeout" in options:
        try:
            timeout = float(options.pop("connect_timeout"))
        except ValueError:
            timeout = -1.0
        if not timeout > 0:
            raise ConfigError(
                f"cluster URL {safe!r}: connect_timeout must be a number of seconds > 0. "
                "Fix: e.g. ?connect_timeout=10"
            )
    try:
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"cluster URL {safe!r}: {exc}. Fix: host:port, e.g. tcp://10.0.0.5:8786") from exc
    return ClusterURL(parts.scheme.lower(), parts.netloc, parts.hostname or "", port, safe, timeout, options)


def unavailable(kind: str, safe: str, detail: str, fix: str) -> ClusterUnavailableError:
    return ClusterUnavailableError(f"{kind} cluster at {safe!r} is not available: {detail}. Fix: {fix}")


def probe(kind: str, where: ClusterURL, fix: str) -> None:
    """Fail fast, with the fix, when nothing listens at the URL's host and port (a
    driver would retry for tens of seconds before saying the same)."""
    if where.port is None:
        return
    try:
        with socket.create_connection((where.host, where.port), timeout=where.connect_timeout):
            return
    except OSError as exc:
        raise unavailable(kind, where.safe, f"cannot connect ({exc})", fix) from exc


class CallbackCall:
    """A :class:`~foundry.backends.cluster.base.ChunkCall` settled by the driver's
    done-callback: :meth:`settle` is called once (later calls are ignored) with a
    function that returns the value or raises the driver's error, which ``translate``
    turns into a Foundry error. Callbacks run outside the lock, once each."""

    __slots__ = ("_callbacks", "_cancel", "_keep", "_lock", "_outcome", "_translate")

    def __init__(
        self,
        translate: Callable[[BaseException], BaseException],
        cancel: Callable[[], None],
    ) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] | None = []
        self._outcome = Outcome()
        self._translate = translate
        self._cancel = cancel
        self._keep: Any = None  # the driver's future: released by some drivers when collected

    def keep(self, future: Any) -> None:
        self._keep = future

    def settle(self, get: Callable[[], Any]) -> None:
        try:
            outcome = Outcome(get())
        except BaseException as exc:
            try:
                error = self._translate(exc)
            except Exception as bug:  # a bug in translate must not lose the chunk's answer
                error = ClusterError(f"{type(exc).__name__}: {exc} (and mapping it failed: {bug!r})")
            if error is not exc and error.__cause__ is None:
                error.__cause__ = exc
            outcome = Outcome(error=error)
        with self._lock:
            callbacks, self._callbacks = self._callbacks, None
            if callbacks is None:
                return
            self._outcome = outcome
            self._keep = None
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("a chunk's done-callback failed")

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if self._callbacks is not None:
                self._callbacks.append(callback)
                return
        callback()

    def done(self) -> bool:
        return self._callbacks is None

    def outcome(self) -> Outcome:
        return self._outcome

    def cancel(self) -> bool:
        if self.done():
            return False
        try:
            self._cancel()
        except Exception as exc:  # the cluster may already be gone: nothing left to stop
            log.debug("cancelling a chunk failed: %r", exc)
        return True
