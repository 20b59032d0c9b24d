"""What tracing costs a durable queue: submit and end-to-end, off, auto (no provider) and on.

    python bench/tracing.py            # 5 rounds of 2,000 submits and 500 jobs through a worker
    python bench/tracing.py --quick    # a few seconds (the test suite's smoke run)

Each variant is a fresh app on a fresh SQLite queue in this one process, the variants
interleaved round by round (the machine's drift hits all of them alike); the figures are
medians. ``off`` is ``Foundry(tracing=False)``; ``auto`` the default with no
``TracerProvider`` set (OpenTelemetry imported, as in an instrumented process that sets
none); ``on`` traces on an SDK provider with a ``BatchSpanProcessor`` and an exporter that
drops the spans (the SDK's cost, not a collector's). Ratios are against ``off``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from rich.console import Console
from rich.table import Table

from foundry import Foundry
from foundry.deliver.worker import Worker


class _Drop(SpanExporter):
    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def _noop(i: int) -> int:
    return i


def _app(home: Path, tracing: Any) -> Foundry:
    app = Foundry("bench-tracing", home=home, queue=f"sqlite:///{home / 'q.db'}", tracing=tracing)
    app.work(durable=True, name="noop")(_noop)
    return app


def _round(variant: str, submits: int, jobs: int, provider: Any) -> tuple[float, float]:
    """(seconds per submit, jobs per second end to end) for one variant."""
    tracing = {"off": False, "auto": None, "on": provider}[variant]
    with tempfile.TemporaryDirectory() as tmp:
        app = _app(Path(tmp), tracing)
        unit = app.units["noop"]
        try:
            unit.submit(-1)  # the runner and the connection, made outside the timing
            started = time.perf_counter()
            for i in range(submits):
                unit.submit(i)
            per_submit = (time.perf_counter() - started) / submits
        finally:
            app.close()
    with tempfile.TemporaryDirectory() as tmp:
        app = _app(Path(tmp), tracing)
        unit = app.units["noop"]
        worker = Worker(app, concurrency=4, lease=30.0, poll=0.05).start()
        try:
            unit.submit(-1).result(timeout=60)
            started = time.perf_counter()
            handles = [unit.submit(i) for i in range(jobs)]
            for handle in handles:
                handle.result(timeout=120)
            rate = jobs / (time.perf_counter() - started)
        finally:
            worker.stop(5.0)
            app.close()
    return per_submit, rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 5)
    submits, jobs = (200, 50) if args.quick else (2000, 500)
    exporter = _Drop()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    variants = ["off", "auto", "on"]
    results: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    for r in range(rounds):
        for variant in variants[r % 3 :] + variants[: r % 3]:  # rotate the order
            results[variant].append(_round(variant, submits, jobs, provider))
    provider.shutdown()
    table = Table(title=f"tracing cost: SQLite queue, {rounds} round(s), medians")
    for column in ("variant", "µs / submit", "× off", "jobs/s end to end", "× off"):
        table.add_column(column, justify="right")
    base_submit = statistics.median(s for s, _ in results["off"])
    base_rate = statistics.median(j for _, j in results["off"])
    for variant in variants:
        submit = statistics.median(s for s, _ in results[variant])
        rate = statistics.median(j for _, j in results[variant])
        table.add_row(
            variant,
            f"{submit * 1e6:.0f}",
            f"{submit / base_submit:.2f}",
            f"{rate:.0f}",
            f"{rate / base_rate:.2f}",
        )
    console = Console(width=100)
    console.print(table)
    console.print(f"spans exported by 'on': {exporter.spans}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
