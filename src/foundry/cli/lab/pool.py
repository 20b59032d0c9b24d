"""`foundry lab pool`: a pool of workers in closed forms (M/M/c, G/G/c) and simulated.

    foundry lab pool --workers 8 --service 50ms --rate 120/s

The defaults are the seed example (8 workers, 50 ms, 120/s), whose published figures the
output reconciles with the exact Erlang C ones.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from foundry.cli.lab._args import DURATION, RATE, add_output_options
from foundry.cli.lab._output import emit_json, lab_console, ms, plot_note, pm

if TYPE_CHECKING:
    from foundry.lab.queueing import Metrics, PoolAnalysis
    from foundry.lab.sim import PoolSim

SEED_POOL = (8, 0.050, 120.0)


def add_parser(labsub: Any) -> None:
    """Register `foundry lab pool` on the `lab` subparsers."""
    pool = labsub.add_parser(
        "pool", help="a pool of workers: capacity, ρ, P(wait), Wq, W, L (seed: 8, 50ms, 120/s)"
    )
    pool.add_argument("--workers", type=int, default=SEED_POOL[0], help="workers c (default 8)")
    pool.add_argument(
        "--service", type=DURATION, default=SEED_POOL[1], help="mean service time (default 50ms)"
    )
    pool.add_argument("--rate", type=RATE, default=SEED_POOL[2], help="arrival rate λ (default 120/s)")
    pool.add_argument("--ca", type=float, default=1.0, help="arrival coefficient of variation (1: Poisson)")
    pool.add_argument(
        "--cs", type=float, default=1.0, help="service coefficient of variation (1: exponential)"
    )
    shapes = "auto (by CV), deterministic, exponential, gamma, h2, lognormal"
    pool.add_argument("--arrivals", default="auto", help=f"arrival process: {shapes}, batch")
    pool.add_argument("--service-dist", default="auto", help=f"service distribution: {shapes}")
    mode = pool.add_mutually_exclusive_group()
    mode.add_argument("--sim", dest="sim", action="store_true", default=None, help="always simulate")
    mode.add_argument("--no-sim", dest="sim", action="store_false", help="closed forms only")
    pool.add_argument(
        "--customers", type=int, default=20_000, help="customers per replication (default 20000)"
    )
    pool.add_argument("--replications", type=int, default=10, help="independent replications (default 10)")
    pool.add_argument(
        "--warmup", type=int, default=None, help="customers discarded per replication (default 1/5)"
    )
    pool.add_argument(
        "--horizon", type=DURATION, default=None, help="simulate from empty for this long (ρ ≥ 1 ok)"
    )
    add_output_options(pool)
    pool.set_defaults(func=run_pool)


def run_pool(args: argparse.Namespace) -> int:
    from foundry.lab.distributions import Dist
    from foundry.lab.queueing import analyse_pool
    from foundry.lab.sim import simulate_pool

    shapes = ("auto", "deterministic", "exponential", "gamma", "h2", "lognormal")
    service = Dist.of(
        args.service, args.cs, args.service_dist, field="--cs", kind_field="--service-dist", kinds=shapes
    )
    arrivals = (
        Dist.of(
            1.0 / args.rate,
            args.ca,
            args.arrivals,
            field="--ca",
            kind_field="--arrivals",
            kinds=(*shapes, "batch"),
        )
        if args.rate > 0
        else None
    )
    # the closed forms use the variability the simulation really has (e.g. --arrivals deterministic)
    args.ca = arrivals.cv if arrivals is not None else args.ca
    args.cs = service.cv
    analysis = analyse_pool(args.workers, args.service, args.rate, args.ca, args.cs)
    want_sim = args.sim if args.sim is not None else (analysis.stable or args.horizon is not None)
    sim = None
    if want_sim:
        if arrivals is None:
            from foundry.errors import LabInputError

            raise LabInputError(
                "rate", args.rate, "is zero: nothing arrives to simulate", "give a positive rate"
            )
        sim = simulate_pool(
            args.workers,
            service,
            args.rate,
            arrivals=arrivals,
            customers=args.customers,
            warmup=args.warmup,
            replications=args.replications,
            seed=args.seed,
            confidence=args.confidence,
            horizon=args.horizon,
        )
    plot = _pool_plot(args, analysis, service, arrivals, sim) if args.plot else None
    if args.json:
        data: dict[str, Any] = analysis.as_dict()
        data["simulation"] = sim.as_dict() if sim is not None else None
        data["seed_figures"] = _seed_note(analysis)
        data["plot"] = plot
        emit_json(data)
        return 0
    _print_pool(analysis, sim)
    if plot:
        lab_console().print(plot_note(plot))
    return 0


def _seed_note(analysis: PoolAnalysis) -> str | None:
    from foundry.lab.queueing import ERLANG_C, SAKASEGAWA

    if (analysis.workers, analysis.service, analysis.rate) != SEED_POOL or not analysis.stable:
        return None
    exact, saka = analysis.method(ERLANG_C), analysis.method(SAKASEGAWA)
    return (
        f"Seed 003 prints W 59.8 ms and L 7.2: those are the {SAKASEGAWA} figures "
        f"(W {saka.w * 1000:.1f} ms, L {saka.l:.1f}). Exact M/M/8 (Erlang C) gives "
        f"W {exact.w * 1000:.1f} ms, L {exact.l:.2f}."
    )


def _print_pool(analysis: PoolAnalysis, sim: PoolSim | None) -> None:
    from rich.table import Table

    console = lab_console()
    a = analysis
    console.print(
        f"capacity = workers / service = {a.workers} / {a.service * 1000:g} ms = "
        f"[bold]{a.capacity:.1f} req/s[/bold]"
    )
    console.print(
        f"ρ = arrivals / capacity = {a.rate:g} / {a.capacity:.1f} = [bold]{a.utilisation:.3f}[/bold]"
    )
    if not a.stable:
        console.print(f"[bold red]unbounded queue[/bold red]: {a.unbounded}.")
        if sim is not None:
            _print_transient(sim)
        else:
            console.print(
                "[dim]simulation skipped: give --horizon 10s to watch the queue grow from empty[/dim]"
            )
        return
    rows: list[Metrics] = list(a.methods)
    if sim is not None:
        rows.append(sim.metrics())
    table = Table(title=f"{a.workers} workers, {a.service * 1000:g} ms service, {a.rate:g}/s arrivals")
    table.add_column("figure")
    for m in rows:
        table.add_column(m.method, justify="right")

    def line(
        label: str, pick: Callable[[Metrics], tuple[float | None, str | None]], fmt: str, scale: float
    ) -> None:
        cells = []
        for m in rows:
            value, key = pick(m)
            if value is None:
                cells.append("—")
                continue
            text = format(value * scale, fmt)
            half = m.half_widths.get(key) if key else None
            cells.append(text if half is None else f"{text} ±{format(half * scale, fmt)}")
        table.add_row(label, *cells)

    line("P(wait)", lambda m: (m.p_wait, "p_wait"), ".3f", 1.0)
    line("Wq, mean wait (ms)", lambda m: (m.wq, "wq"), ".2f", 1000.0)
    line("W, mean response (ms)", lambda m: (m.w, "w"), ".1f", 1000.0)
    line("Lq, mean waiting", lambda m: (m.lq, "lq"), ".2f", 1.0)
    line("L, mean in system", lambda m: (m.l, "l"), ".2f", 1.0)
    line("Little λ × W", lambda m: (m.little_l, "little_l"), ".2f", 1.0)
    line("W p50 (ms)", lambda m: (m.p50, "p50"), ".1f", 1000.0)
    line("W p99 (ms)", lambda m: (m.p99, "p99"), ".1f", 1000.0)
    console.print(table)
    exact = a.methods[0]
    console.print(
        f"Little L = λ × W → {a.rate / 1000:.3f}/ms × {exact.w * 1000:.1f} ms = {exact.l:.2f} in flight "
        f"({exact.method})"
    )
    for m in rows:
        console.print(f"[dim]{m.method}: {m.note}[/dim]")
    if a.ca != 1.0 or a.cs != 1.0:
        console.print(
            f"[dim]ca={a.ca:g}, cs={a.cs:g}: the Erlang C column still assumes Poisson arrivals and "
            "exponential service; the G/G/c columns and the simulation use your variability[/dim]"
        )
    if sim is not None:
        console.print(
            "[dim]simulation L is the time-averaged number in system; its Little λ × W uses the measured "
            "throughput and mean W — they agree when Little's law holds[/dim]"
        )
    note = _seed_note(a)
    if note:
        console.print(f"[yellow]{note}[/yellow]")


def _print_transient(sim: PoolSim) -> None:
    from rich.table import Table

    table = Table(title=f"from empty over {sim.horizon:g} s ({sim.label}); transient, not a steady state")
    table.add_column("figure")
    table.add_column(sim.label, justify="right")
    table.add_row(
        "in system at the horizon",
        pm(f"{sim.in_system_at_end.mean:.0f}", sim.in_system_at_end.half_width, 0),
    )
    table.add_row("throughput (req/s)", pm(f"{sim.throughput.mean:.1f}", sim.throughput.half_width))
    table.add_row("busy workers (ρ̂)", pm(f"{sim.utilisation.mean:.3f}", sim.utilisation.half_width, 3))
    table.add_row("W of arrivals so far (ms)", pm(ms(sim.w.mean), sim.w.half_width, 1, 1000.0))
    table.add_row("Lq, time-averaged", pm(f"{sim.lq.mean:.1f}", sim.lq.half_width))
    lab_console().print(table)


def _pool_plot(
    args: argparse.Namespace, analysis: PoolAnalysis, service: Any, arrivals: Any, sim: Any
) -> str:
    from foundry.lab.plot import plot_pool
    from foundry.lab.sim import simulate_pool

    sims = {}
    if sim is not None and analysis.stable:
        sims[analysis.utilisation] = sim
        for rho in (0.3, 0.5, 0.7, 0.85):
            if abs(rho - analysis.utilisation) < 0.05:
                continue
            sims[rho] = simulate_pool(
                args.workers,
                service,
                rho * analysis.capacity,
                arrivals=arrivals,
                customers=min(args.customers, 10_000),
                replications=5,
                seed=args.seed,
                confidence=args.confidence,
            )
    return str(
        plot_pool(args.plot, args.workers, args.service, rate=args.rate, ca=args.ca, cs=args.cs, sims=sims)
    )
