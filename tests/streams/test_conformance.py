"""One conformance suite for every StreamBackend (SQLite, NATS JetStream, Redis Streams).

Each test states the part of the contract in ``foundry.backends.stream.base`` it checks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading
import time
import uuid
from collections.abc import Callable

import pytest

from foundry.backends.stream import (
    Appended,
    Event,
    NewEvent,
    Start,
    StreamBackend,
    StreamConfig,
    open_stream_backend,
    partition_for,
)
from foundry.errors import BackendUnavailableError, ConfigError, NotFoundError

MakeStream = Callable[..., StreamConfig]


def events(n: int, keys: int = 3, start: int = 0, prefix: str = "e") -> list[NewEvent]:
    return [
        NewEvent(f"{prefix}{i}", f'{{"n":{i}}}'.encode(), key=f"k{i % keys}") for i in range(start, start + n)
    ]


def drain(
    backend: StreamBackend,
    stream: str,
    group: str,
    partitions: int,
    *,
    commit: bool = True,
    consumer: str = "c1",
    ack_deadline: float = 30.0,
) -> list[Event]:
    """Read every partition until it is empty, committing each batch."""
    out: list[Event] = []
    for p in range(partitions):
        while True:
            got = backend.read(stream, group, p, consumer, max=4, ack_deadline=ack_deadline, timeout=0.05)
            if not got:
                break
            out.extend(got)
            if commit:
                backend.commit(stream, group, p, got[-1].offset)
            else:
                break
    return out


def read_soon(
    backend: StreamBackend, stream: str, consumer: str, *, max: int, ack_deadline: float, within: float = 5.0
) -> list[Event]:
    """Partition 0 of group ``g``: the first non-empty read within ``within`` seconds
    (a redelivery becomes due on the server's clock, not exactly on ours)."""
    got: list[Event] = []
    until = time.monotonic() + within
    while not got and time.monotonic() < until:
        got = backend.read(stream, "g", 0, consumer, max=max, ack_deadline=ack_deadline, timeout=0.5)
    return got


# -- append ----------------------------------------------------------------------


def test_append_partitions_by_key_with_dense_offsets(backend: StreamBackend, make_stream: MakeStream) -> None:
    s = make_stream(partitions=3)
    appended = backend.append(s.name, events(30, keys=5))
    # Given 30 events over 5 keys: each lands on the partition of its key's hash ...
    for i, a in enumerate(appended):
        assert a.partition == partition_for(f"k{i % 5}", f"e{i}", 3)
        assert not a.duplicate
    # ... and offsets are 1, 2, 3 ... in append order within each partition.
    for p in range(3):
        offsets = [a.offset for a in appended if a.partition == p]
        assert offsets == list(range(1, len(offsets) + 1))
    info = backend.info(s.name)
    assert info.events == 30
    assert info.config.partitions == 3


def test_publish_dedup_by_event_id(backend: StreamBackend, make_stream: MakeStream) -> None:
    s = make_stream(partitions=2, dedup_window=60.0)
    first = backend.append(s.name, events(5))
    # When the same ids are appended again (a producer retry), and one id twice in a batch ...
    again = backend.append(
        s.name, [*events(5), NewEvent("new", b"{}", key="k1"), NewEvent("new", b"{}", key="k1")]
    )
    assert [a.duplicate for a in again] == [True] * 5 + [False, True]
    assert [a.partition for a in again[:5]] == [a.partition for a in first]
    for original, duplicate in zip(first, again[:5], strict=True):
        assert duplicate.offset in (original.offset, None)
    # ... then only six events are stored.
    assert backend.info(s.name).events == 6
    backend.create_group(s.name, "g", Start.beginning())
    assert sorted(e.id for e in drain(backend, s.name, "g", 2)) == sorted(
        [f"e{i}" for i in range(5)] + ["new"]
    )


def test_aappend_on_the_callers_loops_keeps_order_and_dedup(
    backend: StreamBackend, make_stream: MakeStream
) -> None:
    s = make_stream(partitions=2, dedup_window=60.0)

    async def publish(prefix: str) -> list[Appended]:
        # One event alone (a request/reply on NATS), then a batch, awaited on this loop.
        one = await backend.aappend(s.name, events(1, prefix=prefix))
        return one + await backend.aappend(s.name, events(9, start=1, prefix=prefix))

    # Given two loops, each in its own thread, appending at once (each its own connection) ...
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda prefix: asyncio.run(publish(prefix)), ["a", "b"]))
    # ... and a third loop that retries the first one's events (a producer retry).
    again = asyncio.run(publish("a"))
    assert not any(a.duplicate for run in runs for a in run)
    assert all(a.duplicate for a in again)
    assert [a.partition for a in again] == [a.partition for a in runs[0]]
    # Then each loop's events are in its order within each partition, offsets dense ...
    for p in range(2):
        for run in runs:
            mine = [a.offset for a in run if a.partition == p]
            assert mine == sorted(mine)
        stored = sorted(a.offset for run in runs for a in run if a.partition == p)
        assert stored == list(range(1, len(stored) + 1))
    # ... and every event is stored exactly once.
    assert backend.info(s.name).events == 20
    backend.create_group(s.name, "g", Start.beginning())
    got = [e.id for e in drain(backend, s.name, "g", 2)]
    assert sorted(got) == sorted(f"{prefix}{i}" for prefix in "ab" for i in range(10))


