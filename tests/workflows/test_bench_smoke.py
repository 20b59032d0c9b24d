"""A few-second smoke run of bench/workflow.py (speed itself is measured in bench/, not here)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LATENCY_ARGS = ("--latency", "--n", "10", "--rounds", "1", "--only", "foundry-sqlite", "dbos-sqlite")


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


def test_the_latency_run_reports_both_sides_and_their_ratio() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "workflow.py"), *LATENCY_ARGS],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {
        line.split()[0]: line for line in proc.stdout.splitlines() if line.startswith(("foundry", "dbos"))
    }
    assert set(rows) == {"foundry-sqlite", "dbos-sqlite"}, proc.stdout
    assert re.search(r"p50 \d+\.\d\d× \(.+\), p99 \d+\.\d\d×", rows["foundry-sqlite"]), rows
