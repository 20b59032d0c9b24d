"""Seed 003's first candidate, for real: a CSV import, small and large.

``python examples/csv_import.py`` (``--rows 200000`` for a shorter run, ``--json``)

- **The 40-line file** (``data/orders.csv``, shipped with Foundry): measured, decided —
  ``direct/sequential``, decided by *size*: the work is a fraction of a millisecond and not
  repeated at volume, so no coordination can pay for itself — and imported in the caller.
  The parallel unit given the same 40 rows falls back to sequential at run time and says why.
- **A generated 1,000,000-line file** of the same shape: parsed, validated (order id,
  country, currency, amount in cents, timestamp, e-mail) and totalled per currency, once in
  a plain loop and once on Foundry's ``parallel`` model (partition → map on process workers
  → merge). The report gives the measured speed-up against the ideal on this machine's
  cores, and the bill: starting the workers, shipping the blocks, the merge, the memory.

The kernel (:func:`import_block`) takes a *block* of lines, not one line: a row is parsed
in a few microseconds, which is about what it costs to pickle it to a child and its result
back, so row-at-a-time shipping would eat the gain. Both runs must give the same totals.
"""

from __future__ import annotations

import os
import random
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from foundry import Foundry, Traits, decide
from foundry.decide import Decision

__all__ = [
    "ORDERS",
    "CsvReport",
    "app",
    "generate",
    "import_block",
    "import_orders",
    "import_rows",
    "merge",
    "run",
]

ORDERS = Path(__file__).with_name("data") / "orders.csv"
BLOCK_LINES = 1024  # lines per item handed to a worker
_WARM_BLOCKS = 128  # the first (cold) run: enough blocks not to fall back to sequential
HEADER = "order_id,customer,country,currency,amount,created_at,email"
COUNTRIES = {"DE", "FR", "NL", "ES", "IT", "GB", "US", "SE", "PL", "PT"}
CURRENCIES = {"EUR", "GBP", "USD", "SEK", "PLN"}
_ORDER_ID = re.compile(r"A-\d{5,9}\Z")
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[a-z]{2,}\Z")

app = Foundry("csv-import")

Totals = dict[str, Any]  # {"rows": n, "rejected": n, "by_currency": {cur: [count, cents]}}


def import_block(block: str) -> Totals:
    """Parse, validate and total one block of CSV lines (no header): the computing step."""
    by_currency: dict[str, list[int]] = {}
    rows = rejected = 0
    for line in block.splitlines():
        if not line:
            continue
        rows += 1
        fields = line.split(",")
        if len(fields) != 7:
            rejected += 1
            continue
        order_id, _customer, country, currency, amount, created_at, email = fields
        whole, _, cents = amount.partition(".")
        if (
            not _ORDER_ID.match(order_id)
            or country not in COUNTRIES
            or currency not in CURRENCIES
            or not whole.isdigit()
            or len(cents) != 2
            or not cents.isdigit()
            or not _EMAIL.match(email)
        ):
            rejected += 1
            continue
        try:
            datetime.fromisoformat(created_at)
        except ValueError:
            rejected += 1
            continue
        slot = by_currency.setdefault(currency, [0, 0])
        slot[0] += 1
        slot[1] += int(whole) * 100 + int(cents)
    return {"rows": rows, "rejected": rejected, "by_currency": by_currency}


def merge(parts: list[Totals]) -> Totals:
    """The join: totals of every block, added up (exact: integer cents)."""
    by_currency: dict[str, list[int]] = {}
    rows = rejected = 0
    for part in parts:
        rows += part["rows"]
        rejected += part["rejected"]
        for currency, (count, cents) in part["by_currency"].items():
            slot = by_currency.setdefault(currency, [0, 0])
            slot[0] += count
            slot[1] += cents
    return {"rows": rows, "rejected": rejected, "by_currency": dict(sorted(by_currency.items()))}


@app.work(est="1ms", items=40, bound="cpu")
def import_orders(text: str) -> Totals:
    """The 40-line script: the whole file in one call, where it is called."""
    return merge([import_block(text.split("\n", 1)[1])])


import_rows = app.work(partitionable=True, bound="cpu", name="import_rows")(import_block)
"""The large import: one item is a block of lines; partition → map on processes → merge."""


