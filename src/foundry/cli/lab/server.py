"""`foundry lab server`: thread per request vs fixed pool vs async at the same load.

foundry lab server --concurrency 200 --cpu 2ms --wait 48ms
"""

from __future__ import annotations

import argparse
from typing import Any

from foundry.cli.lab._args import DURATION, SIZE, add_output_options, int_list
from foundry.cli.lab._output import emit_json, lab_console, plot_note, pm


def add_parser(labsub: Any) -> None:
    """Register `foundry lab server` on the `lab` subparsers."""
    server = labsub.add_parser("server", help="thread per request vs fixed pool vs async at the same load")
    server.add_argument("--concurrency", type=int, default=200, help="requests in flight (default 200)")
    server.add_argument("--cpu", type=DURATION, default=0.002, help="CPU per request (2ms)")
    server.add_argument("--wait", type=DURATION, default=0.048, help="waiting per request (48ms)")
    server.add_argument("--cores", type=int, default=8)
    server.add_argument("--pool", type=int, default=32, help="fixed pool threads (32)")
    server.add_argument("--stack", type=SIZE, default=1024 * 1024, help="per-thread stack estimate (1MiB)")
    server.add_argument("--task-frame", type=SIZE, default=4 * 1024, help="per async task estimate (4KiB)")
    server.add_argument("--spawn", type=DURATION, default=0.0001, help="thread start CPU cost (0.1ms)")
    server.add_argument("--gil", action="store_true", help="threads share one interpreter lock")
    server.add_argument("--cv", type=float, default=1.0, help="CV of the CPU and wait phases (1)")
    server.add_argument("--memory", type=SIZE, default=None, help="memory available, e.g. 2GiB")
    server.add_argument("--requests", type=int, default=20_000, help="completions per replication")
    server.add_argument("--replications", type=int, default=4)
    server.add_argument(
        "--sweep", type=int_list, default=None, help="concurrencies for --plot (default 4 levels)"
    )
    add_output_options(server)
    server.set_defaults(func=run_server)


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"


def run_server(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from foundry.lab.servers import BOUNDS, ServerSettings, compare, sweep_concurrency

    settings = ServerSettings(
        concurrency=args.concurrency,
        cpu=args.cpu,
        wait=args.wait,
        cores=args.cores,
        pool=args.pool,
        stack=args.stack,
        task_frame=args.task_frame,
        spawn=args.spawn,
        gil=args.gil,
        cv=args.cv,
        memory_limit=args.memory,
        requests=args.requests,
    ).checked()
    opts: dict[str, Any] = {
        "replications": args.replications,
        "seed": args.seed,
        "confidence": args.confidence,
    }
    results = compare(settings, **opts)
    plot = None
    if args.plot:
        from foundry.lab.plot import plot_servers

        levels = args.sweep or sorted(
            {
                max(1, args.concurrency // 4),
                args.concurrency // 2 or 1,
                args.concurrency,
                args.concurrency * 2,
            }
        )
        quick = replace(settings, requests=min(settings.requests, 8_000))
        plot = str(plot_servers(args.plot, sweep_concurrency(levels, quick, **opts)))
    if args.json:
        emit_json({"inputs": settings.as_dict(), "models": [r.as_dict() for r in results], "plot": plot})
        return 0
    from rich.table import Table

    console = lab_console()
    console.print(
        f"offered load = concurrency ÷ (cpu + wait) = {settings.concurrency} ÷ "
        f"{(settings.cpu + settings.wait) * 1000:g} ms = [bold]{settings.offered:,.0f} req/s[/bold]"
        f"{' — threads under the GIL' if settings.gil else ''}"
    )
    table = Table(title=f"Server models at the same load ({results[0].method}; bounds: {BOUNDS})")
    for name in (
        "model",
        "throughput (req/s)",
        "bound",
        "mean latency (ms)",
        "p99 (ms)",
        "memory",
        "bottleneck",
    ):
        table.add_column(name, justify="right" if name not in ("model", "bottleneck") else "left")
    for r in results:
        table.add_row(
            r.model + (" [red]✕[/red]" if r.fails else ""),
            pm(f"{r.throughput:,.0f}", r.throughput_hw, 0),
            f"≤ {r.max_throughput:,.0f}",
            pm(f"{r.latency * 1000:.1f}", r.latency_hw, 1, 1000.0),
            pm(f"{r.p99 * 1000:.0f}", r.p99_hw, 0, 1000.0),
            _mib(r.memory),
            r.bottleneck,
        )
    console.print(table)
    for r in results:
        if r.fails:
            console.print(f"[red]{r.model}: {r.fails}[/red]")
    console.print(
        "[dim]memory: threads × stack (+ tasks × task frame for async), an estimate; CPU modelled as FCFS on "
        "the cores[/dim]"
    )
    if plot:
        console.print(plot_note(plot))
    return 0
