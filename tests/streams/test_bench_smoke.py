"""A few-seconds smoke run of bench/stream.py: it runs end to end and reports sane rates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.services import require

BENCH = Path(__file__).resolve().parents[2] / "bench" / "stream.py"


@pytest.mark.parametrize("engine", ["sqlite", "redis", "nats"])
def test_stream_bench_smoke(engine: str) -> None:
    if engine != "sqlite":
        require(engine)
    out = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--engines", engine, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report = json.loads(out.stdout)
    assert report["events"] == 2000
    assert {(r["engine"], r["op"]) for r in report["results"]} == {(engine, "publish"), (engine, "consume")}
    assert all(r["raw"] > 0 and r["foundry"] > 0 for r in report["results"])
