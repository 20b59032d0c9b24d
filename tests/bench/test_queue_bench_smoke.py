"""A few-second smoke run of bench/queues.py: Foundry's embedded SQLite queue and
huey+SQLite, 200 jobs each, with their real worker processes (speed itself is measured
in bench/, not here); and of bench/queues_ab.py, bench/sqlite_scaling.py and
bench/queue_redis_cost.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def bench(script: str, *options: str) -> str:
    """Run ``bench/<script>`` with ``options``; its output (it must succeed)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *options],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_queue_benchmark_runs() -> None:
    out = bench("queues.py", "--quick", "--m", "10", "--gap", "0.005")
    assert "Foundry (embedded)" in out
    assert "Huey" in out
    assert "failed" not in out, out


def test_queue_before_after_benchmark_runs() -> None:
    src = str(ROOT / "src")
    options = ["--only", "foundry-sqlite", "--rounds", "1", "--n", "200", "--m", "5"]
    out = bench("queues_ab.py", "--before", src, "--after", src, *options)
    assert "foundry-sqlite: jobs/s median before" in out


def test_sqlite_scaling_benchmark_runs() -> None:
    out = bench("sqlite_scaling.py", "--quick", "--workers", "1", "2")
    assert "vs 1 worker" in out
    assert "failed" not in out, out


def test_redis_cost_benchmark_runs() -> None:
    from tests.services import require

    src = str(ROOT / "src")
    options = ["--url", require("redis"), "--rounds", "1", "--n", "40", "--batch", "8"]
    out = bench("queue_redis_cost.py", "--before", src, "--after", src, *options)
    assert "EVALSHA    total" in out
    assert "server CPU total" in out
