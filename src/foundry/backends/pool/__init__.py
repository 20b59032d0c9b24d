"""Work-pool engines: the :class:`PoolEngine` contract (``base``) and one module per engine.
:func:`open_pool_engine` picks the engine from the URL's scheme and imports its driver
only then, so ``import foundry`` needs no NATS client.

===============================  ============================================================
``local://`` (default)           worker processes on this machine, started by the app
``local://served``               the same, started by ``foundry pool serve app:app`` on this
                                 machine and reached over a Unix socket under the app's home
``nats://host:4222``             NATS request-reply, queue groups: workers on many hosts
                                 (``foundry pool serve app:app`` on each; ``pip install
                                 "foundry-exec[nats]"``); ``tls://`` for NATS over TLS
===============================  ============================================================

Every engine passes the same conformance suite (``tests/pool/test_conformance.py``).
"""

from __future__ import annotations

from foundry.backends._registry import Engine, Registry
from foundry.backends.pool.base import (
    Attempt,
    EngineSpec,
    EngineStats,
    PoolEngine,
    Reply,
    Sizable,
)
from foundry.config import check_url
from foundry.errors import ConfigError

__all__ = [
    "ENGINES",
    "HOSTS",
    "Attempt",
    "EngineSpec",
    "EngineStats",
    "PoolEngine",
    "Reply",
    "Sizable",
    "engine_name",
    "open_pool_engine",
    "open_worker_host",
]


def engine_name(url: str) -> str:
    """``"local"``, ``"served"`` (``local://served``) or ``"nats"``/``"tls"`` for a pool URL."""
    if not isinstance(url, str) or not url:
        raise ConfigError(f"pool URL {url!r} is not a URL. Fix: e.g. local:// or nats://127.0.0.1:4222")
    check_url("pool", url)
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    if scheme != "local":
        return scheme
    where = rest.rstrip("/")
    if where not in ("", "served"):
        raise ConfigError(
            f"pool URL {url!r}: the embedded pool is local:// (workers started by the app) or local://served "
            "(workers started by `foundry pool serve` on this machine). Fix: use one of those"
        )
    return "served" if where else "local"


def open_pool_engine(url: str, spec: EngineSpec) -> PoolEngine:
    """The client side of the pool engine at ``url``, for one unit. A URL with an unknown
    scheme or a missing driver raises :class:`~foundry.errors.ConfigError` naming the fix."""
    engine: PoolEngine = ENGINES.load(url)(url, spec)
    return engine


def open_worker_host(url: str, spec: EngineSpec) -> Sizable:
    """This host's workers for one unit, served to other processes (``foundry pool
    serve``): on NATS for many hosts; on ``local://`` over a Unix socket under the app's
    home, for apps on this machine whose pool URL is ``local://served``."""
    host: Sizable = HOSTS.load(url)(url, spec)
    return host


# engine name (``engine_name``) -> the client's module and class, and the extra of its driver
ENGINES = Registry("pool", __name__, key=engine_name)
ENGINES.add(("local",), Engine(".local", "LocalPool"))
ENGINES.add(("served",), Engine(".served", "ServedPool"))
ENGINES.add(("nats", "tls"), Engine(".nats", "NatsPool", "nats", ("nats",)))

# engine name -> the worker host ``foundry pool serve`` runs for it
HOSTS = Registry("pool", __name__, key=engine_name)
HOSTS.add(("local", "served"), Engine(".served", "ServedHost"))
HOSTS.add(("nats", "tls"), Engine(".nats", "NatsWorkerHost", "nats", ("nats",)))