def test_many_running_loops_append_and_close_leaves_none_of_their_connections(backend_url: str) -> None:
    backend = open_stream_backend(backend_url)
    config = StreamConfig(f"t-{uuid.uuid4().hex[:10]}")
    backend.ensure_stream(config)
    # Given more running loops (each in its own thread) than NATS gives a connection of
    # their own (the rest share the backend's, through its thread) ...
    loops = [asyncio.new_event_loop() for _ in range(10)]
    threads = [threading.Thread(target=loop.run_forever) for loop in loops]
    for thread in threads:
        thread.start()
    try:
        # ... each appending three events of its own, all at once:
        futures = [
            asyncio.run_coroutine_threadsafe(backend.aappend(config.name, events(3, prefix=f"l{i}-")), loop)
            for i, loop in enumerate(loops)
        ]
        appended = [a for future in futures for a in future.result(30)]
        # Then every event is stored once, offsets dense ...
        assert sorted(a.offset for a in appended) == list(range(1, 31))
        assert backend.info(config.name).events == 30
        backend.delete_stream(config.name)
        # ... and when the backend closes, the loops are left with no connection open:
        # no warning of an unclosed transport or a pending task when they stop and close.
        backend.close()
    finally:
        for loop in loops:
            loop.call_soon_threadsafe(loop.stop)
        for thread, loop in zip(threads, loops, strict=True):
            thread.join(30)
            loop.close()
        gc.collect()


# -- groups ----------------------------------------------------------------------


def test_per_key_order_and_independent_groups(backend: StreamBackend, make_stream: MakeStream) -> None:
    s = make_stream(partitions=3)
    backend.append(s.name, events(40, keys=4))
    for group in ("logging", "analytics", "billing"):
        assert backend.create_group(s.name, group, Start.beginning())
    assert not backend.create_group(s.name, "billing", Start.beginning())  # exists: unchanged
    assert backend.groups(s.name) == ["analytics", "billing", "logging"]
    for group in ("logging", "analytics", "billing"):
        got = drain(backend, s.name, group, 3)
        # Every group sees every event once, in publish order per key.
        assert sorted(e.id for e in got) == sorted(f"e{i}" for i in range(40))
        for k in range(4):
            ns = [int(e.id[1:]) for e in got if e.key == f"k{k}"]
            assert ns == sorted(ns)
    assert all(lag.lag == 0 for lag in backend.lag(s.name, "billing"))


def test_committed_position_survives_reopen(backend: StreamBackend, make_stream: MakeStream) -> None:
    s = make_stream()
    backend.append(s.name, events(10))
    backend.create_group(s.name, "g", Start.beginning())
    got = backend.read(s.name, "g", 0, "c1", max=4, ack_deadline=30, timeout=1)
    backend.commit(s.name, "g", 0, got[-1].offset)
    assert [e.offset for e in got] == [1, 2, 3, 4]
    # A new connection (another process) continues after the committed offset.
    other = open_stream_backend(backend.url)
    try:
        nxt = other.read(s.name, "g", 0, "c2", max=4, ack_deadline=30, timeout=1)
        assert [e.offset for e in nxt] == [5, 6, 7, 8]
        assert nxt[0].deliveries == 1
        other.commit(s.name, "g", 0, nxt[-1].offset)
        lag = other.lag(s.name, "g")[0]
        assert (lag.committed, lag.end, lag.lag) == (8, 10, 2)
    finally:
        other.close()


TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\nrojo=00f067aa0ba902b7,congo=t61rcWkgMzE"


def test_the_trace_context_travels_with_the_event_on_every_delivery(
    backend: StreamBackend, make_stream: MakeStream
) -> None:
    # Given a traced event, an untraced one, and one traced with a traceparent only
    s = make_stream()
    only_parent = TRACE.split("\n")[0]
    backend.append(
        s.name,
        [NewEvent("t1", b"1", trace=TRACE), NewEvent("t2", b"2"), NewEvent("t3", b"3", trace=only_parent)],
    )
    backend.create_group(s.name, "g", Start.beginning())
    # When they are read, and read again after their ack deadline passed (a redelivery)
    first = backend.read(s.name, "g", 0, "c1", max=10, ack_deadline=0.5, timeout=1.0)
    again = read_soon(backend, s.name, "c2", max=10, ack_deadline=0.5)
    # Then each delivery carries the context it was published in
    assert [(e.id, e.trace) for e in first] == [("t1", TRACE), ("t2", None), ("t3", only_parent)]
    assert again, "nothing was redelivered"
    assert (again[0].id, again[0].trace) == ("t1", TRACE)
    assert again[0].deliveries >= 2
    expected = {"t1": TRACE, "t2": None, "t3": only_parent}
    assert all(e.trace == expected[e.id] for e in again)


def test_new_group_at_beginning_or_end(backend: StreamBackend, make_stream: MakeStream) -> None:
    s = make_stream(partitions=2)
    backend.append(s.name, events(6))
    backend.create_group(s.name, "old", Start.beginning())
    backend.create_group(s.name, "new", Start.end())
    backend.append(s.name, events(4, start=6))
    assert len(drain(backend, s.name, "old", 2)) == 10
    assert sorted(e.id for e in drain(backend, s.name, "new", 2)) == ["e6", "e7", "e8", "e9"]


def test_replay_from_offset(backend: StreamBackend, make_stream: MakeStream) -> None:
    s = make_stream()
    backend.append(s.name, events(8))
    backend.create_group(s.name, "g", Start.beginning())
    assert len(drain(backend, s.name, "g", 1)) == 8
    # Replay from offset 3: the group sees 3..8 again, as first deliveries.
    backend.seek(s.name, "g", Start.at(3))
    again = drain(backend, s.name, "g", 1)
    assert [e.offset for e in again] == [3, 4, 5, 6, 7, 8]
    # A group can also start at an offset.
    backend.create_group(s.name, "late", Start.at({0: 6}))
    assert [e.offset for e in drain(backend, s.name, "late", 1)] == [6, 7, 8]


def test_replay_from_time(backend: StreamBackend, make_stream: MakeStream) -> None:
    s = make_stream()
    backend.append(s.name, events(3, prefix="before"))
    time.sleep(0.3)
    boundary = time.time()
    time.sleep(0.3)
    backend.append(s.name, events(3, prefix="after"))
    backend.create_group(s.name, "g", Start.since(boundary))
    assert [e.id for e in drain(backend, s.name, "g", 1)] == ["after0", "after1", "after2"]
    backend.seek(s.name, "g", Start.since(boundary - 3600))
    assert len(drain(backend, s.name, "g", 1)) == 6


# -- at-least-once ----------------------------------------------------------------


def test_redelivery_after_ack_deadline_keeps_order(backend: StreamBackend, make_stream: MakeStream) -> None:
    s = make_stream()
    backend.append(s.name, events(6))
    backend.create_group(s.name, "g", Start.beginning())
    first = backend.read(s.name, "g", 0, "c1", max=3, ack_deadline=0.5, timeout=1)
    assert [e.offset for e in first] == [1, 2, 3]
    # While 1..3 are pending and not expired, nothing later is handed out (per-key order).
    assert backend.read(s.name, "g", 0, "c1", max=3, ack_deadline=0.5, timeout=0.1) == []
    time.sleep(0.7)
    # After the deadline the same events come back, oldest first, counted.
    again = read_soon(backend, s.name, "c2", max=3, ack_deadline=0.5)
    assert [e.offset for e in again] == [1, 2, 3]
    assert [e.deliveries for e in again] == [2, 2, 2]
    backend.commit(s.name, "g", 0, 3)
    rest = backend.read(s.name, "g", 0, "c2", max=10, ack_deadline=0.5, timeout=1)
    assert [(e.offset, e.deliveries) for e in rest] == [(4, 1), (5, 1), (6, 1)]


