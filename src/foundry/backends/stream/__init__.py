"""Event streams: the :class:`StreamBackend` contract (``base``) and one module per
engine. :func:`open_stream_backend` picks the engine from the URL's scheme and imports
its driver only then, so ``import foundry`` needs no broker client.

=========================================  ==================================================
``sqlite:///path/stream.db``                embedded default: one file, every process on the host
``memory://``                               a private temporary SQLite file, removed at close
``nats://host:4222``                        NATS JetStream (``pip install "foundry-exec[nats]"``)
``redis://host:6379/0``                     Redis Streams (``pip install "foundry-exec[redis]"``)
``rediss://host:6379/0?ssl_ca_certs=…``     the same over TLS (options: ``foundry.backends._urls``)
=========================================  ==================================================

Every engine passes the same conformance suite (``tests/streams``).
"""

from __future__ import annotations

import importlib
from typing import Any

from foundry.backends.stream.base import (
    Appended,
    Capabilities,
    DeadLetter,
    Event,
    MalformedEntryError,
    NewEvent,
    PartitionLag,
    Start,
    StreamBackend,
    StreamConfig,
    StreamInfo,
    check_name,
    derived_id,
    partition_for,
)
from foundry.config import check_url, safe_url
from foundry.errors import ConfigError

__all__ = [
    "Appended",
    "Capabilities",
    "DeadLetter",
    "Event",
    "MalformedEntryError",
    "NewEvent",
    "PartitionLag",
    "Start",
    "StreamBackend",
    "StreamConfig",
    "StreamInfo",
    "check_name",
    "derived_id",
    "open_stream_backend",
    "partition_for",
]

# scheme -> (module, class, the driver it imports, the extra that installs that driver)
_ENGINES: dict[str, tuple[str, str, tuple[str, ...], str]] = {
    "sqlite": ("foundry.backends.stream.sqlite", "SqliteStreamBackend", (), ""),
    "memory": ("foundry.backends.stream.sqlite", "SqliteStreamBackend", (), ""),
    "nats": ("foundry.backends.stream.nats", "NatsStreamBackend", ("nats",), "nats"),
    "redis": ("foundry.backends.stream.redis", "RedisStreamBackend", ("redis",), "redis"),
}
_ENGINES["rediss"] = _ENGINES["redis"]  # TLS


def open_stream_backend(url: str, **options: Any) -> StreamBackend:
    """Open the stream engine at ``url`` (creating its tables or buckets on first use).

    A URL with an unknown scheme, a typo or a missing driver raises
    :class:`~foundry.errors.ConfigError` naming the fix. Close the backend when done.
    """
    if not isinstance(url, str) or not url:
        raise ConfigError(f"stream backend URL {url!r} is not a URL. Fix: e.g. sqlite:///stream.db")
    check_url("stream", url)
    module_name, class_name, drivers, extra = _ENGINES[url.split("://", 1)[0].lower()]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        root = (exc.name or "").split(".")[0]
        if root in drivers:
            raise ConfigError(
                f"stream URL {safe_url(url)!r} needs the {root!r} client library, which is not installed. "
                f'Fix: pip install "foundry-exec[{extra}]"'
            ) from exc
        raise
    backend: StreamBackend = getattr(module, class_name)(url, **options)
    return backend
