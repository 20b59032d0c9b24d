"""Server models under the same offered load."""

from __future__ import annotations

from dataclasses import replace

import pytest

from foundry.errors import LabInputError
from foundry.lab.servers import ServerResult, ServerSettings, compare

SMALL = ServerSettings(concurrency=100, cpu=0.002, wait=0.048, cores=4, pool=16, requests=3_000)


def _by_model(settings: ServerSettings) -> dict[str, ServerResult]:
    return {r.model: r for r in compare(settings, replications=2)}


def test_waiting_occupies_pool_workers_but_not_async_tasks() -> None:
    rows = _by_model(SMALL)
    pool, threads, loop = rows["fixed pool"], rows["thread-per-request"], rows["async"]
    # the pool is capped at 16 / 50 ms = 320/s; the others approach the offered 2000/s
    assert pool.max_throughput == pytest.approx(320.0)
    assert pool.throughput <= 330.0
    assert threads.throughput > 3 * pool.throughput
    assert loop.throughput > 3 * pool.throughput
    assert pool.latency > 4 * loop.latency
    for r in rows.values():
        assert r.throughput <= r.max_throughput * 1.05
        assert r.latency >= r.min_latency * 0.95


def test_memory_estimates_and_limits() -> None:
    rows = _by_model(replace(SMALL, memory_limit=50 * 2**20))
    assert rows["thread-per-request"].memory == 100 * 2**20
    assert rows["fixed pool"].memory == 16 * 2**20
    assert rows["async"].memory == 4 * 2**20 + 100 * 4096
    assert rows["thread-per-request"].fails is not None
    assert rows["async"].fails is None


def test_the_gil_caps_threads_not_loops() -> None:
    rows = _by_model(replace(SMALL, cpu=0.005, wait=0.045, pool=100, gil=True))
    assert rows["thread-per-request"].max_throughput == pytest.approx(1 / 0.0051)
    assert "GIL" in rows["fixed pool"].bottleneck
    assert rows["async"].throughput > 2 * rows["fixed pool"].throughput


@pytest.mark.parametrize(("change", "field"), [({"concurrency": 0}, "concurrency"), ({"cpu": -1.0}, "cpu")])
def test_bad_inputs(change: dict[str, float], field: str) -> None:
    with pytest.raises(LabInputError) as info:
        compare(replace(SMALL, **change), replications=2)
    assert info.value.field == field
