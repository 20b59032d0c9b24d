"""A few-second smoke run of bench/queues.py: Foundry's embedded SQLite queue and
huey+SQLite, 200 jobs each, with their real worker processes (speed itself is measured
in bench/, not here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_queue_benchmark_runs() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "queues.py"), "--quick", "--m", "10", "--gap", "0.005"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Foundry (embedded)" in proc.stdout
    assert "Huey" in proc.stdout
    assert "failed" not in proc.stdout, proc.stdout


def test_queue_before_after_benchmark_runs() -> None:
    src = str(ROOT / "src")
    options = ["--only", "foundry-sqlite", "--rounds", "1", "--n", "200", "--m", "5"]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "queues_ab.py"), "--before", src, "--after", src, *options],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "foundry-sqlite: jobs/s median before" in proc.stdout


def test_sqlite_scaling_benchmark_runs() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "sqlite_scaling.py"), "--quick", "--workers", "1", "2"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "vs 1 worker" in proc.stdout
    assert "failed" not in proc.stdout, proc.stdout
