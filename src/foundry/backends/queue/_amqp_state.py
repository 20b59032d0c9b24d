"""The state store of the AMQP queue: where a job's record lives while RabbitMQ carries
the message that delivers it.

RabbitMQ has no key/value store, so idempotency keys, leases, the single completion
record, results, dead letters and counters live in one of Foundry's own queue stores,
opened by URL through the queue family's registry (SQLite, PostgreSQL or Redis: the
engines that offer :class:`~foundry.backends.queue.base.StateStore`). This module only
names the store's tables or keys after the AMQP queue's prefix; it imports no engine.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit

from foundry.backends.queue.base import StateStore
from foundry.config import safe_url
from foundry.errors import ConfigError

__all__ = ["StateStore", "open_state"]

_SQL = ("sqlite", "memory", "postgresql", "postgres")
_KEYS = ("redis", "rediss")


def open_state(url: str, prefix: str) -> StateStore:
    """Open the state store at ``url``, naming its tables or keys after ``prefix`` unless
    the URL says otherwise."""
    from foundry.backends.queue import open_queue_backend  # the family's registry (loaded first)

    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in (*_SQL, *_KEYS):
        raise ConfigError(
            f"AMQP queue: state={safe_url(url)!r} is not a store Foundry can keep job state in. Fix: use "
            "sqlite:///path, postgresql://…, redis://… or rediss://… (percent-encode it inside the "
            "amqp:// URL)"
        )
    if "prefix" not in dict(parse_qsl(urlsplit(url).query)):
        named = f"{re.sub(r'[^A-Za-z0-9_]', '_', prefix)}_" if scheme in _SQL else prefix
        url = f"{url}{'&' if '?' in url else '?'}prefix={named}"
    store = open_queue_backend(url)
    if not isinstance(store, StateStore):  # every engine named above offers it
        store.close()
        raise ConfigError(
            f"AMQP queue: state={safe_url(url)!r}: {type(store).__name__} cannot keep the AMQP queue's job "
            "state. Fix: use sqlite:///path, postgresql://… or redis://…"
        )
    return store