def generate(path: Path, rows: int, *, seed: int = 7) -> Path:
    """Write ``rows`` orders in ``orders.csv``'s shape (one in 500 malformed on purpose)."""
    rng = random.Random(seed)
    countries = sorted(COUNTRIES)
    currency = {"GB": "GBP", "US": "USD", "SE": "SEK", "PL": "PLN"}
    customers = ["acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "wonka"]
    with path.open("w") as out:
        out.write(HEADER + "\n")
        batch: list[str] = []
        for i in range(rows):
            country = countries[i % len(countries)]
            customer = customers[rng.randrange(len(customers))]
            amount = f"{rng.randrange(100, 250_000) / 100:.2f}"
            minute = i % 1440
            stamp = f"2026-03-{1 + i % 28:02d}T{minute // 60:02d}:{minute % 60:02d}:00"
            cur = currency.get(country, "EUR")
            line = f"A-{100000 + i},{customer},{country},{cur},{amount},{stamp},b@{customer}.example"
            if i % 500 == 499:
                line = line.replace(".example", "")  # an e-mail without a domain: rejected
            batch.append(line)
            if len(batch) == 10_000:
                out.write("\n".join(batch) + "\n")
                batch.clear()
        if batch:
            out.write("\n".join(batch) + "\n")
    return path


def blocks_of(text: str, lines: int = BLOCK_LINES) -> list[str]:
    """Split a CSV body (no header) into blocks of ``lines`` lines, at line boundaries."""
    rows = text.splitlines()
    return ["\n".join(rows[i : i + lines]) for i in range(0, len(rows), lines)]


@dataclass
class CsvReport:
    """What one run decided and measured."""

    small_rows: int
    small_seconds: float
    small_decision: str
    small_decided_by: str
    small_why: str
    small_runtime_plan: str
    large_rows: int
    large_mb: float
    blocks: int
    generate_seconds: float
    sequential_seconds: float
    sequential_cpu: float
    parallel_seconds: float
    parallel_cold_seconds: float
    parallel_plan: str
    large_decision: str
    large_decided_by: str
    workers: int
    speedup: float
    ideal: float
    cpu_utilisation: float
    shipped_mb: float
    merge_seconds: float
    child_rss_mb: float
    same_totals: bool
    totals: Totals = field(default_factory=dict)

    @property
    def efficiency(self) -> float:
        return self.speedup / self.ideal if self.ideal else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "efficiency": self.efficiency}


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    started, cpu = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.perf_counter() - started, time.process_time() - cpu


def _children_rss_mb() -> float:
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil comes with the dev and examples extras
        return 0.0
    me = psutil.Process()
    return float(sum(c.memory_info().rss for c in me.children(recursive=True))) / 2**20


def run(rows: int = 1_000_000, *, rounds: int = 3, workdir: Path | None = None) -> CsvReport:
    """Both imports, measured (the large file is generated in ``workdir``, default a
    temporary directory, and deleted afterwards)."""
    from foundry.execute.parallel import ParallelRunner
    from foundry.observe import names

    # -- the 40-line file: measure, decide, run in the caller --------------------------------
    text = ORDERS.read_text()
    small_rows = text.count("\n") - 1
    best = min(_timed(lambda: import_orders(text))[1] for _ in range(5))
    measured = decide(Traits(est=best, items=small_rows, bound="cpu"))
    small = import_rows(text.split("\n", 1)[1].splitlines())  # the parallel unit, given 40 rows
    runner = import_rows.runner
    assert isinstance(runner, ParallelRunner)
    small_plan = runner.last_plan.note if runner.last_plan is not None else ""
    assert merge(small)["rows"] == small_rows

    # -- the large file ---------------------------------------------------------------------
    owned = workdir is None
    where = Path(tempfile.mkdtemp(prefix="foundry-csv-")) if workdir is None else workdir
    path = where / "orders-large.csv"
    try:
        _, generated, _ = _timed(lambda: generate(path, rows))
        size = path.stat().st_size
        body = path.read_text().split("\n", 1)[1]
        blocks = blocks_of(body)
        del body
        # cold: the first run starts the workers (a run big enough not to fall back)
        _, cold, _ = _timed(lambda: import_rows(blocks[:_WARM_BLOCKS]))
        # then the loop and the parallel run alternately, ``rounds`` times (the machine is
        # shared: alternating lands its drift on both), the median of each
        seq_walls, seq_cpus, par_walls = [], [], []
        for _ in range(rounds):
            sequential, wall, cpu = _timed(lambda: merge([import_block(b) for b in blocks]))
            seq_walls.append(wall)
            seq_cpus.append(cpu)
            parts, wall, _ = _timed(lambda: import_rows(blocks))
            par_walls.append(wall)
        seq_wall, seq_cpu, par_wall = (statistics.median(x) for x in (seq_walls, seq_cpus, par_walls))
        merged, merge_wall, _ = _timed(lambda: merge(parts))
        plan = runner.last_plan
        rss = _children_rss_mb()
        utilisation = import_rows.app.metrics.value(names.CPU_UTILISATION, unit="import_rows")
    finally:
        path.unlink(missing_ok=True)
        if owned:
            os.rmdir(where)
    workers = plan.workers if plan is not None else 1
    per_row = seq_cpu / max(1, rows)
    large: Decision = decide(Traits(est=per_row, items=rows, bound="cpu", partitionable=True))
    ideal = float(min(workers, os.cpu_count() or 1))
    return CsvReport(
        small_rows=small_rows,
        small_seconds=best,
        small_decision=measured.model,
        small_decided_by=measured.decided_by,
        small_why=measured.deciding_answer,
        small_runtime_plan=small_plan,
        large_rows=rows,
        large_mb=size / 1e6,
        blocks=len(blocks),
        generate_seconds=generated,
        sequential_seconds=seq_wall,
        sequential_cpu=seq_cpu,
        parallel_seconds=par_wall,
        parallel_cold_seconds=cold,
        parallel_plan=plan.note if plan is not None else "",
        large_decision=large.model,
        large_decided_by=large.decided_by,
        workers=workers,
        speedup=seq_wall / par_wall if par_wall else 0.0,
        ideal=ideal,
        cpu_utilisation=utilisation,
        shipped_mb=sum(len(b) for b in blocks) / 1e6,
        merge_seconds=merge_wall,
        child_rss_mb=rss,
        same_totals=merged == sequential,
        totals=merged,
    )


