"""A few-seconds smoke run of bench/stream_latency.py: every engine, both sides, a p50 and
a p99 each, and the paired ratio."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.services import require

BENCH = Path(__file__).resolve().parents[2] / "bench" / "stream_latency.py"


def test_stream_latency_bench_smoke() -> None:
    require("redis")
    require("nats")
    out = subprocess.run(
        [sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=120, check=True
    )
    for engine in ("sqlite", "redis", "nats"):
        rows = [line for line in out.stdout.splitlines() if line.startswith(engine)]
        assert len(rows) == 2, out.stdout  # the plain client, then Foundry
        for row in rows:
            p50, p99 = (float(v) for v in re.findall(r"(?<=\s)(\d+\.\d\d)(?=\s|$)", row)[:2])
            assert 0 < p50 <= p99, row
        assert re.search(r"p50 \d+\.\d\d× \(.+\), p99 \d+\.\d\d×", rows[1]), rows[1]
