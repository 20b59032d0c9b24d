"""Rate limits and concurrency caps kept in the queue's engine: the
:class:`LimitsBackend` contract (``base``) and one module per engine.
:func:`open_limits` picks the engine *of a queue URL*, so a unit's limits live where its
jobs do, and imports the driver only then:

=========================================  ==================================================
queue URL                                  limits kept in
=========================================  ==================================================
``sqlite:///path/queue.db``                 the same file (tables ``<prefix>limit_*``)
``memory://``                               a private temporary SQLite file (one process)
``postgresql://…?schema=s``                 the same database and schema
``redis://…``, ``rediss://…``               the same Redis (keys ``<prefix>:limits:…``)
``amqp://…?state=<url>``                    the engine of the AMQP queue's state store (its
                                           default: the SQLite file in the app's home)
=========================================  ==================================================

Every engine passes the same conformance suite (``tests/backends/limits``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from foundry.backends.limits.base import SLOT_POLL, Limit, LimitsBackend, Verdict, scope_key
from foundry.config import resolve_home, safe_url
from foundry.errors import ConfigError

__all__ = ["SLOT_POLL", "Limit", "LimitsBackend", "Verdict", "limits_url", "open_limits", "scope_key"]


def limits_url(queue_url: str, home: str | os.PathLike[str] | None = None) -> str:
    """The URL of the store that keeps the limits of the jobs of ``queue_url``."""
    scheme = queue_url.split("://", 1)[0].lower() if "://" in queue_url else ""
    if scheme in ("amqp", "amqps"):
        query = dict(parse_qsl(urlsplit(queue_url).query, keep_blank_values=True))
        prefix = query.get("prefix", "foundry")
        state = query.get("state")
        if not state:  # the AMQP queue's default state store (foundry.backends.queue.amqp)
            folder = Path(home) if home else resolve_home()
            return f"sqlite:///{folder / f'queue-amqp-{prefix}.db'}"
        if "prefix=" not in state:  # named after the AMQP prefix, as the state store's own tables are
            tag = re.sub(r"[^A-Za-z0-9_]", "_", prefix)
            tag = tag if state.split("://", 1)[0].lower().startswith("redis") else tag + "_"
            state = f"{state}{'&' if '?' in state else '?'}prefix={tag}"
        return state
    return queue_url


def open_limits(queue_url: str, home: str | os.PathLike[str] | None = None) -> LimitsBackend:
    """Open (creating its tables on first use) the limits store of the queue at ``queue_url``."""
    url = limits_url(queue_url, home)
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("sqlite", "memory"):
        from foundry.backends.limits.sqlite import SqliteLimits

        return SqliteLimits(url)
    if scheme in ("postgresql", "postgres"):
        from foundry.backends.limits.postgres import PostgresLimits

        return PostgresLimits(url)
    if scheme in ("redis", "rediss"):
        from foundry.backends.limits.redis import RedisLimits

        return RedisLimits(url)
    raise ConfigError(
        f"queue URL {safe_url(queue_url)!r}: Foundry keeps rate limits and concurrency caps in SQLite, "
        "PostgreSQL or Redis, and this queue names none. Fix: use one of those queue engines (or an "
        "amqp:// queue with state=sqlite:///…, postgresql://… or redis://…)"
    )
