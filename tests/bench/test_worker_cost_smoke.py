"""A few-second smoke run of bench/worker_cost.py: both modes run every job in both
trees (this one twice), and the figures are sane (speed lives in bench/)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "worker_cost.py"


def test_worker_cost_bench_smoke() -> None:
    src = str(ROOT / "src")
    out = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json", "--before", src, "--after", src],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    report = json.loads(out.stdout)
    assert len(report["rounds"]) == 2
    assert [run["order"] for run in report["rounds"]] == [["before", "after"], ["after", "before"]]
    for mode in ("one thread", "8 runners"):
        figures = report["summary"][mode]
        for tree in ("before", "after"):
            assert 0 < figures[tree] < 10_000, (mode, tree, figures)  # µs of CPU per job
        ratio = figures["ratio"]
        assert all(math.isfinite(ratio[k]) and ratio[k] > 0 for k in ("min", "median", "max"))
        assert ratio["min"] <= ratio["median"] <= ratio["max"]
