"""A queue table made by an older Foundry (without the ``crashes`` and ``alone`` columns
that charge a worker's death to the job that ran alone, nor ``cancel_at``, a running
job's cancel request) is upgraded in place when a newer backend opens it: its queued
jobs are claimed, marked, cancelled and completed as usual, and new jobs — large
payloads too — are stored and read back intact.

SQLite has two older layouts: the first release's (the payload beside the unit) and the
one with the payload as the last column (so that a large payload is written in chunks).
The columns an upgrade adds go after the payload, so an upgraded file takes large
payloads as one bound parameter — slower, never wrong; a new file keeps the payload last."""

from __future__ import annotations

import re
import sqlite3
import uuid
from pathlib import Path

import pytest

from foundry.backends.queue import CancelResult, JobStatus, NewJob, open_queue_backend
from foundry.backends.queue import postgres as pg_engine
from foundry.backends.queue import sqlite as sqlite_engine
from tests.backends.queue._helpers import expect
from tests.backends.queue.engines import close, engine_url

BIG = 3 * (1 << 20) + 7  # over SQLite's chunked-write threshold, not a multiple of the chunk


def older(ddl: str, *, payload_beside_unit: bool = False) -> list[str]:
    """The DDL as it was before the columns were added (their lines taken out); with
    ``payload_beside_unit``, the first release's order (the payload after ``unit``)."""
    lines = [re.sub(r"\s*--.*$", "", line) for line in ddl.split("\n")]
    lines = [line for line in lines if not re.match(r"\s*(crashes|alone|cancel_at) ", line)]
    if payload_beside_unit:
        [payload] = [line for line in lines if re.match(r"\s*payload ", line)]
        lines.remove(payload)
        at = next(i for i, line in enumerate(lines) if re.match(r"\s*unit ", line))
        lines.insert(at + 1, payload.rstrip(",") + ",")
    text = re.sub(r",\s*\n\);", "\n);", "\n".join(lines))
    assert "crashes" not in text
    assert "alone" not in text
    assert "cancel_at" not in text
    return [s.replace("{jobs}", "foundry_jobs") for s in text.split(";") if s.strip()]


def _columns(path: str) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [row[1] for row in conn.execute("PRAGMA table_info(foundry_jobs)")]
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("engine", "layout"),
    [("sqlite", "payload-beside-unit"), ("sqlite", "payload-last"), ("postgres", "postgres")],
)
def test_an_older_table_is_upgraded_on_open(engine: str, layout: str, tmp_path: Path) -> None:
    url = engine_url(engine, tmp_path)
    job_id = uuid.uuid4().hex
    row = (job_id, "q", "u", b"{}", "json", 0, 0.0, "queued", 0.0, 0, 0, 0, 5, 604800.0, 1.0)
    insert = (
        "INSERT INTO foundry_jobs (id, queue, unit, payload, codec, priority, eta, status, lease_until, "
        "deliveries, attempts, max_retries, max_deliveries, result_ttl, enqueued_at) VALUES "
    )
    # Given a table made by the older DDL, holding a queued job
    if engine == "sqlite":
        path = url[len("sqlite:///") :]
        conn = sqlite3.connect(path)
        for statement in older(sqlite_engine._DDL, payload_beside_unit=layout == "payload-beside-unit"):
            conn.execute(statement)
        conn.execute(insert + "(" + ", ".join("?" * len(row)) + ")", row)
        conn.commit()
        conn.close()
        assert "crashes" not in _columns(path)
    else:
        import psycopg

        base, query = url.split("?", 1)
        schema = dict(p.split("=", 1) for p in query.split("&"))["schema"]
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
            conn.execute(f'SET search_path TO "{schema}"')
            for statement in older(pg_engine._DDL):
                conn.execute(statement)
            conn.execute(insert + "(" + ", ".join(["%s"] * len(row)) + ")", row)
    # When a newer backend opens it
    backend = open_queue_backend(url)
    try:
        # Then the job is claimed, marked alone and completed
        [c] = backend.claim("q", "w", lease=30, limit=1, timeout=5)
        assert c.id == job_id
        assert backend.mark_alone(c.id, c.token)
        assert backend.complete(c.id, c.token, b"1")
        state = backend.get(job_id)
        assert state is not None
        assert state.status is JobStatus.SUCCEEDED
        # And new jobs, a small and a large payload, go in and come out intact
        small, big = uuid.uuid4().hex, uuid.uuid4().hex
        payload = bytes(range(256)) * (BIG // 256) + b"x" * (BIG % 256)
        backend.enqueue(NewJob(id=small, queue="q", unit="u", payload=b"{}"))
        backend.enqueue(NewJob(id=big, queue="q", unit="u", payload=payload))
        got = {c.id: c for c in backend.claim("q", "w", lease=30, limit=5, timeout=5)}
        assert set(got) == {small, big}
        assert got[small].payload == b"{}"
        assert got[big].payload == payload
        assert backend.mark_alone(big, got[big].token)
        state = backend.wait(big, 0.1)
        assert state is not None
        assert state.payload is None  # ``wait`` reads the state without the payload
        assert state.status is JobStatus.RUNNING
        assert backend.cancel(small) is CancelResult.REQUESTED
        assert backend.cancel_requests([small, big], timeout=5) == [small]
        assert not backend.complete(small, got[small].token, b"1")
        expect(backend.get(small), JobStatus.CANCELLED)
        if engine == "sqlite":
            columns = _columns(path)
            assert columns[-3:] == ["crashes", "alone", "cancel_at"]  # added after the payload
            assert isinstance(backend, sqlite_engine.SqliteQueue)
            assert not backend._chunked_payload  # a reserved blob would not be last: bound instead
    finally:
        close(backend, url)


def test_a_new_sqlite_table_keeps_the_payload_last_and_writes_large_ones_in_chunks(tmp_path: Path) -> None:
    url = engine_url("sqlite", tmp_path)
    backend = open_queue_backend(url)
    try:
        path = url[len("sqlite:///") :]
        columns = _columns(path)
        # Then the columns of both changes are there, the payload last
        assert {"crashes", "alone", "cancel_at"} <= set(columns)
        assert columns[-1] == "payload"
        assert isinstance(backend, sqlite_engine.SqliteQueue)
        assert backend._chunked_payload
        # And a large payload goes in (in chunks) and comes out intact
        payload = bytes(range(256)) * (BIG // 256) + b"y" * (BIG % 256)
        job_id = uuid.uuid4().hex
        assert backend.enqueue(NewJob(id=job_id, queue="q", unit="u", payload=payload)).created
        assert not backend.enqueue(NewJob(id=job_id, queue="q", unit="u", payload=payload)).created
        [c] = backend.claim("q", "w", lease=30, limit=1, timeout=5)
        assert c.payload == payload
        # And opening it again neither adds nor moves a column
        again = open_queue_backend(url)
        again.close()
        assert _columns(path) == columns
    finally:
        close(backend, url)
