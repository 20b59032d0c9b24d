"""Malformed and foreign entries written straight into every stream engine are
dead-lettered with the reason, and the partition goes on: the events around them are
handled in order, the consumer thread lives, nothing is committed past an event unseen.

Before the fix one such entry halted its partition for good: a TEXT payload in the
SQLite log killed the consumer thread (while its heartbeat kept the lease), an ``XADD``
without Foundry's fields was dropped from every read and stayed pending for ever, and a
foreign ``XADD`` (its id above Foundry's offsets) made every later publish fail.
"""

from __future__ import annotations

import json
from pathlib import Path

from foundry.deliver.stream import StreamEvent
from foundry.observe import names
from tests.adversarial._streams import (
    SQL,
    MakeApp,
    engine_of,
    key_in,
    nats_publish,
    redis_xadd,
    sqlite_delete,
    sqlite_insert,
    unique,
    wait_until,
)
from tests.services import require


def write_malformed(url: str, stream: str, partition: int) -> int:
    """Write the engine's malformed and foreign entries into ``partition``; how many."""
    engine = engine_of(url)
    if engine == "sqlite":
        rows = [
            {"payload": '{"k": "text payload"}'},  # TEXT where a BLOB belongs
            {"ts": "yesterday"},  # a timestamp that is not a number
            {"key": b"\xff\xfe"},  # a BLOB key
            {"id": SQL("CAST(x'fffe' AS TEXT)")},  # TEXT that is not UTF-8
            {"payload": 42},  # an INTEGER payload (bytes(42) would be 42 NUL bytes)
        ]
        for row in rows:
            sqlite_insert(url, stream, partition, row)
        return len(rows)
    if engine == "redis":
        redis_xadd(url, stream, partition, {"hello": "world"})  # no Foundry fields, id '*'
        redis_xadd(url, stream, partition, {"m": "garbage", "d": "x"})  # m in no known shape
        redis_xadd(url, stream, partition, {"d": '{"k": "only d"}'})
        redis_xadd(url, stream, partition, {"m": "1.5 0 999 -short", "d": "{}"})  # id longer than m
        return 4
    nats_publish(
        url,
        stream,
        partition,
        [
            (b"\xff not an event", None),  # no headers, not JSON
            (b"<xml/>", {"Foundry-Key": "k"}),
            (b"", {"Nats-Msg-Id": "empty-body"}),
        ],
    )
    return 3


def test_malformed_entries_are_dead_lettered_and_the_partition_goes_on(
    make_stream_app: MakeApp, stream_url: str
) -> None:
    app = make_stream_app(stream_url)
    s = app.stream(unique("malformed"), key="k", partitions=2)
    key = key_in(1, 2)
    handled: list[int] = []

    @s.consumer(group="g", ack_deadline="2s", session="2s", max_deliveries=2, retry_backoff="10ms")
    def handle(event: StreamEvent) -> None:
        handled.append(event["n"])

    s.runtime.ensure_group("g")
    s.publish_many([{"k": key, "n": n} for n in range(10)])
    bad = write_malformed(stream_url, s.name, 1)
    s.publish_many([{"k": key, "n": n} for n in range(10, 20)])  # after them: must not wait for ever
    with s.run() as consumers:
        wait_until(
            "the good events and the dead letters",
            lambda: len(handled) == 20 and len(s.dead_letters("g")) == bad,
        )
        wait_until("the commit", lambda: sum(p.lag for p in s.lag("g")) == 0)
        assert consumers.alive
    # Every good event once, in order; every bad entry one dead letter saying why.
    assert handled == list(range(20))
    letters = s.dead_letters("g")
    assert len(letters) == bad
    for letter in letters:
        assert letter.partition == 1
        assert letter.id  # even an entry stored without one has an id
        assert "not an event Foundry can read" in letter.reason or "is not valid json" in letter.reason
    assert app.metrics.value(names.STREAM_DEAD, group="g") == bad
    assert app.metrics.value(names.STREAM_CONSUMER_FAILURES, group="g") == 0
    assert consumers.failures == []


def test_an_entry_deleted_from_under_the_sqlite_log_is_recorded_not_skipped_silently(
    make_stream_app: MakeApp, tmp_path: Path
) -> None:
    app = make_stream_app(f"sqlite:///{tmp_path}/deleted.db")
    s = app.stream(unique("deleted"), key="k")
    handled: list[int] = []
    s.consumer(group="g")(lambda e: handled.append(e["n"]))
    s.runtime.ensure_group("g")
    published = s.publish_many([{"k": "a", "n": n} for n in range(5)])
    sqlite_delete(f"sqlite:///{tmp_path}/deleted.db", s.name, 0, published[2].offset or 0)
    s.drain(timeout=60)
    assert handled == [0, 1, 3, 4]
    [letter] = s.dead_letters("g")
    assert letter.offset == published[2].offset
    assert "is missing" in letter.reason


def test_a_foreign_xadd_does_not_wedge_publishing_on_redis(make_stream_app: MakeApp) -> None:
    url = require("redis")  # the other engines number entries themselves
    app = make_stream_app(url)
    s = app.stream(unique("foreign-id"), key="k")
    handled: list[int] = []
    s.consumer(group="g", ack_deadline="2s")(lambda e: handled.append(e["n"]))
    s.runtime.ensure_group("g")
    before = s.publish_many([{"k": "a", "n": n} for n in range(3)])
    foreign = redis_xadd(url, s.name, 0, {"d": json.dumps({"k": "a", "n": -1})})  # id: milliseconds
    foreign_offset = int(foreign.split("-")[0])
    # Publishing goes on, past the foreign entry's id ...
    after = s.publish_many([{"k": "a", "n": n} for n in range(3, 6)])
    assert [p.offset for p in before] == [1, 2, 3]
    assert [p.offset for p in after] == [foreign_offset + 1, foreign_offset + 2, foreign_offset + 3]
    # ... a time seek, lag and info still answer ...
    info = s.runtime.backend.info(s.name)
    assert info.last == (foreign_offset + 3,)
    # ... and the group handles every event, dead-letters the foreign entry, records no gap.
    s.drain(timeout=60)
    assert handled == [0, 1, 2, 3, 4, 5]
    [letter] = s.dead_letters("g")
    assert letter.offset == foreign_offset
    assert "no Foundry fields m and d" in letter.reason
    s.replay("g", time=0.0)
    handled.clear()
    s.drain(timeout=60)
    assert handled == [0, 1, 2, 3, 4, 5]
    # A foreign entry with a sequence part (an explicit id) is acknowledged whole.
    top = redis_xadd(url, s.name, 0, {"x": "y"}, id=f"{foreign_offset + 3}-7")
    s.publish({"k": "a", "n": 6})
    handled.clear()
    s.drain(timeout=60)
    assert handled == [6]
    assert [d.offset for d in s.dead_letters("g")][-1] == int(top.split("-")[0])
