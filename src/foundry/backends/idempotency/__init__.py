"""Idempotency stores: which event ids a stream handler already handled. The
:class:`IdempotencyStore` contract (``base``: claim before run, record after success,
expiry, hostile records) and one module per engine, every one passing the one
conformance suite (``tests/streams/test_idempotency_conformance.py``).

:func:`open_idempotency_store` picks the engine from the URL's scheme and imports its
driver only then. :func:`store_url_for` is the default for a stream: its records live on
the stream's own engine, so a stream on NATS or Redis dedupes across hosts.

=========================================  ==================================================
``sqlite:///path/stream.db``                a table in the file (a stream's own file by default)
``memory://``                               a private temporary SQLite file, removed at close
``nats://host:4222``                        a JetStream KV bucket (``pip install "foundry-exec[nats]"``)
``redis://host:6379/0``, ``rediss://…``     string keys with a TTL (``pip install "foundry-exec[redis]"``)
``postgresql://user@host/db``               a table (``pip install "foundry-exec[postgres]"``)
=========================================  ==================================================
"""

from __future__ import annotations

import importlib
from typing import Any

from foundry.backends.idempotency.base import (
    DEFAULT_MAX_AGE,
    DEFAULT_MAX_RECORDS,
    Claim,
    HostileRecordError,
    IdempotencyStore,
    Record,
    TransactionalStore,
)
from foundry.config import safe_url
from foundry.errors import ConfigError

__all__ = [
    "DEFAULT_MAX_AGE",
    "DEFAULT_MAX_RECORDS",
    "Claim",
    "HostileRecordError",
    "IdempotencyStore",
    "Record",
    "TransactionalStore",
    "open_idempotency_store",
    "store_url_for",
]

# scheme -> (module, class, the driver it imports, the extra that installs that driver)
_ENGINES: dict[str, tuple[str, str, str, str]] = {
    "sqlite": ("sqlite", "SqliteIdempotencyStore", "", ""),
    "memory": ("sqlite", "SqliteIdempotencyStore", "", ""),
    "nats": ("nats", "NatsIdempotencyStore", "nats", "nats"),
    "redis": ("redis", "RedisIdempotencyStore", "redis", "redis"),
    "rediss": ("redis", "RedisIdempotencyStore", "redis", "redis"),
    "postgresql": ("postgres", "PostgresIdempotencyStore", "psycopg", "postgres"),
    "postgres": ("postgres", "PostgresIdempotencyStore", "psycopg", "postgres"),
}


def store_url_for(stream_url: str) -> str:
    """The idempotency store of a stream at ``stream_url``: the same engine, the same
    place (the SQLite file, the NATS cluster and prefix, the Redis database and prefix)."""
    return stream_url


def open_idempotency_store(url: str, **options: Any) -> IdempotencyStore:
    """Open the idempotency store at ``url`` (``max_age=``, ``max_records=``: retention).

    An unknown scheme or a missing driver raises :class:`~foundry.errors.ConfigError`
    naming the fix. Close the store when done.
    """
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(
            f"idempotency store URL {url!r} is not a URL. Fix: e.g. sqlite:///stream.db, redis://host:6379/0"
        )
    scheme = url.split("://", 1)[0].lower()
    engine = _ENGINES.get(scheme)
    if engine is None:
        raise ConfigError(
            f"idempotency store URL {safe_url(url)!r}: no engine for {scheme}://. "
            f"Fix: use one of {', '.join(f'{s}://' for s in _ENGINES)}"
        )
    module_name, class_name, driver, extra = engine
    try:
        module = importlib.import_module(f"foundry.backends.idempotency.{module_name}")
    except ModuleNotFoundError as exc:
        if driver and (exc.name or "").split(".")[0] == driver:
            raise ConfigError(
                f"idempotency store URL {safe_url(url)!r} needs the {driver!r} client library, which is "
                f'not installed. Fix: pip install "foundry-exec[{extra}]"'
            ) from exc
        raise
    store: IdempotencyStore = getattr(module, class_name)(url, **options)
    return store
