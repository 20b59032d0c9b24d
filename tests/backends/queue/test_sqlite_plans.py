"""The embedded queue's statements use the index that makes them O(batch), not
O(queue depth): SQLite's planner, left alone, scanned every queued job of a queue on
each claim probe (``min(eta)``) and on each RabbitMQ claim by id (``queue = ?`` chose
the ready index over the id index). Checked on the statements a real cycle runs."""

from __future__ import annotations

import re
import sqlite3
import time
import uuid
from pathlib import Path

import pytest

from foundry.backends.queue import sqlite as engine
from foundry.backends.queue._amqp_state import open_state
from foundry.backends.queue.base import NewJob, StateStore


def _plans(path: Path, statements: set[str]) -> dict[str, list[str]]:
    conn = sqlite3.connect(path)
    try:
        return {
            s: [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + s)]
            for s in statements
            if re.match(r"\s*(SELECT|UPDATE|DELETE)", s, re.I) and "sqlite_" not in s and "PRAGMA" not in s
        }
    finally:
        conn.close()


def test_claims_and_completions_never_scan_the_queue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: set[str] = set()
    connect = engine._File.connect

    def traced(self: engine._File, timeout: float) -> sqlite3.Connection:
        conn = connect(self, timeout)
        conn.set_trace_callback(seen.add)
        return conn

    monkeypatch.setattr(engine._File, "connect", traced)
    path = tmp_path / "q.db"
    backend = open_state(f"sqlite:///{path}", "plans")  # the engine, plus the RabbitMQ claim by id
    try:
        jobs = [NewJob(id=uuid.uuid4().hex, queue="q", unit="u", payload=b"{}") for _ in range(50)]
        backend.enqueue_many(jobs)
        backend.enqueue(NewJob(id="later", queue="q", unit="u", payload=b"{}", eta=time.time() + 60))
        claimed = backend.claim("q", "w", lease=30, limit=5, timeout=1)
        backend.complete_many([(c.id, c.token, b"1") for c in claimed])
        # (a first look claims without the probe; the look after an empty claim probes)
        assert backend.claim("none", "w", lease=30, limit=5, timeout=0) == []
        assert isinstance(backend, StateStore)  # the SQLite engine offers the RabbitMQ state store
        got, _ = backend.claim_ids("q", [j.id for j in jobs[10:15]], "w", 30)
        assert len(got) == 5
    finally:
        backend.close()
    plans = _plans(path, seen)
    assert plans, "no statements were traced"
    for statement, plan in plans.items():
        assert not any(step.startswith("SCAN") and "CONSTANT" not in step for step in plan), (statement, plan)
        if " id IN (" in statement and statement.startswith("UPDATE"):
            assert any("autoindex" in step for step in plan), (statement, plan)
    probes = [s for s in plans if "EXISTS (SELECT 1" in s]
    assert probes, "the claim probe did not run"
