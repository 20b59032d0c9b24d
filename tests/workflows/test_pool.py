"""The bounded connection pool of the SQL journal and queue engines
(``foundry/backends/journal/_pool.py``): a dropped connection flushes the idle ones,
because after a server restart they are all dead and each would cost a caller one
failed attempt. Unit tests on fake connections, and one on PostgreSQL whose server
connections are terminated from outside (what a restart does to them)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from foundry.backends._pool import Pool
from foundry.backends.journal import JournalBackend, open_journal
from foundry.backends.journal.base import NewWorkflow
from foundry.errors import BackendUnavailableError
from tests.workflows.conftest import drop_schema, make_url


class Conn:
    def __init__(self, n: int) -> None:
        self.n = n
        self.broken = False
        self.closed = False


class Fakes:
    def __init__(self) -> None:
        self.made: list[Conn] = []

    def connect(self) -> Conn:
        self.made.append(Conn(len(self.made)))
        return self.made[-1]

    def pool(self, size: int = 3) -> Pool[Conn]:
        def close(conn: Conn) -> None:
            conn.closed = True

        return Pool(self.connect, close, size=size, timeout=1.0, broken=lambda c: c.broken, what="test pool")


def _fill(pool: Pool[Conn], n: int) -> list[Conn]:
    conns = [pool.acquire() for _ in range(n)]
    for conn in conns:
        pool.release(conn, check=False)
    return conns


def test_a_broken_connection_flushes_the_idle_ones() -> None:
    fakes = Fakes()
    pool = fakes.pool()
    first = _fill(pool, 3)
    conn = pool.acquire()
    conn.broken = True
    pool.release(conn, check=True)
    assert all(c.closed for c in first)  # the one that failed and the two idle ones
    fresh = pool.acquire()
    assert fresh not in first
    assert len(fakes.made) == 4


def test_a_failure_that_is_not_a_dropped_connection_keeps_them() -> None:
    fakes = Fakes()
    pool = fakes.pool()
    first = _fill(pool, 3)
    conn = pool.acquire()
    pool.release(conn, check=True)  # an error in the caller's code: the connection is fine
    assert not any(c.closed for c in first)
    assert pool.acquire() is conn
    assert len(fakes.made) == 3


def test_connections_in_use_elsewhere_are_not_touched_and_capacity_is_kept() -> None:
    fakes = Fakes()
    pool = fakes.pool(size=3)
    a, b, c = (pool.acquire() for _ in range(3))
    pool.release(c, check=False)
    b.broken = True
    pool.release(b, check=True)  # flushes c (idle), not a (in use)
    assert c.closed
    assert b.closed
    assert not a.closed
    got = [pool.acquire(), pool.acquire()]  # two slots free again, no wait
    assert all(g not in (a, b, c) for g in got)
    with pytest.raises(Exception, match="stayed busy"):
        pool.acquire()  # a and the two new ones: the bound holds
    pool.release(a, check=False)
    pool.close()


@pytest.fixture
def pg_journal(tmp_path: Path) -> Iterator[tuple[JournalBackend, str, str]]:
    url, schema = make_url("postgres", tmp_path)
    assert schema is not None
    # application_name goes to libpq: it tells this journal's connections from any other
    journal = open_journal(f"{url}{'&' if '?' in url else '?'}pool=4&application_name={schema}")
    try:
        yield journal, url.split("?", 1)[0], schema
    finally:
        journal.close()
        assert schema is not None
        drop_schema(url.split("?", 1)[0], schema)


def test_after_its_connections_are_killed_a_journal_fails_once_not_once_per_connection(
    pg_journal: tuple[JournalBackend, str, str],
) -> None:
    import psycopg

    journal, base, schema = pg_journal
    wid = f"wf-{uuid.uuid4().hex[:8]}"
    journal.start(NewWorkflow(wid, "wf", b"{}"))
    barrier = threading.Barrier(4)

    def hold() -> None:  # four connections held at once: the pool opens all four
        with journal._pool.connection():  # type: ignore[attr-defined]  # (reads alone may reuse one)
            barrier.wait(10)
        assert journal.get(wid) is not None

    threads = [threading.Thread(target=hold) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    with psycopg.connect(base, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s AND state = 'idle' AND query NOT ILIKE 'LISTEN%%'",
            (schema,),
        ).fetchone()
    assert killed is not None
    assert killed[0] >= 2  # enough dead ones to fail more than once without the flush
    failures = 0
    for _ in range(6):
        try:
            assert journal.get(wid) is not None
        except BackendUnavailableError:
            failures += 1
    assert failures <= 1, f"{failures} calls failed on dead pooled connections"
