"""A few-second smoke run of bench/adaptive.py: every variant runs end to end, the phase
moves, every request is answered, and the figures are sane (speed lives in bench/)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "adaptive.py"


def test_adaptive_bench_smoke() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    report = json.loads(out.stdout)
    [one] = report["rounds"]
    assert one["foundry"]["moved"]
    assert one["foundry"]["reports"] == 3
    for variant in ("foundry", "plain inline", "plain executor"):
        assert one[variant]["answered"] == one[variant]["sent"] > 0, variant
    for variant in ("foundry before", "foundry after", "plain inline", "plain executor"):
        for what in ("health", "payment"):
            figures = one[variant][what]
            assert figures["n"] > 0, (variant, what)
            assert 0 <= figures["p50"] <= figures["p99"] < 120, (variant, what, figures)
    for ratio in report["summary"].values():
        assert math.isfinite(ratio["median"])
        assert ratio["min"] <= ratio["median"] <= ratio["max"]