def test_a_new_owner_gets_the_dead_owners_events_before_newer_ones(
    backend: StreamBackend, make_stream: MakeStream
) -> None:
    s = make_stream()
    backend.append(s.name, events(6))
    backend.create_group(s.name, "g", Start.beginning())
    # Given an owner in another process that read 1..3 and died without committing ...
    other = open_stream_backend(backend.url)
    try:
        assert other.acquire(s.name, "g", 0, "dead", ttl=0.3)
        got = other.read(s.name, "g", 0, "dead", max=3, ack_deadline=0.6, timeout=1)
        assert [e.offset for e in got] == [1, 2, 3]
    finally:
        other.close()
    # ... when the next owner takes the lease over and reads at once, it gets nothing newer ...
    time.sleep(0.35)
    assert backend.acquire(s.name, "g", 0, "next", ttl=30)
    assert backend.read(s.name, "g", 0, "next", max=3, ack_deadline=0.6, timeout=0.1) == []
    # ... and once the deadline passed, 1..3 come back first, then 4..6.
    seen: list[tuple[int, int]] = []
    until = time.monotonic() + 10
    while len(seen) < 6 and time.monotonic() < until:
        got = backend.read(s.name, "g", 0, "next", max=3, ack_deadline=0.6, timeout=0.5)
        seen.extend((e.offset, e.deliveries) for e in got)
        if got:
            backend.commit(s.name, "g", 0, got[-1].offset)
    assert seen == [(1, 2), (2, 2), (3, 2), (4, 1), (5, 1), (6, 1)]
    # ... and the commits of the newer ones count too (JetStream drops a cumulative ack
    # whose delivery is older than the last acknowledged one: the server must agree).
    until = time.monotonic() + 5
    while (lag := backend.lag(s.name, "g")[0]).committed != 6 and time.monotonic() < until:
        time.sleep(0.05)
    assert (lag.committed, lag.lag, lag.pending) == (6, 0, 0)


def test_partial_redelivery_takes_a_prefix(backend: StreamBackend, make_stream: MakeStream) -> None:
    s = make_stream()
    backend.append(s.name, events(4))
    backend.create_group(s.name, "g", Start.beginning())
    backend.read(s.name, "g", 0, "c1", max=4, ack_deadline=0.3, timeout=1)
    time.sleep(0.5)
    # A recovering consumer takes one expired entry at a time: only it is counted again.
    one = read_soon(backend, s.name, "c2", max=1, ack_deadline=0.3)
    assert [(e.offset, e.deliveries) for e in one] == [(1, 2)]
    backend.commit(s.name, "g", 0, 1)
    nxt = read_soon(backend, s.name, "c2", max=10, ack_deadline=0.3)
    assert [(e.offset, e.deliveries) for e in nxt] == [(2, 2), (3, 2), (4, 2)]


def test_extend_holds_only_what_the_consumer_received(
    backend: StreamBackend, make_stream: MakeStream
) -> None:
    """A recovering consumer that took one expired event and extends its deadline must
    not hold the rest of the dead consumer's window: that rest stays due, or the
    partition stalls for as long as the new consumer keeps heartbeating (issue 6)."""
    s = make_stream()
    backend.append(s.name, events(4))
    backend.create_group(s.name, "g", Start.beginning())
    backend.read(s.name, "g", 0, "ghost", max=4, ack_deadline=0.3, timeout=1)
    time.sleep(0.5)
    one = read_soon(backend, s.name, "c2", max=1, ack_deadline=0.3)
    assert [(e.offset, e.deliveries) for e in one] == [(1, 2)]
    backend.extend(s.name, "g", 0, "c2", 30.0)  # c2's heartbeat while it handles event 1
    backend.commit(s.name, "g", 0, 1)
    nxt = read_soon(backend, s.name, "c2", max=1, ack_deadline=0.3)
    assert [(e.offset, e.deliveries) for e in nxt] == [(2, 2)]


