"""A smoke run of bench/parallel_cluster.py: both sides of each engine run end to end on
the same chunks and report sane numbers (speed itself is measured in bench/). It reuses
the session's Dask cluster; Ray gets a private instance in the script's process (Ray
allows one per process, and the script's functions travel by value only from
``__main__``), which is most of this test's ~30 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.clusters import require_driver

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "parallel_cluster.py"


def test_parallel_cluster_bench_smoke(dask_scheduler: Any) -> None:
    require_driver("ray", "ray")
    out = subprocess.run(
        [sys.executable, str(BENCH), "--dask", str(dask_scheduler.scheduler_address), "--items", "3000",
         "--rounds", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
    )  # fmt: skip
    report = json.loads(out.stdout)
    for engine in ("dask", "ray"):
        row = report["engines"][engine]
        assert row["chunks"] >= 2, row
        assert row["foundry_items_per_s"] > 0
        assert row["plain_items_per_s"] > 0
        assert 0 < row["median"] < 100
