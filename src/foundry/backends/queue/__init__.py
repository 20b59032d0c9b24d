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

import importlib
import inspect
import os
from typing import Any

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
from foundry.config import check_url, safe_url
from foundry.errors import ConfigError

__all__ = [
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

# scheme -> (module, the driver it imports, the extra that installs that driver)
_ENGINES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "sqlite": ("foundry.backends.queue.sqlite", (), ""),
    "memory": ("foundry.backends.queue.sqlite", (), ""),
    "postgresql": ("foundry.backends.queue.postgres", ("psycopg", "psycopg_binary"), "postgres"),
    "postgres": ("foundry.backends.queue.postgres", ("psycopg", "psycopg_binary"), "postgres"),
    "redis": ("foundry.backends.queue.redis", ("redis",), "redis"),
    "amqp": ("foundry.backends.queue.amqp", ("aio_pika", "pika", "aiormq", "pamqp"), "rabbitmq"),
}
_ENGINES["rediss"] = _ENGINES["redis"]  # TLS (options: foundry.backends._urls)
_ENGINES["amqps"] = _ENGINES["amqp"]


def engine_module(url: str) -> Any:
    """Import the module of ``url``'s engine (a missing driver is a :class:`ConfigError`)."""
    check_url("queue", url)
    scheme = url.split("://", 1)[0].lower()
    module_name, drivers, extra = _ENGINES[scheme]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        root = (exc.name or "").split(".")[0]
        if root in drivers:
            raise ConfigError(
                f"queue URL {safe_url(url)!r} needs the {root!r} client library, which is not installed. "
                f'Fix: pip install "foundry-exec[{extra}]"'
            ) from exc
        if exc.name == module_name:
            raise ConfigError(
                f"queue URL {safe_url(url)!r}: the {scheme} engine is not part of this installation "
                f"({module_name} is missing). Fix: upgrade foundry-exec, or use sqlite:// or postgresql://"
            ) from exc
        raise


def _engine_class(module: Any) -> Any:
    """The backend class an engine module defines (the one with ``claim`` and ``enqueue``)."""
    names = getattr(module, "__all__", None) or dir(module)
    for name in names:
        value = getattr(module, name, None)
        if (
            inspect.isclass(value)
            and value.__module__ == module.__name__
            and callable(getattr(value, "claim", None))
            and callable(getattr(value, "enqueue", None))
        ):
            return value
    raise ConfigError(f"{module.__name__} defines no queue backend class. Fix: a bug in Foundry; report it")


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
    module = engine_module(url)
    cls = _engine_class(module)
    homed = home is not None and getattr(cls, "uses_home", False)
    backend: QueueBackend = cls(url, home=home) if homed else cls(url)
    return backend
