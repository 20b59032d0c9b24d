"""`foundry lab fit`: pool size, permits and intake bound from measured service times.

foundry lab fit --csv times.csv --rate 120/s --target 100ms
foundry lab fit --metrics snapshot.json --target 100ms
"""

from __future__ import annotations

import argparse
from typing import Any

from foundry.cli.lab._args import DURATION, RATE, add_output_options
from foundry.cli.lab._output import emit_json, lab_console, ms, plot_note, pm


def add_parser(labsub: Any) -> None:
    """Register `foundry lab fit` on the `lab` subparsers."""
    fit = labsub.add_parser("fit", help="recommend pool size, permits and intake bound from measurements")
    source = fit.add_mutually_exclusive_group(required=True)
    source.add_argument("--csv", help="CSV with one column of service times (s or '35ms')")
    source.add_argument("--metrics", help="metrics snapshot JSON file, or an exporter URL (http://…)")
    fit.add_argument("--column", type=int, default=0, help="CSV column (default 0)")
    fit.add_argument("--unit", help="unit label to read from the metrics snapshot")
    fit.add_argument("--rate", type=RATE, default=None, help="arrival rate (default: from the metrics)")
    fit.add_argument("--target", type=DURATION, required=True, help="latency target, e.g. 100ms")
    fit.add_argument("--percentile", type=float, default=None, help="make p50/p95/p99 meet the target")
    fit.add_argument("--ca", type=float, default=1.0, help="arrival CV (1: Poisson)")
    fit.add_argument("--max-utilisation", type=float, default=0.85)
    fit.add_argument(
        "--downstream-capacity", type=RATE, default=None, help="downstream calls/s, caps permits"
    )
    add_output_options(fit)
    fit.set_defaults(func=run_fit)


def run_fit(args: argparse.Namespace) -> int:
    from foundry.lab.fit import load_csv, load_snapshot, recommend
    from foundry.lab.queueing import ALLEN_CUNNEEN

    measured = load_csv(args.csv, args.column) if args.csv else load_snapshot(args.metrics, args.unit)
    fit = recommend(
        measured,
        target=args.target,
        rate=args.rate,
        ca=args.ca,
        percentile=args.percentile,
        max_utilisation=args.max_utilisation,
        downstream_capacity=args.downstream_capacity,
        seed=args.seed,
        confidence=args.confidence,
    )
    plot = None
    if args.plot:
        from foundry.lab.plot import plot_pool

        plot = str(
            plot_pool(
                args.plot,
                fit.workers,
                measured.service.mean,
                rate=fit.rate,
                ca=args.ca,
                cs=measured.service.cv,
            )
        )
    if args.json:
        data = fit.as_dict()
        data["plot"] = plot
        emit_json(data)
        return 0
    from rich.table import Table

    console = lab_console()
    m = measured
    table = Table(title=f"measured: {m.source}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("how")
    table.add_row("samples", f"{m.count:,}", "")
    table.add_row("mean service", f"{m.service.mean * 1000:.2f} ms", "sample mean" if m.count else "")
    table.add_row("service CV", f"{m.service.cv:.2f}", m.cv_note)
    table.add_row("service p50 / p99", f"{ms(m.p50)} / {ms(m.p99)} ms", "")
    table.add_row("arrival rate", f"{fit.rate:g}/s", "given" if args.rate is not None else "from the metrics")
    console.print(table)
    what = f"p{fit.percentile:g}" if fit.percentile else "mean"
    rec = Table(title=f"recommendation for {what} ≤ {fit.target * 1000:g} ms")
    rec.add_column("setting")
    rec.add_column("value", justify="right")
    rec.add_column("method")
    rec.add_row(
        "pool size (workers)", str(fit.workers), f"smallest with W ≤ target and ρ ≤ {args.max_utilisation:g}"
    )
    rec.add_row("utilisation ρ", f"{fit.utilisation:.3f}", "λ × S ÷ workers")
    rec.add_row("mean response W", f"{fit.analytic_w * 1000:.1f} ms", ALLEN_CUNNEEN)
    rec.add_row("mean response W", pm(f"{fit.sim_w * 1000:.1f} ms", fit.sim_w_hw, 1, 1000.0), fit.sim_method)
    if fit.sim_p is not None and fit.percentile is not None:
        rec.add_row(
            f"p{fit.percentile:g} response",
            pm(f"{fit.sim_p * 1000:.1f} ms", fit.sim_p_hw, 1, 1000.0),
            fit.sim_method,
        )
    rec.add_row(
        "permits (downstream calls)",
        str(fit.permits),
        "= pool size (a semaphore with waiters is a c-server queue)"
        + (f"; downstream knee {fit.knee:.0f}" if fit.knee is not None else ""),
    )
    rec.add_row(
        "intake bound (max waiting)", str(fit.intake_bound), "(target − S) × workers ÷ S: beyond it, reject"
    )
    console.print(rec)
    for note in fit.notes:
        console.print(f"[yellow]{note}[/yellow]")
    if plot:
        console.print(plot_note(plot))
    return 0
