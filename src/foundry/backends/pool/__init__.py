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

import importlib
from typing import Any

from foundry.backends.pool.base import (
    Attempt,
    EngineSpec,
    EngineStats,
    PoolEngine,
    Reply,
    Sizable,
)
from foundry.config import check_url, safe_url
from foundry.errors import ConfigError

__all__ = [
    "ENGINES",
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

# engine -> (client module, client class, worker-host module:class, the driver it imports, its extra)
ENGINES: dict[str, tuple[str, str, str, tuple[str, ...], str]] = {
    "local": ("foundry.backends.pool.local", "LocalPool", "foundry.backends.pool.served:ServedHost", (), ""),
    "served": (
        "foundry.backends.pool.served",
        "ServedPool",
        "foundry.backends.pool.served:ServedHost",
        (),
        "",
    ),
    "nats": (
        "foundry.backends.pool.nats",
        "NatsPool",
        "foundry.backends.pool.nats:NatsWorkerHost",
        ("nats",),
        "nats",
    ),
}
ENGINES["tls"] = ENGINES["nats"]


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


def _module(url: str, which: int = 0) -> tuple[Any, tuple[str, str, str, tuple[str, ...], str]]:
    entry = ENGINES[engine_name(url)]
    module_name = entry[0] if which == 0 else entry[2].split(":")[0]
    drivers, extra = entry[3], entry[4]
    try:
        return importlib.import_module(module_name), entry
    except ModuleNotFoundError as exc:
        root = (exc.name or "").split(".")[0]
        if root in drivers:
            raise ConfigError(
                f"pool URL {safe_url(url)!r} needs the {root!r} client library, which is not installed. "
                f'Fix: pip install "foundry-exec[{extra}]"'
            ) from exc
        raise


def open_pool_engine(url: str, spec: EngineSpec) -> PoolEngine:
    """The client side of the pool engine at ``url``, for one unit. A URL with an unknown
    scheme or a missing driver raises :class:`~foundry.errors.ConfigError` naming the fix."""
    module, entry = _module(url)
    engine: PoolEngine = getattr(module, entry[1])(url, spec)
    return engine


def open_worker_host(url: str, spec: EngineSpec) -> Sizable:
    """This host's workers for one unit, served to other processes (``foundry pool
    serve``): on NATS for many hosts; on ``local://`` over a Unix socket under the app's
    home, for apps on this machine whose pool URL is ``local://served``."""
    module, entry = _module(url, which=1)
    host: Sizable = getattr(module, entry[2].split(":")[1])(url, spec)
    return host
