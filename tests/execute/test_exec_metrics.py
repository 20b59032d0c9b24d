"""Every in-process model registers its metrics under the stable names, with values that
add up, and the registry's Prometheus text parses."""

from __future__ import annotations

import asyncio
import math
import re
import threading

import pytest

from foundry import Foundry
from foundry.observe import names
from tests.execute import workloads

MODELS = ["sequential", "async", "threads", "bounded_pool", "processes"]


@pytest.mark.parametrize("model", MODELS)
def test_per_unit_metrics_add_up(app: Foundry, model: str) -> None:
    fn = workloads.async_fail_on if model == "async" else workloads.fail_on
    unit = app.work(model=model, name=f"m_{model}", max_pending=64)(fn)
    handles = [unit.submit(i) for i in range(20)]
    for handle in handles:
        handle.exception(timeout=20)
    labels = {"unit": unit.name, "model": model}
    assert app.metrics.value(names.UNIT_COMPLETED, **labels) == 19
    assert app.metrics.value(names.UNIT_FAILED, **labels) == 1
    assert app.metrics.value(names.UNIT_IN_FLIGHT, **labels) == 0
    durations = [r for r in app.metrics.snapshot()[names.UNIT_DURATION] if r["labels"] == labels]
    assert durations[0]["count"] == 20
    assert 0 <= durations[0]["p50"] <= durations[0]["max"] < 20
    if model != "sequential":  # a hand-off: its depth and the age of its oldest item
        assert app.metrics.value(names.QUEUE_DEPTH, unit=unit.name) == 0
        assert app.metrics.value(names.QUEUE_OLDEST_AGE, unit=unit.name) == 0
        assert app.metrics.value(names.POOL_BUSY, unit=unit.name) == 0


def test_throughput_rate_is_published(app: Foundry) -> None:
    unit = app.work(model="bounded_pool", workers=2, name="rate")(workloads.square)
    for handle in [unit.submit(i) for i in range(50)]:
        handle.result(10)
    rows = app.metrics.snapshot()[names.UNIT_COMPLETED]
    row = next(r for r in rows if r["labels"]["unit"] == "rate")
    assert row["value"] == 50
    assert "rate" in row


# -- Prometheus text format 0.0.4 ------------------------------------------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABELS = (
    r'\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*)?\}'
)
_SAMPLE = re.compile(rf"^({_NAME})({_LABELS})? (-?[0-9.eE+-]+|\+Inf|-Inf|NaN)$")


def parse_prometheus(text: str) -> dict[str, list[tuple[str, float]]]:
    """A strict reader of the exposition format: every line is HELP, TYPE or a sample of
    a declared family; each family is declared once; histogram buckets are cumulative."""
    families: dict[str, str] = {}
    samples: dict[str, list[tuple[str, float]]] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            assert name not in families, f"family {name} declared twice"
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped")
            families[name] = kind
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, labels, value = match.group(1), match.group(2) or "", match.group(3)
        family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in families else name
        assert family in families, f"sample {name} before its TYPE"
        samples.setdefault(name, []).append((labels, float(value)))
    for name, kind in families.items():
        if kind != "histogram":
            continue
        series: dict[str, list[float]] = {}
        for labels, value in samples.get(f"{name}_bucket", []):
            key = re.sub(r',?le="[^"]*"', "", labels)
            series.setdefault(key, []).append(value)
        for counts in series.values():
            assert counts == sorted(counts), f"{name} buckets are not cumulative"
        assert all(not math.isnan(v) for _, v in samples.get(f"{name}_count", []))
    return samples


def test_prometheus_text_parses_with_every_model_registered(app: Foundry) -> None:
    gate = threading.Event()
    units = {
        model: app.work(model=model, name=f'p"{model}\\', max_pending=8)(
            workloads.async_square if model == "async" else workloads.square
        )
        for model in MODELS
    }
    for unit in units.values():
        assert unit(3) == 9
    asyncio.run(_touch(units["async"]))
    waiting = app.work(model="bounded_pool", workers=1, name="waiting")(workloads.wait_for)
    waiting.submit(gate)
    waiting.submit(gate)
    samples = parse_prometheus(app.metrics.prometheus())
    gate.set()
    for name in (names.UNIT_COMPLETED, names.UNIT_FAILED, names.UNIT_IN_FLIGHT, names.QUEUE_DEPTH):
        assert name in samples
    assert f"{names.UNIT_DURATION}_bucket" in samples
    assert any('unit="waiting"' in labels and value >= 1 for labels, value in samples[names.QUEUE_DEPTH])
    assert names.QUEUE_OLDEST_AGE in samples
    assert names.POOL_BUSY in samples
    assert names.CHILD_RESTARTS in samples  # the process pool registered its counters


async def _touch(unit: object) -> None:
    await unit(2)  # type: ignore[operator]


def test_read_hooks_flush_buffered_observations_before_every_read() -> None:
    from foundry.observe.metrics import Histogram, Registry

    registry = Registry()
    buffered: list[float] = []
    histogram = registry.histogram("x_seconds", "test", ("unit",)).labels("u")

    def flush() -> None:
        histogram.observe_many(buffered)
        buffered.clear()

    unregister = registry.on_read(flush)
    buffered.extend([0.001, 0.002, 0.5])
    assert registry.value("x_seconds", unit="u") == 3  # the read drained the buffer first
    assert 'x_seconds_count{unit="u"} 3' in registry.prometheus()
    unregister()
    buffered.append(0.1)
    assert registry.value("x_seconds", unit="u") == 3
    one_by_one = Histogram()
    for value in (0.001, 0.002, 0.5):
        one_by_one.observe(value)
    assert one_by_one.counts == histogram.counts
    assert one_by_one.max == histogram.max
