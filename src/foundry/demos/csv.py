"""`foundry demo` section "csv": seed 003's CSV import — 40 lines sequentially (and why),
200,000 generated lines on the parallel model against a plain loop
(``foundry.examples.csv_import``; ``python examples/csv_import.py`` runs 1,000,000)."""

from __future__ import annotations

from rich.console import Console


def run(console: Console) -> None:
    from foundry.examples import csv_import

    report = csv_import.run(200_000, rounds=1)
    csv_import.show(report, console)
    console.print(
        "[dim]the whole run, 1,000,000 lines: python examples/csv_import.py · "
        "docs/examples-csv-import.md[/dim]"
    )
