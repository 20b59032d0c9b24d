"""`foundry demo` section "five": seed 000's five systems in one app, each run on its own
model (``foundry.examples.five_systems``)."""

from __future__ import annotations

import logging

from rich.console import Console


def run(console: Console) -> None:
    from foundry.examples import five_systems

    pool = logging.getLogger("foundry.pool")
    level = pool.level
    pool.setLevel(logging.ERROR)  # the worker that dies on purpose is shown in the table
    try:
        report = five_systems.run()
    finally:
        pool.setLevel(level)
    five_systems.show(report, console)
    console.print("[dim]foundry plan foundry.examples.five_systems · docs/examples-five-systems.md[/dim]")
