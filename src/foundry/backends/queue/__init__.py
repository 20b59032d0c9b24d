"""Durable queues: the :class:`QueueBackend` contract (``base``) and one module per
engine. :func:`open_queue_backend` picks the engine from the URL's scheme and imports
its driver only then, so ``import foundry`` needs no broker client.

=========================================  ==================================================
``sqlite:///path/queue.db``                 embedded default: one file, every process on the host
``memory://``                               a private temporary SQLite file, removed at close
``postgresql://user@host/db?schema=s``      many machines; ``FOR UPDATE SKIP LOCKED``, LISTEN/NOTIFY
``redis://host:6379/0``                     Redis (``pip install "foundry-exec[redis]"``)
``amqp://guest:guest@host:5672/``           RabbitMQ (``pip install "foundry-exec[rabbitmq]"``)
``rediss://…``, ``amqps://…``               the same over TLS (``?ssl_ca_certs=`` / ``?cafile=``…)
=========================================  ==================================================

Every engine passes the same conformance suite (``tests/backends/queue``).
"""

from __future__ import annotations

import os
from typing import Any

from foundry.backends._registry import AMQP, PSYCOPG, Engine, Registry
from foundry.backends.queue.base import (
    CancelResult,
    Capabilities,
    Claimed,
    Enqueued,
    JobProgress,
    JobState,
    JobStatus,
    NewJob,
    QueueBackend,
    QueueStats,
    check_new_job,
    check_queue_name,
)
from foundry.errors import ConfigError

__all__ = [
    "ENGINES",
    "CancelResult",
    "Capabilities",
    "Claimed",
    "Enqueued",
    "JobProgress",
    "JobState",
    "JobStatus",
    "NewJob",
    "QueueBackend",
    "QueueStats",
    "check_new_job",
    "check_queue_name",
    "engine_module",
    "open_queue_backend",
]

# scheme -> the engine's module and class, and the extra that installs its driver
ENGINES = Registry("queue", __name__)
ENGINES.add(("sqlite", "memory"), Engine(".sqlite", "SqliteQueue"))
ENGINES.add(("postgresql", "postgres"), Engine(".postgres", "PostgresQueue", "postgres", PSYCOPG))
ENGINES.add(("redis", "rediss"), Engine(".redis", "RedisQueue", "redis", ("redis",)))
ENGINES.add(("amqp", "amqps"), Engine(".amqp", "AmqpQueue", "rabbitmq", AMQP))


def engine_module(url: str) -> Any:
    """Import the module of ``url``'s engine (a missing driver is a :class:`ConfigError`)."""
    return ENGINES.module(url)


def open_queue_backend(url: str, *, home: str | os.PathLike[str] | None = None) -> QueueBackend:
    """Open (creating tables, queues or keys on first use) the queue at ``url``.

    ``home`` is the app's state directory, for an engine that keeps a file there by
    default (RabbitMQ's state store when the URL names no ``state=``); ``None``: the
    resolved one (``foundry.config.resolve_home``). A URL with an unknown scheme or a
    typo raises :class:`~foundry.errors.ConfigError` naming the fix; so does a missing
    driver. Close the backend when done.
    """
    if not isinstance(url, str) or not url:
        raise ConfigError(f"queue backend URL {url!r} is not a URL. Fix: e.g. sqlite:///queue.db")
    cls = ENGINES.load(url)
    homed = home is not None and getattr(cls, "uses_home", False)
    backend: QueueBackend = cls(url, home=home) if homed else cls(url)
    return backend
