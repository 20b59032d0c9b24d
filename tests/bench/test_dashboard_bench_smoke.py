"""A few-second smoke run of bench/dashboard.py: the heartbeat's cost and one paired
round of a worker draining with and without open tabs (speed is measured in bench/)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dashboard_benchmark_runs() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "dashboard.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "heartbeat:" in proc.stdout
    assert "open tabs / with none" in proc.stdout
