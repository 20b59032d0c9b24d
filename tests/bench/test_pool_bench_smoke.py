"""A few-second smoke run of bench/pool.py: every variant runs end to end and reports
sane numbers (speed itself is measured in bench/, not here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.services import require

BENCH = Path(__file__).resolve().parents[2] / "bench" / "pool.py"


def test_pool_bench_smoke() -> None:
    require("nats")
    out = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    report = json.loads(out.stdout)
    assert report["requests"] == 200
    for variant in ("raw", "grpc", "foundry", "local", "ppe"):
        assert report["runs"][variant][0]["throughput"] > 0, variant
    for variant in ("raw", "grpc", "foundry"):
        assert report["runs"][variant][0]["p99"] > 0, variant
