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

from typing import Any

from foundry.backends._registry import Engine, Registry
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
from foundry.errors import ConfigError

__all__ = [
    "ENGINES",
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

# scheme -> the engine's module and class, and the extra that installs its driver
ENGINES = Registry("stream", __name__)
ENGINES.add(("sqlite", "memory"), Engine(".sqlite", "SqliteStreamBackend"))
ENGINES.add(("nats",), Engine(".nats", "NatsStreamBackend", "nats", ("nats",)))
ENGINES.add(("redis", "rediss"), Engine(".redis", "RedisStreamBackend", "redis", ("redis",)))


def open_stream_backend(url: str, **options: Any) -> StreamBackend:
    """Open the stream engine at ``url`` (creating its tables or buckets on first use).

    A URL with an unknown scheme, a typo or a missing driver raises
    :class:`~foundry.errors.ConfigError` naming the fix. Close the backend when done.
    """
    if not isinstance(url, str) or not url:
        raise ConfigError(f"stream backend URL {url!r} is not a URL. Fix: e.g. sqlite:///stream.db")
    backend: StreamBackend = ENGINES.load(url)(url, **options)
    return backend