def test_extend_keeps_entries_held(backend: StreamBackend, make_stream: MakeStream) -> None:
    s = make_stream()
    backend.append(s.name, events(2))
    backend.create_group(s.name, "g", Start.beginning())
    backend.read(s.name, "g", 0, "c1", max=2, ack_deadline=0.6, timeout=1)
    for _ in range(3):
        time.sleep(0.3)
        backend.extend(s.name, "g", 0, "c1", 0.6)
    # 0.9 s after the read, past the original deadline: still held by c1.
    assert backend.read(s.name, "g", 0, "c2", max=2, ack_deadline=0.6, timeout=0.05) == []
    backend.commit(s.name, "g", 0, 2)
    assert backend.lag(s.name, "g")[0].lag == 0


def test_dead_letter_records_reason_and_moves_on(backend: StreamBackend, make_stream: MakeStream) -> None:
    s = make_stream()
    backend.append(s.name, events(3))
    backend.create_group(s.name, "g", Start.beginning())
    backend.create_group(s.name, "other", Start.beginning())
    got = backend.read(s.name, "g", 0, "c1", max=1, ack_deadline=30, timeout=1)
    backend.dead_letter(s.name, "g", got[0], "handler raised ValueError on 5 of 5 deliveries", '{"type":"x"}')
    dead = backend.dead_letters(s.name, "g")
    assert len(dead) == 1
    assert (dead[0].id, dead[0].offset, dead[0].payload) == ("e0", 1, b'{"n":0}')
    assert "ValueError" in dead[0].reason
    assert dead[0].error == '{"type":"x"}'
    assert backend.dead_letters(s.name, "other") == []
    # The group moved past it; the other group still has it.
    rest = backend.read(s.name, "g", 0, "c1", max=5, ack_deadline=30, timeout=1)
    assert [e.offset for e in rest] == [2, 3]
    assert [e.offset for e in drain(backend, s.name, "other", 1)] == [1, 2, 3]


def test_lag_per_partition(backend: StreamBackend, make_stream: MakeStream) -> None:
    s = make_stream(partitions=2)
    appended = backend.append(s.name, events(20, keys=7))
    backend.create_group(s.name, "g", Start.beginning())
    per_part = [sum(1 for a in appended if a.partition == p) for p in range(2)]
    assert [lag.lag for lag in backend.lag(s.name, "g")] == per_part
    got = backend.read(s.name, "g", 0, "c1", max=3, ack_deadline=30, timeout=1)
    backend.commit(s.name, "g", 0, got[1].offset)
    lag0 = backend.lag(s.name, "g")[0]
    assert (lag0.committed, lag0.end, lag0.pending, lag0.lag) == (2, per_part[0], 1, per_part[0] - 2)


# -- retention --------------------------------------------------------------------


def test_retention_by_count_and_replay_past_it(backend: StreamBackend, make_stream: MakeStream) -> None:
    s = make_stream(max_events=5)
    backend.create_group(s.name, "slow", Start.beginning())
    backend.append(s.name, events(12))
    backend.enforce_retention(s.name)
    info = backend.info(s.name)
    assert (info.first[0], info.last[0]) == (8, 12)
    # Replay from an offset retention dropped: a clear error, and the group is unchanged.
    with pytest.raises(NotFoundError, match=r"retention kept only offsets 8\.\.12"):
        backend.seek(s.name, "slow", Start.at(2))
    # A group that fell behind gets one gap record and continues at the first kept event.
    got = drain(backend, s.name, "slow", 1)
    assert [e.offset for e in got] == [8, 9, 10, 11, 12]
    gaps = backend.dead_letters(s.name, "slow")
    assert len(gaps) == 1
    assert (gaps[0].offset, gaps[0].last_offset, gaps[0].payload) == (1, 7, None)
    assert "retention" in gaps[0].reason


def test_dedup_outlives_retention_inside_the_window(backend: StreamBackend, make_stream: MakeStream) -> None:
    s = make_stream(max_events=3, dedup_window=60.0)
    first = backend.append(s.name, events(8))
    backend.enforce_retention(s.name)
    assert backend.info(s.name).first[0] == 6
    # When a producer retries ids whose events retention already removed (and ids it kept) ...
    again = backend.append(s.name, [*events(8), NewEvent("fresh", b"{}", key="k0")])
    # ... within the dedup window they are still duplicates, at their original place.
    assert [a.duplicate for a in again] == [True] * 8 + [False]
    for original, duplicate in zip(first, again[:8], strict=True):
        assert duplicate.partition == original.partition
        assert duplicate.offset in (original.offset, None)
    assert again[8].offset == 9
    assert backend.info(s.name).last[0] == 9


