from __future__ import annotations

import re
import threading

import pytest

from foundry.observe import Registry, names


def test_counters_gauges_histograms_and_collected_gauges_read_as_dict_and_prometheus() -> None:
    registry = Registry()
    completed = registry.counter(names.UNIT_COMPLETED, "units completed", ["unit"])
    in_flight = registry.gauge(names.UNIT_IN_FLIGHT, "units running", ["unit"])
    lag = registry.histogram(names.LOOP_LAG, "loop lag", ["loop"])
    registry.collect(names.QUEUE_OLDEST_AGE, "age of the oldest item", lambda: [({"queue": "deploy"}, 4.5)])

    completed.labels(unit="sign").inc(3)
    in_flight.labels("sign").inc()
    for ms in range(1, 101):
        lag.labels(loop="main").observe(ms / 1000)

    snap = registry.snapshot()
    assert snap[names.UNIT_COMPLETED] == [{"labels": {"unit": "sign"}, "value": 3.0, "rate": 0.0}]
    assert snap[names.UNIT_IN_FLIGHT][0]["value"] == 1.0
    lag_row = snap[names.LOOP_LAG][0]
    assert lag_row["p50"] == pytest.approx(0.050)
    assert lag_row["p99"] == pytest.approx(0.099)
    assert lag_row["max"] == pytest.approx(0.100)
    assert registry.value(names.QUEUE_OLDEST_AGE, queue="deploy") == 4.5

    text = registry.prometheus()
    assert 'foundry_unit_completed_total{unit="sign"} 3' in text
    assert 'foundry_loop_lag_seconds_bucket{loop="main",le="+Inf"} 100' in text
    assert 'foundry_queue_oldest_age_seconds{queue="deploy"} 4.5' in text
    sample = re.compile(r'^[a-z_]+(\{([a-z_]+="[^"]*",?)*\})? [-+0-9.eInfNa]+$')
    for line in text.splitlines():
        assert line.startswith("# ") or sample.match(line), line


def test_label_values_are_escaped() -> None:
    registry = Registry()
    registry.counter("foundry_x_total", "x", ["unit"]).labels(unit='a"b\\c\n').inc()
    assert 'unit="a\\"b\\\\c\\n"' in registry.prometheus()


def test_reregistering_is_idempotent_but_a_conflict_is_refused() -> None:
    registry = Registry()
    first = registry.counter("foundry_y_total", "y", ["unit"])
    assert registry.counter("foundry_y_total", "y", ["unit"]) is first
    with pytest.raises(ValueError, match="already registered"):
        registry.gauge("foundry_y_total", "y", ["unit"])


def test_a_broken_collector_does_not_break_the_read() -> None:
    registry = Registry()

    def broken() -> list[tuple[dict[str, str], float]]:
        raise RuntimeError("database down")

    registry.collect(names.QUEUE_DEPTH, "depth", broken)
    registry.collect(names.QUEUE_DEPTH, "depth", lambda: [({"queue": "q"}, 2)])
    assert registry.value(names.QUEUE_DEPTH, queue="q") == 2.0


def test_counters_are_exact_under_threads() -> None:
    registry = Registry()
    counter = registry.counter("foundry_z_total", "z", ["unit"]).labels("u")

    def work() -> None:
        for _ in range(10_000):
            counter.inc()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter.value == 40_000
