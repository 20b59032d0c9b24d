"""`foundry lab loop`: a CPU phase on a shared event loop, step by step until the health
check misses its budget (the loop-starvation schedule).

    foundry lab loop --cpu 35ms --rate 300/s --budget 100ms

A schedule, not a simulation: it takes no seed or confidence level.
"""

from __future__ import annotations

import argparse
from typing import Any

from foundry.cli.lab._args import DURATION, OPT_DURATION, RATE, add_output_options
from foundry.cli.lab._output import emit_json, lab_console, plot_note


def add_parser(labsub: Any) -> None:
    """Register `foundry lab loop` on the `lab` subparsers."""
    loop = labsub.add_parser("loop", help="a CPU phase on a shared event loop: the starvation schedule")
    loop.add_argument("--cpu", type=DURATION, default=0.035, help="CPU phase per request (35ms)")
    loop.add_argument("--rate", type=RATE, default=300.0, help="request rate (300/s)")
    loop.add_argument("--budget", type=DURATION, default=0.100, help="liveness budget (100ms)")
    loop.add_argument("--health-at", type=DURATION, default=0.010, help="health check arrival (10ms)")
    loop.add_argument("--health-cost", type=DURATION, default=0.003, help="health check's own cost (3ms)")
    loop.add_argument("--ready", type=int, default=None, help="requests ready at step 1 (rate × 20ms)")
    loop.add_argument(
        "--probe-timeout", type=OPT_DURATION, default=0.150, help="orchestrator timeout (150ms|none)"
    )
    loop.add_argument("--arrivals", choices=("burst", "steady"), default="burst")
    loop.add_argument("--max-steps", type=int, default=60)
    add_output_options(loop, sim=False)
    loop.set_defaults(func=run_loop)


def run_loop(args: argparse.Namespace) -> int:
    from foundry.lab.loop import LoopSettings, schedule

    sched = schedule(
        LoopSettings(
            cpu=args.cpu,
            rate=args.rate,
            budget=args.budget,
            health_at=args.health_at,
            health_cost=args.health_cost,
            ready=args.ready,
            probe_timeout=args.probe_timeout,
            arrivals=args.arrivals,
            max_steps=args.max_steps,
        )
    )
    plot = None
    if args.plot:
        from foundry.lab.plot import plot_loop

        plot = str(plot_loop(args.plot, sched))
    if args.json:
        data = sched.as_dict()
        data["plot"] = plot
        emit_json(data)
        return 0
    from rich.table import Table

    console = lab_console()
    s = sched.settings
    table = Table(
        title=f"{s.cpu * 1000:g} ms of CPU per request on a shared loop at {s.rate:g} req/s — {sched.method}"
    )
    table.add_column("#", justify="right")
    table.add_column("Event loop")
    table.add_column("Payment requests (queued)")
    table.add_column(f"Health check (queued at t={s.health_at * 1000:g}ms)")
    table.add_column("State")
    for r in sched.rows:
        state = r.state + (f"\n[bold red]{r.note}[/bold red]" if r.note else "")
        table.add_row(str(r.step), r.loop or "·", r.payments or "·", r.health or "·", state)
    console.print(table)
    for line in sched.summary:
        style = "bold red" if line.startswith("Budget broken") else "yellow" if line.startswith("Fix") else ""
        console.print(f"[{style}]{line}[/{style}]" if style else line)
    if plot:
        console.print(plot_note(plot))
    return 0
