"""A few-second smoke run of bench/tracing.py (speed itself is measured in bench/)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tracing_benchmark_runs_and_the_traced_variant_exports_its_spans() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "tracing.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("│")[1].strip() for line in proc.stdout.splitlines() if line.count("│") == 6]
    assert rows[-3:] == ["off", "auto", "on"], proc.stdout
    # 1 + 200 submits (a send span each) and 1 + 50 jobs (send, wait, process each)
    assert "spans exported by 'on': 354" in proc.stdout, proc.stdout
