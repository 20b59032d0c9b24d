"""A seconds-long smoke run of bench/submit_cost.py on a temporary SQLite file: it
submits, measures and profiles, and the figures it prints are sane."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "submit_cost.py"


def test_submit_cost_smoke() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--profile"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    cost = re.search(r"200 submits, (\d+) µs CPU and (\d+) µs wall each", out)
    assert cost is not None, out
    assert 0 < int(cost.group(1)) < 100_000, out
    assert 0 < int(cost.group(2)) < 100_000, out
    share = re.search(r"under cProfile: (\d+) µs per submit .*, (\d+) % of it inside sqlite3", out)
    assert share is not None, out
    assert 0 < int(share.group(2)) <= 100, out
    assert "execute" in out  # the profile's table names where the time went
