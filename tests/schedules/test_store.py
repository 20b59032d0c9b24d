"""The schedule records, on every queue engine: the watermark only moves forward, whoever
writes it and in whatever order; records outlive the process that wrote them; a record
that is not Foundry's is skipped, never trusted."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from foundry.backends.queue import QueueBackend, open_queue_backend
from foundry.backends.queue.schedules import ScheduleRecord, schedule_store
from tests.backends.queue.engines import ENGINES, close, engine_url


@pytest.fixture(params=ENGINES)
def open_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], QueueBackend]]:
    """Backends on one private namespace of the engine ("processes"), all closed and the
    namespace removed afterwards."""
    url = engine_url(str(request.param), tmp_path)
    opened: list[QueueBackend] = []

    def open_one() -> QueueBackend:
        backend = open_queue_backend(url, home=tmp_path)
        opened.append(backend)
        return backend

    try:
        yield open_one
    finally:
        for backend in opened:
            backend.close()  # idempotent: a test may have closed one already
        close(open_queue_backend(url, home=tmp_path), url)  # and what they made is removed


def rec(name: str, tick: float, job: str = "j") -> ScheduleRecord:
    return ScheduleRecord(name, "every 1s", "UTC", tick, job, 1.0)


def test_the_watermark_only_moves_forward(open_backend: Callable[[], QueueBackend]) -> None:
    store = schedule_store(open_backend())
    assert store.get("report") is None
    assert store.advance(rec("report", 100.0, "a"))
    assert not store.advance(rec("report", 99.0, "older"))
    assert not store.advance(rec("report", 100.0, "same"))
    assert store.advance(rec("report", 101.0, "b"))
    assert store.get("report") == rec("report", 101.0, "b")
    assert store.advance(rec("other", 5.0))
    assert [r.name for r in store.records()] == ["other", "report"]


def test_racing_writers_converge_on_the_latest_tick(open_backend: Callable[[], QueueBackend]) -> None:
    # Given three "processes" writing interleaved ticks from threads of their own
    stores = [schedule_store(open_backend()) for _ in range(3)]
    wins: list[float] = []
    lock = threading.Lock()

    def write(i: int) -> None:
        for tick in range(i, 60, 3):
            if stores[i].advance(rec("race", float(tick), f"job-{tick}")):
                with lock:
                    wins.append(float(tick))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # Then the record holds the last tick, and every write that "won" moved it forward
    assert stores[0].get("race") == rec("race", 59.0, "job-59")
    assert 59.0 in wins
    assert len(wins) == len(set(wins))


def test_records_outlive_their_writer(open_backend: Callable[[], QueueBackend]) -> None:
    first = open_backend()
    schedule_store(first).advance(rec("nightly", 42.0, "j42"))
    first.close()
    assert schedule_store(open_backend()).get("nightly") == rec("nightly", 42.0, "j42")


def _write_garbage(backend: Any, store: Any) -> None:
    """A record that is not Foundry's, written straight into the engine."""
    if hasattr(store, "key"):  # Redis: the hash of records
        backend.client.hset(store.key, "forged", b"{not json")
        backend.client.hset(store.key, "listish", b"[1, 2]")
        return
    sql = f"INSERT INTO {store.table} VALUES (?, ?, ?, ?, ?, ?)"
    forged = ("forged", "x", "UTC", float("inf"), "j", 0.0)  # no tick is at infinity
    store._q.commit(lambda conn: store._q.execute(conn, sql, forged), lambda _: ())


def test_a_record_that_is_not_foundrys_is_skipped(open_backend: Callable[[], QueueBackend]) -> None:
    backend = open_backend()
    store = schedule_store(backend)
    store.advance(rec("real", 10.0))
    state = getattr(backend, "state", backend)  # RabbitMQ keeps records in its state store
    _write_garbage(state, schedule_store(state))
    assert [r.name for r in store.records()] == ["real"]
    assert store.get("forged") is None
