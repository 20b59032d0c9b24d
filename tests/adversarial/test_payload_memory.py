"""Peak memory of a large payload through the queue, measured in a fresh subprocess per
phase (``bench/payloads.py probe``: Linux VmHWM above the phase's start). A 16 MB str
argument is submitted, a job's 16 MB result is read back with ``handle.result()``; the
bounds are generous multiples of the payload that the old copies broke (submit peaked at
4x on every engine: an escaped copy and a joined copy of the JSON, then the driver's
two; the result at 3-4x). Exact numbers are in BENCHMARKS.md, not asserted here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.backends.queue.engines import ENGINES, engine_url

ROOT = Path(__file__).resolve().parents[2]
MB = 16
# Submit holds the argument (1x) and its encoding (1x); PostgreSQL adds libpq's output
# buffer (1x). A read holds the stored bytes and the value; PostgreSQL's client adds its
# read buffer (1x), redis-py's reader up to 2x (it grows its buffer by doubling: 16 MB
# came out at 3.96x, 40 MB at 3.4x).
SUBMIT_BOUND = {"sqlite": 2.6, "redis": 2.6, "amqp": 2.6, "postgres": 3.6}
RESULT_BOUND = {"sqlite": 2.6, "redis": 4.6, "amqp": 2.6, "postgres": 3.6}

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self (Linux)")


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_payloads", ROOT / "bench" / "payloads.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("engine", ENGINES)
def test_submitting_and_reading_a_large_payload_stays_within_a_small_multiple(
    engine: str, tmp_path: Path
) -> None:
    bench = _bench()
    url = engine_url(engine, tmp_path)
    if engine == "amqp":  # its state store (where the payload lives) in the test's directory
        url += f"&state=sqlite%3A%2F%2F%2F{tmp_path}%2Fstate.db"
    try:
        # When: a 16 MB argument is submitted
        submit = bench.run_probe(url, "submit", MB, timeout=300)
        # Then: the process peaked at a small multiple of it (the argument included)
        assert submit["ratio"] < SUBMIT_BOUND[engine], submit
        # When: a job's 16 MB result is read back by handle.result()
        job = bench.run_probe(url, "prepare-result", MB, timeout=300)["job"]
        bench.run_probe(url, "worker", MB, job, timeout=300)
        result = bench.run_probe(url, "result", MB, job, timeout=300)
        # Then: likewise (the returned value included)
        assert result["ratio"] < RESULT_BOUND[engine], result
    finally:
        bench.cleanup(url)
