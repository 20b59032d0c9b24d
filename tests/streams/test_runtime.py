"""The stream runtime: publish, consumer groups, per-key order, retries, dead letters,
replay, lag, bad input — through ``app.stream`` as a user writes it."""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from foundry import Foundry
from foundry.backends.stream import NewEvent
from foundry.deliver.stream import Idempotency, StreamEvent
from foundry.errors import (
    DeclarationError,
    NotFoundError,
    PayloadTooLargeError,
    SubmitError,
    UnknownTraitError,
)
from foundry.observe import names
from tests.streams.conftest import app_factory, unique

MakeApp = Callable[..., Foundry]


@pytest.fixture
def make_app(tmp_path: Path) -> Iterator[MakeApp]:
    """Apps on a given stream URL (default: a SQLite file in tmp_path); their streams are
    deleted from the server afterwards."""
    yield from app_factory(tmp_path)


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, int, int]] = []  # (key, n, deliveries)
        self.lock = threading.Lock()

    def __call__(self, event: StreamEvent) -> None:
        with self.lock:
            self.seen.append((event["k"], event["n"], event.deliveries))

    def per_key(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = collections.defaultdict(list)
        for key, n, _ in self.seen:
            out[key].append(n)
        return out


def workload(count: int, keys: int) -> list[dict[str, Any]]:
    return [{"k": f"key-{i % keys}", "n": i} for i in range(count)]


def test_per_key_order_with_several_consumers_per_group(make_app: MakeApp, backend_url: str) -> None:
    app = make_app(backend_url)
    s = app.stream(unique("orders"), key="k", partitions=4)
    a, b = Recorder(), Recorder()
    # No consumer dies here: a session long enough that a loaded machine's pauses do not
    # expire one (that would be a legitimate redelivery, and this test counts exactly once).
    s.consumer(group="a", batch=16, session="10s")(a)
    s.consumer(group="b", batch=7, session="10s")(b)
    events = workload(400, keys=13)
    s.publish_many(events, ids=[f"e{e['n']}" for e in events])
    # Three consumers per group share four partitions; both groups see everything.
    s.drain(timeout=60, consumers=3)
    for recorder in (a, b):
        per_key = recorder.per_key()
        assert sorted(n for ns in per_key.values() for n in ns) == list(range(400))
        for key, ns in per_key.items():
            assert ns == sorted(ns), f"{key} out of order: {ns}"
    assert all(p.lag == 0 and p.pending == 0 for p in s.lag("a"))


def test_apublish_on_the_callers_loop_is_consumed_exactly_once(make_app: MakeApp, backend_url: str) -> None:
    app = make_app(backend_url)
    s = app.stream(unique("async"), key="k", partitions=2)
    seen: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    @s.consumer(group="g", batch=8)
    def handle(event: StreamEvent) -> None:
        with lock:
            seen[event.id] += 1

    events = workload(30, keys=4)
    ids = [f"e{e['n']}" for e in events]

    async def produce() -> tuple[list[Any], list[Any]]:
        # One at a time, then the rest as a batch, then the first ten again (a retry).
        first = [await s.apublish(e, id=i) for e, i in zip(events[:10], ids[:10], strict=True)]
        rest = await s.apublish_many(events[10:], ids=ids[10:])
        again = await s.apublish_many(events[:10], ids=ids[:10])
        return first + rest, again

    published, again = asyncio.run(produce())
    # A second loop (another asyncio.run) publishes too, beside a synchronous publish.
    late = asyncio.run(s.apublish({"k": "key-9", "n": 30}, id="e30"))
    s.publish({"k": "key-9", "n": 31}, id="e31")
    assert [p.id for p in published] == ids
    assert not any(p.duplicate for p in published)
    assert all(p.duplicate for p in again)
    assert not late.duplicate
    assert [p.partition for p in again] == [p.partition for p in published[:10]]
    # Every event is handled exactly once, and the published count holds no duplicate.
    s.drain(timeout=60)
    assert seen == collections.Counter([*ids, "e30", "e31"])
    assert app.metrics.value(names.STREAM_PUBLISHED, stream=s.name) == 32
    # Bad input is refused before anything is sent, as publish does.
    with pytest.raises(SubmitError, match="no field 'k'"):
        asyncio.run(s.apublish_many([{"k": "x", "n": 1}, {"n": 2}]))
    assert sum(p.end for p in s.lag("g")) == 32


def test_failing_event_is_retried_in_place_then_dead_lettered(make_app: MakeApp) -> None:
    app = make_app()
    s = app.stream(unique("pay"), key="k")
    seen: list[tuple[int, int]] = []
    fails = {1: 2}  # event n=1 fails twice, then succeeds; n=3 always fails

    @s.consumer(group="g", max_deliveries=3, retry_backoff="10ms")
    def handle(event: StreamEvent) -> None:
        seen.append((event["n"], event.deliveries))
        if event["n"] == 3 or fails.get(event["n"], 0) >= event.deliveries:
            raise ValueError(f"cannot take {event['n']}")

    s.publish_many([{"k": "same", "n": n} for n in range(6)])
    s.drain(timeout=30)
    # The events after a failing one wait for it: the order per key holds.
    assert seen == [(0, 1), (1, 1), (1, 2), (1, 3), (2, 1), (3, 1), (3, 2), (3, 3), (4, 1), (5, 1)]
    [dead] = s.dead_letters("g")
    assert (dead.offset, dead.deliveries) == (4, 3)
    assert "ValueError: cannot take 3" in dead.reason
    assert "max_deliveries=3" in dead.reason
    assert dead.error is not None
    assert "ValueError" in dead.error
    assert dead.payload == b'{"k":"same","n":3}'
    assert app.metrics.value(names.STREAM_DEAD, group="g") == 1


def test_events_of_a_dead_consumer_are_redelivered_in_order_after_the_deadline(make_app: MakeApp) -> None:
    app = make_app()
    s = app.stream(unique("crash"), key="k")
    rec = Recorder()
    s.consumer(group="g", ack_deadline="300ms", batch=50)(rec)
    s.publish_many(workload(30, keys=3))
    s.runtime.ensure_group("g")
    # Given a consumer that read 10 events and died without committing ...
    backend = s.runtime.backend
    ghost = backend.read(s.name, "g", 0, "ghost", max=10, ack_deadline=0.3, timeout=1)
    assert len(ghost) == 10
    # ... when a live consumer runs, it gets them back first, then the rest, in order.
    s.drain(timeout=30)
    assert [n for _, n, _ in rec.seen] == list(range(30))
    assert [d for _, _, d in rec.seen[:10]] == [2] * 10
    assert [d for _, _, d in rec.seen[10:]] == [1] * 20
    assert app.metrics.value(names.STREAM_REDELIVERED, group="g") == 10


def test_event_that_keeps_killing_its_consumer_is_dead_lettered(make_app: MakeApp) -> None:
    app = make_app()
    s = app.stream(unique("poison"), key="k")
    rec = Recorder()
    s.consumer(group="g", ack_deadline="200ms", max_deliveries=2)(rec)
    s.publish_many(workload(5, keys=1))
    s.runtime.ensure_group("g")
    backend = s.runtime.backend
    # Offset 1 was delivered twice and never acknowledged (its consumer died both times).
    for _ in range(2):
        got: list[Any] = []
        until = time.monotonic() + 5
        while not got and time.monotonic() < until:
            got = backend.read(s.name, "g", 0, "ghost", max=1, ack_deadline=0.2, timeout=0.3)
        assert [e.offset for e in got] == [1]
    s.drain(timeout=30)
    assert [n for _, n, _ in rec.seen] == [1, 2, 3, 4]  # the poison is skipped, nothing else
    [dead] = s.dead_letters("g")
    assert (dead.offset, dead.deliveries) == (1, 3)
    assert "without an acknowledgement" in dead.reason


def test_malformed_events_are_rejected_and_nothing_is_lost(make_app: MakeApp, backend_url: str) -> None:
    app = make_app(backend_url)
    s = app.stream(unique("bad"), key="session_id")
    rec: list[str] = []
    s.consumer(group="g")(lambda e: rec.append(e["session_id"]))
    s.publish({"session_id": "s1"}, id="ok-1")
    with pytest.raises(SubmitError, match="not JSON-compatible"):
        s.publish({"session_id": "s1", "when": object()})
    with pytest.raises(SubmitError, match="not JSON-compatible"):  # one bad event rejects the batch
        s.publish_many([{"session_id": "s2"}, {"session_id": "s3", "x": {1, 2}}])
    with pytest.raises(SubmitError, match="no field 'session_id'"):
        s.publish({"user": "u"})
    with pytest.raises(SubmitError, match="not a string or an integer"):
        s.publish({"session_id": ["a"]})
    with pytest.raises(SubmitError, match="event id"):
        s.publish({"session_id": "s1"}, id="")
    with pytest.raises(PayloadTooLargeError, match="bytes"):
        s.publish({"session_id": "s1", "blob": "x" * (1024 * 1024 + 1)})
    s.publish({"session_id": "s4"}, id="ok-2")
    # Bytes that are not an event (another producer wrote them) are dead-lettered at once.
    s.runtime.backend.append(s.name, [NewEvent("raw-1", b"\xff not json", key="s5")])
    s.publish({"session_id": "s5"}, id="ok-3")
    s.drain(timeout=30)
    assert rec == ["s1", "s4", "s5"]
    [dead] = s.dead_letters("g")
    assert dead.id == "raw-1"
    assert dead.deliveries == 1
    assert "not valid json" in dead.reason


def test_unknown_group_is_a_clear_error(make_app: MakeApp) -> None:
    app = make_app()
    s = app.stream(unique("g"), key="k")
    s.consumer(group="billing")(lambda e: None)
    s.publish({"k": "a"})
    with pytest.raises(NotFoundError, match=r"no consumer for group 'biling'.*groups: billing"):
        s.run(["biling"])
    s.drain(timeout=30)
    with pytest.raises(NotFoundError, match="no consumer group 'biling'"):
        s.replay("biling", offset=1)
    with pytest.raises(NotFoundError, match="biling"):
        s.lag("biling")
    with pytest.raises(SubmitError, match="exactly one of offset= or time="):
        s.replay("billing")


def test_declaration_errors() -> None:
    app = Foundry("decl")
    with pytest.raises(DeclarationError, match="partitions"):
        app.stream("x1", partitions=0)
    with pytest.raises(DeclarationError, match="stream name"):
        app.stream("bad name")
    with pytest.raises(UnknownTraitError, match="retension"):
        app.stream("x2", retension="7d")
    with pytest.raises(DeclarationError, match="retention"):
        app.stream("x3", retention="forever")
    s = app.stream("x4", key="k")
    with pytest.raises(DeclarationError, match="ack_deadline"):
        s.consumer(group="g", ack_deadline="soon")
    with pytest.raises(DeclarationError, match="start"):
        s.consumer(group="g", start="yesterday")
    with pytest.raises(DeclarationError, match="max_deliveries"):
        s.consumer(group="g", max_deliveries=0)
    with pytest.raises(DeclarationError, match="group"):
        s.consumer(group="a.b")
    s.consumer(group="g")(lambda e: None)
    with pytest.raises(DeclarationError, match="already has a handler"):
        s.consumer(group="g")(lambda e: None)
    assert s.decision.delivery == "stream"


def test_replay_from_offset_and_time_and_a_group_at_the_end(make_app: MakeApp) -> None:
    app = make_app()
    s = app.stream(unique("replay"), key="k", partitions=2)
    billing, late = Recorder(), Recorder()
    s.consumer(group="billing")(billing)
    s.consumer(group="late", start="end")(late)
    s.publish_many(workload(10, keys=2))
    s.drain(["billing"], timeout=30)
    s.runtime.ensure_group("late")  # created now: it starts after the first ten
    time.sleep(0.2)
    boundary = time.time()
    time.sleep(0.2)
    s.publish_many([{"k": f"key-{i % 2}", "n": i} for i in range(10, 14)])
    s.drain(timeout=30)
    assert sorted(n for _, n, _ in late.seen) == [10, 11, 12, 13]
    billing.seen.clear()
    s.replay("billing", time=boundary)
    s.drain(["billing"], timeout=30)
    assert sorted(n for _, n, _ in billing.seen) == [10, 11, 12, 13]
    billing.seen.clear()
    s.replay("billing", offset=1)
    s.drain(["billing"], timeout=30)
    assert sorted(n for _, n, _ in billing.seen) == list(range(14))


def test_lag_metrics_backpressure_and_async_handlers(make_app: MakeApp) -> None:
    app = make_app()
    s = app.stream(unique("lag"), key="k", partitions=2)
    peak = [0.0]
    in_flight = app.metrics.gauge(names.STREAM_IN_FLIGHT, "", ("stream", "group")).labels(s.name, "g")

    @s.consumer(group="g", batch=100, max_in_flight=4)
    async def handle(event: StreamEvent) -> None:
        peak[0] = max(peak[0], in_flight.value)
        await asyncio.sleep(0)

    appended = s.publish_many(workload(40, keys=5))
    s.runtime.ensure_group("g")
    lags = {
        r["labels"]["partition"]: r["value"]
        for r in app.metrics.snapshot()[names.STREAM_CONSUMER_LAG]
        if r["labels"]["stream"] == s.name
    }
    assert lags == {str(p): float(sum(1 for a in appended if a.partition == p)) for p in range(2)}
    s.drain(timeout=30)
    assert 1 <= peak[0] <= 4  # never more than max_in_flight read ahead of the handler
    assert app.metrics.value(names.STREAM_CONSUMED, stream=s.name, group="g") == 40
    assert app.metrics.value(names.STREAM_PUBLISHED, stream=s.name) == 40
    assert "foundry_stream_consumer_lag{" in app.metrics.prometheus()


def test_graceful_stop_keeps_the_position(make_app: MakeApp) -> None:
    app = make_app()
    s = app.stream(unique("stop"), key="k")
    rec = Recorder()
    gate = threading.Event()

    @s.consumer(group="g", batch=5)
    def handle(event: StreamEvent) -> None:
        rec(event)
        if event["n"] == 7:
            gate.set()

    s.publish_many(workload(50, keys=2))
    consumers = s.run()
    assert gate.wait(10)
    consumers.stop()
    handled = len(rec.seen)
    assert handled >= 8
    assert not consumers.alive
    s.drain(timeout=30)
    assert [n for _, n, _ in rec.seen] == list(range(50))  # no loss, no duplicate on restart


def test_idempotency_records_ids_with_the_effect(tmp_path: Path) -> None:
    from foundry.backends.stream import Event

    idem = Idempotency(tmp_path / "idem.db")
    try:
        event = StreamEvent(Event("s", 0, 1, "evt-1", "k", b"{}", 0.0), "billing", {})
        with idem.transaction() as tx:
            tx.execute("CREATE TABLE effects (id TEXT)")

        def crash_before_commit() -> None:
            with idem.once(event) as tx:
                assert tx is not None
                tx.execute("INSERT INTO effects VALUES ('evt-1')")
                raise RuntimeError("crash before commit")

        with pytest.raises(RuntimeError):
            crash_before_commit()
        assert not idem.seen("billing", "evt-1")  # the record rolled back with the effect
        for _ in range(3):
            with idem.once(event) as tx:
                if tx is not None:
                    tx.execute("INSERT INTO effects VALUES ('evt-1')")
        with idem.transaction() as tx:
            assert tx.execute("SELECT count(*) FROM effects").fetchone()[0] == 1
        assert idem.seen("billing", "evt-1")
        assert not idem.seen("other", "evt-1")
        assert idem.forget("billing") == 1
    finally:
        idem.close()


def test_a_work_unit_decided_as_stream_runs_in_key_order(make_app: MakeApp) -> None:
    app = make_app()
    done: list[tuple[str, int]] = []

    @app.work(ordered=True, durable=True, key="account")
    def apply(account: str, amount: int) -> int:
        done.append((account, amount))
        return amount * 2

    assert apply.decision.delivery == "stream"
    handles = [apply.submit(f"acct-{i % 3}", i) for i in range(12)]
    assert [h.result(timeout=30) for h in handles] == [i * 2 for i in range(12)]
    for account in ("acct-0", "acct-1", "acct-2"):
        amounts = [a for acc, a in done if acc == account]
        assert amounts == sorted(amounts)
    with pytest.raises(SubmitError, match="did not pass"):
        apply.submit(amount=3)
