"""A few-seconds smoke run of bench/stream.py: it runs end to end and reports sane rates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.services import require

BENCH = Path(__file__).resolve().parents[2] / "bench" / "stream.py"


def test_stream_bench_smoke() -> None:
    require("redis")
    require("nats")
    out = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--engines", "sqlite,redis,nats", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report = json.loads(out.stdout)
    assert report["events"] == 1000
    pairs = {(r["engine"], r["op"]) for r in report["results"]}
    ops = ("publish", "publish1", "publish async", "publish1 async", "consume")
    assert pairs == {(e, op) for e in ("sqlite", "redis", "nats") for op in ops} | {
        ("nats", "publish1 hop"),
        ("nats", "publish hdrs"),
        ("sqlite", "publish sql"),
        ("sqlite", "consume loop"),
    }
    assert all(r["raw"] > 0 and r["foundry"] > 0 for r in report["results"])
    assert all(r["cpu_us"][0] > 0 and r["cpu_us"][1] > 0 for r in report["results"])
