"""A few-seconds smoke run of bench/inprocess.py: it runs, checks its own metrics, and
prints every case."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_runs_quick() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "inprocess.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    for variant in ("plain call", "foundry sequential unit", "ThreadPoolExecutor", "foundry bounded_pool"):
        assert variant in out.stdout
    for variant in ("ProcessPoolExecutor (fork)", "loky", "foundry processes"):
        assert variant in out.stdout
