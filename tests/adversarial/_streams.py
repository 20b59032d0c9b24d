"""What the stream tests of the adversarial suite share: apps on every engine, and
writers that put records straight into an engine the way someone other than Foundry
would (a foreign producer, a hand-edited or corrupted store): they use the layout the
engines document, never Foundry's code.

* SQLite: rows in ``fs_events`` (``sqlite.py``'s layout), ``fs_parts.last`` moved on.
* Redis: ``XADD`` to ``{foundry:stream:<stream>}:p:<partition>``.
* NATS: a JetStream publish to ``foundry.<stream>.<partition>``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Mapping
from typing import Any

from foundry import Foundry
from foundry.backends.stream import partition_for
from tests.streams.conftest import ENGINES, app_factory, engine_url, unique

__all__ = [
    "ENGINES",
    "SQL",
    "MakeApp",
    "app_factory",
    "engine_of",
    "engine_url",
    "key_in",
    "nats_publish",
    "redis_xadd",
    "sqlite_delete",
    "sqlite_insert",
    "unique",
    "wait_until",
]

MakeApp = Callable[..., Foundry]


def engine_of(url: str) -> str:
    return url.split("://", 1)[0]


def key_in(partition: int, partitions: int, prefix: str = "key") -> str:
    """A key that lands on ``partition``."""
    for i in range(10_000):
        key = f"{prefix}-{i}"
        if partition_for(key, "", partitions) == partition:
            return key
    raise AssertionError(f"no key for partition {partition}")


def wait_until(what: str, done: Callable[[], bool], timeout: float = 60.0) -> None:
    until = time.monotonic() + timeout
    while not done():
        if time.monotonic() > until:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


# -- SQLite --------------------------------------------------------------------------


def sqlite_path(url: str) -> str:
    return url.split("://", 1)[1].split("?", 1)[0][1:]


class SQL:
    """A raw SQL expression for :func:`sqlite_insert` (``SQL("CAST(x'ff' AS TEXT)")``)."""

    def __init__(self, text: str) -> None:
        self.text = text


def sqlite_insert(url: str, stream: str, partition: int, row: Mapping[str, Any]) -> int:
    """Append one row to ``fs_events`` at the partition's next offset, as a writer that
    knows the table but not Foundry's types would (``row``: SQL expressions or values
    for id, key, ts, cum, payload and trace); returns its offset."""
    conn = sqlite3.connect(sqlite_path(url), timeout=30, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        (last,) = conn.execute(
            "SELECT last FROM fs_parts WHERE stream=? AND part=?", (stream, partition)
        ).fetchone()
        (sid,) = conn.execute("SELECT sid FROM fs_streams WHERE name=?", (stream,)).fetchone()
        values = {"id": "foreign", "key": None, "ts": time.time(), "cum": 0, "payload": b"{}", "trace": None}
        values.update(row)
        columns = ("id", "key", "ts", "cum", "payload", "trace")
        marks, args = [], []
        for name in columns:
            value = values[name]
            if isinstance(value, SQL):
                marks.append(value.text)
            else:
                marks.append("?")
                args.append(value)
        conn.execute(
            f"INSERT INTO fs_events (sid, part, off, {', '.join(columns)}) VALUES (?,?,?,{','.join(marks)})",
            (sid, partition, last + 1, *args),
        )
        conn.execute("UPDATE fs_parts SET last=? WHERE stream=? AND part=?", (last + 1, stream, partition))
        conn.execute("COMMIT")
        return int(last) + 1
    finally:
        conn.close()


def sqlite_delete(url: str, stream: str, partition: int, offset: int) -> None:
    """Delete one stored event from under the log."""
    conn = sqlite3.connect(sqlite_path(url), timeout=30, isolation_level=None)
    try:
        conn.execute(
            "DELETE FROM fs_events WHERE sid=(SELECT sid FROM fs_streams WHERE name=?) AND part=? AND off=?",
            (stream, partition, offset),
        )
    finally:
        conn.close()


# -- Redis ---------------------------------------------------------------------------


def redis_xadd(url: str, stream: str, partition: int, fields: Mapping[Any, Any], id: str = "*") -> str:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return client.xadd(f"{{foundry:stream:{stream}}}:p:{partition}", dict(fields), id=id).decode()
    finally:
        client.close()


# -- NATS ----------------------------------------------------------------------------


def nats_publish(
    url: str, stream: str, partition: int, messages: list[tuple[bytes, dict[str, str] | None]]
) -> list[int]:
    """Publish ``(data, headers)`` messages to the partition's subject; their sequences."""
    import nats

    async def run() -> list[int]:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            out = []
            for data, headers in messages:
                ack = await js.publish(f"foundry.{stream}.{partition}", data, headers=headers)
                out.append(int(ack.seq))
            return out
        finally:
            await nc.close()

    return asyncio.run(run())
