"""`foundry demo` section "payments": seed 003's incident on a real ASGI service — RSA-4096
signing inline on uvicorn's loop, on the bounded pool Foundry chooses, and moved at run
time by ``adaptive=True`` — under load from a second process (``foundry.examples.payments``)."""

from __future__ import annotations

from rich.console import Console

from foundry.demos._bar import bar


def run(console: Console) -> None:
    from foundry.examples import payments

    with bar(console, "payments: 3 variants × 3 s of load") as advance:
        report = payments.run(seconds=3.0, progress=advance)
    payments.show(report, console)
    console.print(
        "[dim]longer runs and other rates: python examples/payments.py --help · "
        "docs/examples-payments.md[/dim]"
    )
