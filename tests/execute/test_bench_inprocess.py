"""A few-seconds smoke run of bench/inprocess.py, bench/inprocess_b.py and bench/callpath.py: each runs,
checks its own metrics, and prints every case."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PART_A = (
    "plain call",
    "foundry sequential unit",
    "ThreadPoolExecutor",
    "foundry bounded_pool",
    "ProcessPoolExecutor (fork)",
    "loky",
    "foundry processes",
)
PART_B = ("raw asyncio.gather", "foundry async unit", "watchdog cost", "accounted", "Pool.map", "joblib")


CALLPATH = ("plain call", "+ a callable object", "+ a Python frame", "foundry sequential unit")


@pytest.mark.parametrize(
    ("script", "rows"), [("inprocess.py", PART_A), ("inprocess_b.py", PART_B), ("callpath.py", CALLPATH)]
)
def test_the_benchmark_runs_quick(script: str, rows: tuple[str, ...]) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--quick"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    for row in rows:
        assert row in out.stdout, row
