"""`foundry lab`: capacity answers before production gives them.

    foundry lab pool    --workers 8 --service 50ms --rate 120/s   M/M/c, G/G/c, simulation
    foundry lab permits [--sim]                                   goodput vs permits
    foundry lab server  --concurrency 200 --cpu 2ms --wait 48ms   thread/request vs pool vs async
    foundry lab loop    --cpu 35ms --rate 300/s --budget 100ms    loop-starvation schedule
    foundry lab fit     --csv times.csv --rate 120/s --target 100ms   sizes from measurements

Every subcommand prints rich tables, or ``--json``, and draws ``--plot FILE.png|.svg``.
Every number is labelled with the method that produced it. Bad input exits 2 (syntax,
from argparse) or 1 (a :class:`~foundry.errors.LabInputError` naming field and fix).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from foundry.lab.queueing import Metrics, PoolAnalysis
    from foundry.lab.sim import PoolSim

SEED_POOL = (8, 0.050, 120.0)


# -- argument types (syntax errors exit 2 through argparse) ---------------------


def _typed(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        from foundry.errors import DeclarationError

        try:
            return parse(text)
        except DeclarationError as exc:
            raise argparse.ArgumentTypeError(f"{text!r} {exc.problem}. Fix: {exc.fix}") from exc

    return convert


def _duration(text: str) -> float:
    from foundry.traits import parse_duration

    return parse_duration(text, unit="lab")


def _rate(text: str) -> float:
    from foundry.traits import parse_rate

    return parse_rate(text, unit="lab")


def _size(text: str) -> int:
    from foundry.traits import parse_size

    return parse_size(text, unit="lab")


def _optional_duration(text: str) -> float | None:
    return None if text.lower() in ("none", "never", "off") else _duration(text)


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers") from exc


DURATION = _typed(_duration)
RATE = _typed(_rate)
SIZE = _typed(_size)
OPT_DURATION = _typed(_optional_duration)


def _common(parser: argparse.ArgumentParser, *, sim: bool = True) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--plot", metavar="FILE", help="also draw a plot to FILE.png or FILE.svg")
    if sim:
        parser.add_argument("--seed", type=int, default=0, help="simulation seed (default 0: reproducible)")
        parser.add_argument(
            "--confidence", type=float, default=0.95, help="confidence level of intervals (default 0.95)"
        )


def add_parser(sub: Any) -> None:
    lab: argparse.ArgumentParser = sub.add_parser(
        "lab", help="queueing models and simulation: pool sizing, permits, server models, loop starvation"
    )
    labsub = lab.add_subparsers(dest="lab_command", metavar="MODEL")

    def show_help(args: argparse.Namespace) -> int:
        lab.print_help()
        return 2

    lab.set_defaults(func=show_help)

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
    _common(pool)
    pool.set_defaults(func=run_pool)

    permits = labsub.add_parser(
        "permits", help="goodput, latency and timeouts vs concurrency permits (seed table)"
    )
    permits.add_argument(
        "--permits", type=_int_list, default=None, help="comma-separated (default 1,5,...,500)"
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
    _common(permits)
    permits.set_defaults(func=run_permits)

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
        "--sweep", type=_int_list, default=None, help="concurrencies for --plot (default 4 levels)"
    )
    _common(server)
    server.set_defaults(func=run_server)

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
    _common(loop, sim=False)
    loop.set_defaults(func=run_loop)

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
    _common(fit)
    fit.set_defaults(func=run_fit)


# -- formatting ----------------------------------------------------------------------


def _console() -> Console:
    from foundry.cli._target import console

    out: Console = console(width=160)
    return out


def _emit_json(data: dict[str, Any]) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


def _ms(seconds: float | None, digits: int = 1) -> str:
    return "—" if seconds is None else f"{seconds * 1000:.{digits}f}"


def _pm(value: str, half: float | None, digits: int = 1, scale: float = 1.0) -> str:
    return value if half is None else f"{value} ±{half * scale:.{digits}f}"


def _plot_note(path: str) -> str:
    return f"[dim]plot written to {path}[/dim]"


# -- pool -----------------------------------------------------------------------------


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
        _emit_json(data)
        return 0
    _print_pool(analysis, sim)
    if plot:
        _console().print(_plot_note(plot))
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

    console = _console()
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
        _pm(f"{sim.in_system_at_end.mean:.0f}", sim.in_system_at_end.half_width, 0),
    )
    table.add_row("throughput (req/s)", _pm(f"{sim.throughput.mean:.1f}", sim.throughput.half_width))
    table.add_row("busy workers (ρ̂)", _pm(f"{sim.utilisation.mean:.3f}", sim.utilisation.half_width, 3))
    table.add_row("W of arrivals so far (ms)", _pm(_ms(sim.w.mean), sim.w.half_width, 1, 1000.0))
    table.add_row("Lq, time-averaged", _pm(f"{sim.lq.mean:.1f}", sim.lq.half_width))
    _console().print(table)


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


# -- permits --------------------------------------------------------------------------


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
        _emit_json(
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

    console = _console()
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
                _pm(f"{r.goodput:.0f}/s", hw.get("goodput"), 0),
                _pm(f"{r.latency * 1000:.0f} ms", hw.get("latency"), 0, 1000.0),
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
        console.print(_plot_note(plot))
    return 0


# -- server ---------------------------------------------------------------------------


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
        _emit_json({"inputs": settings.as_dict(), "models": [r.as_dict() for r in results], "plot": plot})
        return 0
    from rich.table import Table

    console = _console()
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
            _pm(f"{r.throughput:,.0f}", r.throughput_hw, 0),
            f"≤ {r.max_throughput:,.0f}",
            _pm(f"{r.latency * 1000:.1f}", r.latency_hw, 1, 1000.0),
            _pm(f"{r.p99 * 1000:.0f}", r.p99_hw, 0, 1000.0),
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
        console.print(_plot_note(plot))
    return 0


# -- loop -----------------------------------------------------------------------------


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
        _emit_json(data)
        return 0
    from rich.table import Table

    console = _console()
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
        console.print(_plot_note(plot))
    return 0


# -- fit ------------------------------------------------------------------------------


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
        _emit_json(data)
        return 0
    from rich.table import Table

    console = _console()
    m = measured
    table = Table(title=f"measured: {m.source}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("how")
    table.add_row("samples", f"{m.count:,}", "")
    table.add_row("mean service", f"{m.service.mean * 1000:.2f} ms", "sample mean" if m.count else "")
    table.add_row("service CV", f"{m.service.cv:.2f}", m.cv_note)
    table.add_row("service p50 / p99", f"{_ms(m.p50)} / {_ms(m.p99)} ms", "")
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
    rec.add_row("mean response W", _pm(f"{fit.sim_w * 1000:.1f} ms", fit.sim_w_hw, 1, 1000.0), fit.sim_method)
    if fit.sim_p is not None and fit.percentile is not None:
        rec.add_row(
            f"p{fit.percentile:g} response",
            _pm(f"{fit.sim_p * 1000:.1f} ms", fit.sim_p_hw, 1, 1000.0),
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
        console.print(_plot_note(plot))
    return 0
