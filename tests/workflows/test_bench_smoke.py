"""A few-second smoke run of bench/workflow.py (speed itself is measured in bench/, not here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_workflow_benchmark_runs() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "workflow.py"), "--quick", "--n", "10"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "one committed insert per step" in proc.stdout
    assert "Foundry" in proc.stdout
