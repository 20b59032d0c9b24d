"""The client options every Foundry connection to NATS uses (stream, work pool,
idempotency store): reconnect forever, a quarter of a second apart, and no callback of the
client's own printing to stderr. Imports nothing of nats-py: a backend passes these to
``nats.connect`` itself."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["client_options"]


async def _quiet(*_: Any) -> None:
    return None


def client_options(
    servers: list[str], *, error_cb: Callable[[BaseException], Awaitable[None]] | None = None
) -> dict[str, Any]:
    """Keyword arguments for ``nats.connect``: ``error_cb`` sees the client's errors
    (default: none reported — the backends turn failed calls into Foundry's errors)."""
    return {
        "servers": servers,
        "connect_timeout": 2,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.25,
        "allow_reconnect": True,
        "error_cb": error_cb or _quiet,
        "disconnected_cb": _quiet,
        "reconnected_cb": _quiet,
        "closed_cb": _quiet,
    }