def test_retention_by_age(backend: StreamBackend, make_stream: MakeStream) -> None:
    s = make_stream(max_age=1.0)
    backend.append(s.name, events(3, prefix="old"))
    time.sleep(1.3)
    backend.append(s.name, events(2, prefix="new"))
    backend.enforce_retention(s.name)
    until = time.monotonic() + 5
    while backend.info(s.name).first[0] != 4 and time.monotonic() < until:
        time.sleep(0.1)  # engines that expire on their own do so on a timer
        backend.enforce_retention(s.name)
    assert backend.info(s.name).first[0] == 4
    with pytest.raises(NotFoundError, match="retention"):
        backend.create_group(s.name, "g", Start.since(time.time() - 60))
    assert backend.groups(s.name) == []


# -- coordination -----------------------------------------------------------------


def test_leases_and_membership(backend: StreamBackend, make_stream: MakeStream) -> None:
    s = make_stream(partitions=2)
    backend.create_group(s.name, "g", Start.beginning())
    assert backend.acquire(s.name, "g", 0, "a", ttl=0.5)
    assert backend.acquire(s.name, "g", 0, "a", ttl=0.5)  # renewal
    assert not backend.acquire(s.name, "g", 0, "b", ttl=0.5)
    assert backend.acquire(s.name, "g", 1, "b", ttl=0.5)
    backend.release(s.name, "g", 1, "b")
    assert backend.acquire(s.name, "g", 1, "a", ttl=0.5)
    time.sleep(0.7)
    assert backend.acquire(s.name, "g", 0, "b", ttl=5)  # a's lease lapsed
    assert backend.join(s.name, "g", "b", ttl=0.5) == ["b"]
    assert backend.join(s.name, "g", "a", ttl=5) == ["a", "b"]
    time.sleep(0.7)
    assert backend.join(s.name, "g", "a", ttl=5) == ["a"]
    backend.leave(s.name, "g", "a")
    assert backend.join(s.name, "g", "c", ttl=5) == ["c"]


# -- bad input --------------------------------------------------------------------


def test_unknown_group_and_stream_are_clear_errors(backend: StreamBackend, make_stream: MakeStream) -> None:
    s = make_stream()
    backend.append(s.name, events(2))
    backend.create_group(s.name, "billing", Start.beginning())
    with pytest.raises(NotFoundError, match=r"no consumer group 'biling' \(groups: billing\)"):
        backend.read(s.name, "biling", 0, "c1", max=1, ack_deadline=30, timeout=0.1)
    with pytest.raises(NotFoundError, match="biling"):
        backend.lag(s.name, "biling")
    with pytest.raises(NotFoundError, match="biling"):
        backend.seek(s.name, "biling", Start.beginning())
    with pytest.raises(NotFoundError, match="no stream named"):
        backend.append("no-such-stream-x", events(1))
    with pytest.raises(ConfigError, match="name"):
        backend.create_group(s.name, "bad group!", Start.beginning())
    with pytest.raises(ConfigError, match="partitions"):
        backend.ensure_stream(StreamConfig(s.name, partitions=4))
    # Nothing accepted was lost by the bad calls.
    assert [e.id for e in drain(backend, s.name, "billing", 1)] == ["e0", "e1"]


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("kafka://localhost:9092", "scheme 'kafka'"),
        ("sqlite://", "names no file"),
        ("natss://localhost:4222", "did you mean nats://"),
        ("", "not a URL"),
    ],
)
def test_bad_url_is_a_config_error(url: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        open_stream_backend(url)


def test_bad_start_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="offset"):
        Start.at(0)
    with pytest.raises(ConfigError, match="unix time"):
        Start.since(float("nan"))
    with pytest.raises(ConfigError, match="partitions"):
        StreamConfig("s", partitions=0)
    with pytest.raises(ConfigError, match="stream name"):
        StreamConfig("a.b")


@pytest.mark.parametrize("url", ["nats://127.0.0.1:1", "redis://127.0.0.1:1/0"])
def test_unreachable_server_is_a_clear_error(url: str) -> None:
    backend = open_stream_backend(url)
    try:
        with pytest.raises(BackendUnavailableError, match=r"127\.0\.0\.1:1"):
            backend.streams()
    finally:
        backend.close()
