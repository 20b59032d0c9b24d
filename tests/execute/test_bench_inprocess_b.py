"""A few-seconds smoke run of bench/inprocess_b.py: it runs and prints its table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_runs_quick() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "inprocess_b.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=True,
    )
    for row in (
        "raw asyncio.gather",
        "foundry async unit",
        "watchdog cost",
        "accounted",
        "Pool.map",
        "joblib",
    ):
        assert row in out.stdout, row
