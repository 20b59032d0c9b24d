"""The SQLite log's format: a file written by an older Foundry (format 1: events and their
dedup rows keyed by the stream's name) is migrated when it is opened — events, offsets,
pending windows, dead letters and dedup records all kept — exactly once even when two
processes open it at the same moment; a file of a newer format is refused, unchanged.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from foundry.backends.stream import NewEvent, Start
from foundry.backends.stream.sqlite import FORMAT, SqliteStreamBackend
from foundry.errors import ConfigError

# The tables as format 1 made them (Foundry before 2026-12-07), with the trace column.
_V1 = """
CREATE TABLE fs_streams (
    name TEXT PRIMARY KEY, partitions INTEGER NOT NULL, max_age REAL, max_events INTEGER,
    max_bytes INTEGER, dedup_window REAL NOT NULL, created REAL NOT NULL
);
CREATE TABLE fs_parts (
    stream TEXT NOT NULL, part INTEGER NOT NULL, first INTEGER NOT NULL, last INTEGER NOT NULL,
    cum INTEGER NOT NULL, last_ts REAL NOT NULL, PRIMARY KEY (stream, part)
) WITHOUT ROWID;
CREATE TABLE fs_events (
    stream TEXT NOT NULL, part INTEGER NOT NULL, off INTEGER NOT NULL, id TEXT NOT NULL,
    key TEXT, ts REAL NOT NULL, cum INTEGER NOT NULL, payload BLOB NOT NULL,
    trace TEXT, PRIMARY KEY (stream, part, off)
) WITHOUT ROWID;
CREATE TABLE fs_dedup (
    stream TEXT NOT NULL, id TEXT NOT NULL, part INTEGER NOT NULL, off INTEGER NOT NULL,
    ts REAL NOT NULL, PRIMARY KEY (stream, id)
) WITHOUT ROWID;
CREATE TABLE fs_groups (
    stream TEXT NOT NULL, grp TEXT NOT NULL, part INTEGER NOT NULL, committed INTEGER NOT NULL,
    delivered INTEGER NOT NULL, created REAL NOT NULL, PRIMARY KEY (stream, grp, part)
) WITHOUT ROWID;
CREATE TABLE fs_pending (
    stream TEXT NOT NULL, grp TEXT NOT NULL, part INTEGER NOT NULL, lo INTEGER NOT NULL,
    hi INTEGER NOT NULL, deliveries INTEGER NOT NULL, deadline REAL NOT NULL, consumer TEXT NOT NULL,
    PRIMARY KEY (stream, grp, part, lo)
) WITHOUT ROWID;
CREATE TABLE fs_dead (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, stream TEXT NOT NULL, grp TEXT NOT NULL,
    part INTEGER NOT NULL, off INTEGER NOT NULL, last_off INTEGER, id TEXT NOT NULL, key TEXT,
    payload BLOB, reason TEXT NOT NULL, error TEXT, deliveries INTEGER NOT NULL, dead_at REAL NOT NULL
);
CREATE INDEX fs_dead_group ON fs_dead (stream, grp, seq);
CREATE TABLE fs_members (
    stream TEXT NOT NULL, grp TEXT NOT NULL, consumer TEXT NOT NULL, expires REAL NOT NULL,
    PRIMARY KEY (stream, grp, consumer)
) WITHOUT ROWID;
CREATE TABLE fs_leases (
    stream TEXT NOT NULL, grp TEXT NOT NULL, part INTEGER NOT NULL, owner TEXT NOT NULL,
    expires REAL NOT NULL, PRIMARY KEY (stream, grp, part)
) WITHOUT ROWID;
"""

TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def v1_file(path: Path) -> None:
    """A format-1 log as the old append, read and retention left it: stream ``orders``
    (2 partitions, dedup window 60 s) with events 1..5 on partition 0 (event 1 removed by
    retention, its dedup row kept) and 1..3 on partition 1, plus a second stream
    ``audit``; group ``billing`` committed 3 / 1, partition 1's 2..3 pending; one dead letter."""
    now = time.time()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(_V1)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("BEGIN")
    conn.execute("INSERT INTO fs_streams VALUES ('orders', 2, NULL, NULL, NULL, 60.0, ?)", (now,))
    conn.execute("INSERT INTO fs_streams VALUES ('audit', 1, NULL, NULL, NULL, 60.0, ?)", (now,))
    conn.execute("INSERT INTO fs_parts VALUES ('orders', 0, 2, 5, 50, ?)", (now,))
    conn.execute("INSERT INTO fs_parts VALUES ('orders', 1, 1, 3, 30, ?)", (now,))
    conn.execute("INSERT INTO fs_parts VALUES ('audit', 0, 1, 1, 10, ?)", (now,))
    for part, offsets in ((0, range(1, 6)), (1, range(1, 4))):
        for off in offsets:
            ident = f"p{part}-{off}"
            if (part, off) != (0, 1):  # retention removed it; its dedup row stays
                conn.execute(
                    "INSERT INTO fs_events VALUES ('orders', ?, ?, ?, ?, ?, ?, ?, ?)",
                    (part, off, ident, f"k{part}", now, 10 * off, f'{{"n":{off}}}'.encode(), TRACE),
                )
            conn.execute("INSERT INTO fs_dedup VALUES ('orders', ?, ?, ?, ?)", (ident, part, off, now))
    conn.execute("INSERT INTO fs_events VALUES ('audit', 0, 1, 'a1', NULL, ?, 10, x'7b7d', NULL)", (now,))
    conn.execute("INSERT INTO fs_dedup VALUES ('audit', 'a1', 0, 1, ?)", (now,))
    conn.execute("INSERT INTO fs_groups VALUES ('orders', 'billing', 0, 3, 3, ?)", (now,))
    conn.execute("INSERT INTO fs_groups VALUES ('orders', 'billing', 1, 1, 3, ?)", (now,))
    conn.execute("INSERT INTO fs_pending VALUES ('orders', 'billing', 1, 2, 3, 1, ?, 'gone')", (now - 1,))
    conn.execute(
        "INSERT INTO fs_dead (stream, grp, part, off, id, key, payload, reason, deliveries, dead_at) "
        "VALUES ('orders', 'billing', 0, 1, 'p0-1', 'k0', x'7b7d', 'handler raised', 3, ?)",
        (now,),
    )
    conn.execute("COMMIT")
    conn.close()


