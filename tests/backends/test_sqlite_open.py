"""Several processes opening one SQLite file at the same moment — three `foundry run`
supervisors starting together — all get a connection: the set-up (WAL conversion,
synchronous) waits for the others' locks even when the caller's own operations use
timeout=0, instead of failing "database is locked" at start-up."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

OPENER = """
import sys, time
from foundry.backends._sql_common import sqlite_connect
start = float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))
for _ in range(20):
    conn = sqlite_connect(sys.argv[1], timeout=0.0, synchronous="FULL")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
print("ok")
"""


def test_processes_opening_one_new_file_together_all_get_a_connection(tmp_path: Path) -> None:
    for round_ in range(3):
        path = tmp_path / f"queue-{round_}.db"
        start = time.time() + 1.5  # the interpreters start first, then all open at once
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", OPENER, str(path), str(start)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(6)
        ]
        results = [p.communicate(timeout=60) for p in procs]
        assert [p.returncode for p in procs] == [0] * 6, [err for _, err in results if err]
        assert all(out.strip() == "ok" for out, _ in results)
