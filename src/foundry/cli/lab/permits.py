"""`foundry lab permits`: goodput, latency and timeouts against concurrency permits.

    foundry lab permits [--sim]

Closed forms by default; ``--sim`` adds an event-by-event table beside them.
"""

from __future__ import annotations

import argparse
from typing import Any

from foundry.cli.lab._args import DURATION, RATE, add_output_options, int_list
from foundry.cli.lab._output import emit_json, lab_console, plot_note, pm


def add_parser(labsub: Any) -> None:
    """Register `foundry lab permits` on the `lab` subparsers."""
    permits = labsub.add_parser(
        "permits", help="goodput, latency and timeouts vs concurrency permits (seed table)"
    )
    permits.add_argument(
        "--permits", type=int_list, default=None, help="comma-separated (default 1,5,...,500)"
    )
    permits.add_argument("--service", type=DURATION, default=0.040, help="downstream base latency (40ms)")
    permits.add_argument(
        "--overhead", type=DURATION, default=0.003, help="caller time outside the permit (3ms)"
    )
    permits.add_argument("--capacity", type=RATE, default=1000.0, help="downstream capacity (1000/s)")
    permits.add_argument("--timeout", type=DURATION, default=0.500, help="caller timeout per call (500ms)")
    permits.add_argument("--requests", type=int, default=10_000, help="calls in the backlog (10000)")
    permits.add_argument("--sim", action="store_true", help="also simulate, event by event")
    permits.add_argument("--cs", type=float, default=1.0, help="simulated service CV (default 1)")
    permits.add_argument("--abandoned", choices=("wasted", "dropped"), default="wasted")
    permits.add_argument("--replications", type=int, default=5)
    add_output_options(permits)
    permits.set_defaults(func=run_permits)


def _count(n: float) -> str:
    return f"{n:.0f}" if n < 1000 else f"{n / 1000:.3g}K"


def _pct(fraction: float) -> str:
    pct = fraction * 100
    return f"{pct:.1f}%" if pct >= 99.995 else f"{pct:.2f}%"


def run_permits(args: argparse.Namespace) -> int:
    from foundry.lab.permits import SEED_PERMITS, PermitSettings, knee, simulate_permits, sweep

    settings = PermitSettings(
        args.service, args.overhead, args.capacity, args.timeout, args.requests
    ).checked()
    permits = args.permits or list(SEED_PERMITS)
    rows = sweep(permits, settings)
    sim_rows = (
        simulate_permits(
            permits,
            settings,
            cs=args.cs,
            abandoned=args.abandoned,
            replications=args.replications,
            seed=args.seed,
            confidence=args.confidence,
        )
        if args.sim
        else []
    )
    plot = None
    if args.plot:
        from foundry.lab.plot import plot_permits

        plot = str(plot_permits(args.plot, rows, sim_rows))
    if args.json:
        emit_json(
            {
                "inputs": settings.as_dict(),
                "knee_permits": knee(settings),
                "rows": [r.as_dict() for r in rows],
                "simulation": [r.as_dict() for r in sim_rows] or None,
                "plot": plot,
            }
        )
        return 0
    from rich.table import Table

    console = lab_console()
    for data in (rows, sim_rows):
        if not data:
            continue
        table = Table(title="Bounding concurrency with permits", caption=data[0].method)
        for name in (
            "permits",
            "goodput",
            "mean latency",
            "timeouts",
            f"failed of {_count(settings.requests)}",
        ):
            table.add_column(name, justify="right")
        for r in data:
            hw = r.half_widths or {}
            table.add_row(
                str(r.permits),
                pm(f"{r.goodput:.0f}/s", hw.get("goodput"), 0),
                pm(f"{r.latency * 1000:.0f} ms", hw.get("latency"), 0, 1000.0),
                _pct(r.timeout_rate) + (f" ±{hw['timeout_rate'] * 100:.2f}" if "timeout_rate" in hw else ""),
                _count(r.failed),
            )
        console.print(table)
    k = knee(settings)
    console.print(
        f"knee = capacity × service = {settings.capacity:g}/s × {settings.service * 1000:g} ms = "
        f"{k:g} permits: "
        "below it goodput = permits ÷ latency (Little); above it the extra permits only queue at the "
        f"downstream and add latency, until a call waits {settings.timeout * 1000:g} ms and times out "
        f"(at {settings.capacity * settings.timeout:g} permits every call does: goodput 0)."
    )
    if plot:
        console.print(plot_note(plot))
    return 0