def file_format(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT value FROM fs_meta WHERE name='format'").fetchone()[0])
    finally:
        conn.close()


def test_a_format_1_file_is_migrated_on_open(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    v1_file(path)
    backend = SqliteStreamBackend(f"sqlite:///{path}")
    try:
        assert backend.migrated_from == 1
        assert file_format(path) == FORMAT
        # Every stream, event, offset, pending window and dead letter is where it was ...
        assert backend.streams() == ["audit", "orders"]
        info = backend.info("orders")
        assert (info.first, info.last, info.groups) == ((2, 1), (5, 3), ("billing",))
        assert [(p.committed, p.pending) for p in backend.lag("orders", "billing")] == [(3, 0), (1, 2)]
        got = backend.read("orders", "billing", 0, "c", max=10, ack_deadline=30, timeout=0)
        assert [(e.offset, e.id, e.key, e.payload, e.trace) for e in got] == [
            (off, f"p0-{off}", "k0", f'{{"n":{off}}}'.encode(), TRACE) for off in (4, 5)
        ]
        redelivered = backend.read("orders", "billing", 1, "c", max=10, ack_deadline=30, timeout=0)
        assert [(e.offset, e.deliveries) for e in redelivered] == [(2, 2), (3, 2)]
        assert [(d.id, d.reason) for d in backend.dead_letters("orders")] == [("p0-1", "handler raised")]
        backend.commit("orders", "billing", 1, 3)
        assert backend.lag("orders", "billing")[1].committed == 3
        # ... dedup still knows every id of the window, the one retention removed included ...
        again = backend.append(
            "orders", [NewEvent("p0-1", b"{}", key="k0"), NewEvent("p1-2", b"{}", key="k1")]
        )
        assert [(a.duplicate, a.partition, a.offset) for a in again] == [(True, 0, 1), (True, 1, 2)]
        assert backend.append("audit", [NewEvent("a1", b"{}")])[0].duplicate
        # ... and the log goes on after its last offsets.
        fresh = backend.append("orders", [NewEvent("fresh", b"{}", key="k0")])[0]
        assert not fresh.duplicate
        assert fresh.offset == {0: 6, 1: 4}[fresh.partition]
        backend.create_group("audit", "g", Start.beginning())
        assert [e.id for e in backend.read("audit", "g", 0, "c", max=5, ack_deadline=30, timeout=0)] == ["a1"]
    finally:
        backend.close()
    # Opened again: already the current format, nothing to do.
    again_backend = SqliteStreamBackend(f"sqlite:///{path}")
    try:
        assert again_backend.migrated_from == FORMAT
        assert again_backend.info("orders").last[0] >= 5
    finally:
        again_backend.close()


def test_a_new_file_gets_the_current_format(tmp_path: Path) -> None:
    backend = SqliteStreamBackend(f"sqlite:///{tmp_path / 'new.db'}")
    backend.close()
    assert backend.migrated_from == 0
    assert file_format(tmp_path / "new.db") == FORMAT


def test_a_newer_format_is_refused_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "newer.db"
    SqliteStreamBackend(f"sqlite:///{path}").close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE fs_meta SET value=? WHERE name='format'", (FORMAT + 1,))
    conn.close()
    with pytest.raises(ConfigError, match=rf"{path}.*format {FORMAT + 1}, newer.*Fix: upgrade"):
        SqliteStreamBackend(f"sqlite:///{path}")
    assert file_format(path) == FORMAT + 1


_OPEN = """
import sys
from foundry.backends.stream.sqlite import SqliteStreamBackend
b = SqliteStreamBackend("sqlite:///" + sys.argv[1])
print(b.migrated_from, b.info("orders").events, flush=True)
b.close()
"""


def test_two_processes_opening_an_old_file_migrate_it_once(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    v1_file(path)
    # Given two processes that open the format-1 file at the same moment ...
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _OPEN, str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = []
    for child in children:
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        outputs.append(out.split())
    # ... one migrated it and the other found it migrated; every event is there once.
    assert sorted(o[0] for o in outputs) == ["1", str(FORMAT)]
    assert [o[1] for o in outputs] == ["7", "7"]
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT count(*) FROM fs_events").fetchone()[0] == 8
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert not {"fs_events_v1", "fs_streams_v1", "fs_dedup_v1"} & tables
    finally:
        conn.close()