def show(report: CsvReport, console: Any) -> None:
    """Print a report: each decision beside what was measured."""
    from rich.table import Table

    r = report
    console.print(
        f"[bold]40-line CSV[/bold] ({ORDERS.name}, {r.small_rows} orders): imported in "
        f"{r.small_seconds * 1e3:.2f} ms → "
        f"[cyan]{r.small_decision}[/cyan], decided by [bold]{r.small_decided_by}[/bold]: {r.small_why}"
    )
    console.print(
        f"   the parallel unit given the same {r.small_rows} rows: [yellow]{r.small_runtime_plan}[/yellow]"
    )
    table = Table(
        title=f"{r.large_rows:,}-line CSV ({r.large_mb:.0f} MB, {r.blocks} blocks of {BLOCK_LINES} lines)"
    )
    for column in ("run", "wall", "what it shows"):
        table.add_column(column)
    table.add_row("plain loop", f"{r.sequential_seconds:.2f} s", f"{r.sequential_cpu:.2f} s CPU on one core")
    table.add_row(
        f"parallel ({r.workers} workers)",
        f"{r.parallel_seconds:.2f} s",
        f"speed-up ×{r.speedup:.2f} of an ideal ×{r.ideal:.0f} ({r.efficiency:.0%}); cores busy "
        f"{r.cpu_utilisation:.0%}; {r.parallel_plan}",
    )
    console.print(table)
    console.print(
        f"   decision for {r.large_rows:,} rows × {r.sequential_cpu / max(1, r.large_rows) * 1e6:.1f} µs: "
        f"[cyan]{r.large_decision}[/cyan] (decided by {r.large_decided_by}); same totals as the loop: "
        f"{'[green]yes[/green]' if r.same_totals else '[red]NO[/red]'}"
    )
    console.print(
        f"   the bill: workers started in {r.parallel_cold_seconds:.2f} s (the first run), "
        f"{r.shipped_mb:.0f} MB pickled to them, a merge of {r.merge_seconds * 1e3:.1f} ms, "
        f"{r.child_rss_mb:.0f} MB resident in the worker processes"
    )


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    from rich.console import Console

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows", type=int, default=1_000_000, help="lines of the large CSV (default 1,000,000)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating rounds of loop and parallel (median)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if args.rows < 1:
        parser.error(f"--rows={args.rows}: give at least 1 line")
    try:
        report = run(args.rows, rounds=max(1, args.rounds))
    finally:
        app.close()
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        show(report, Console())
    return 0 if report.same_totals else 1


if __name__ == "__main__":
    raise SystemExit(main())
