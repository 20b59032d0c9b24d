"""Plots of the lab's answers, as PNG or SVG (matplotlib, optional extra ``lab``).

matplotlib is imported lazily, inside each function, and only its object API is used
(``matplotlib.figure.Figure``, never ``pyplot``): no global state, no GUI backend, safe
from any thread. PNG is rendered by Agg; SVG by matplotlib's SVG backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from foundry.errors import LabInputError
from foundry.lab import queueing
from foundry.lab.loop import LoopSchedule
from foundry.lab.permits import PermitRow
from foundry.lab.servers import MODELS, ServerResult
from foundry.lab.sim import PoolSim

__all__ = ["plot_loop", "plot_permits", "plot_pool", "plot_servers"]

FORMATS = (".png", ".svg")


def _figure(path: str | Path, panels: int) -> tuple[Any, list[Any]]:
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise LabInputError(
            "plot", str(path), "has no .png or .svg extension", "name the file e.g. lab.png or lab.svg"
        )
    try:
        from matplotlib.figure import Figure
    except ModuleNotFoundError as exc:
        raise LabInputError(
            "plot", str(path), "needs matplotlib, which is not installed", "pip install 'foundry-exec[lab]'"
        ) from exc
    fig = Figure(figsize=(6.0 * panels, 4.2), layout="constrained")
    axes = [fig.add_subplot(1, panels, i + 1) for i in range(panels)]
    return fig, axes


def _save(fig: Any, path: str | Path) -> Path:
    out = Path(path)
    try:
        fig.savefig(out, dpi=110)
    except OSError as exc:
        raise LabInputError(
            "plot", str(path), f"cannot be written ({exc.strerror})", "pick a writable path"
        ) from exc
    return out


def plot_pool(
    path: str | Path,
    workers: int,
    service: float,
    *,
    rate: float | None = None,
    ca: float = 1.0,
    cs: float = 1.0,
    sims: Mapping[float, PoolSim] | None = None,
) -> Path:
    """Mean response time and queue length against utilisation ρ, for every method."""
    fig, (ax_w, ax_l) = _figure(path, 2)
    capacity = workers / service
    loads = [i / 100.0 for i in range(2, 97)]
    curves: dict[str, Callable[[float], queueing.Metrics | None]] = {
        queueing.ERLANG_C: lambda r: queueing.mmc(workers, service, r),
        f"{queueing.ALLEN_CUNNEEN} (ca={ca:g}, cs={cs:g})": lambda r: queueing.allen_cunneen(
            workers, service, r, ca, cs
        ),
        f"{queueing.SAKASEGAWA} (ca={ca:g}, cs={cs:g})": lambda r: queueing.sakasegawa(
            workers, service, r, ca, cs
        ),
    }
    styles = ("-", "--", ":")
    for (label, model), style in zip(curves.items(), styles, strict=True):
        points = [(rho, model(rho * capacity)) for rho in loads]
        xs = [rho for rho, m in points if m is not None]
        ax_w.plot(xs, [m.w * 1000 for _, m in points if m is not None], style, label=label)
        ax_l.plot(xs, [m.lq for _, m in points if m is not None], style, label=f"Lq, {label}")
    for rho, sim in sorted((sims or {}).items()):
        ax_w.errorbar(
            [rho], [sim.w.mean * 1000], yerr=[sim.w.half_width * 1000], fmt="o", color="black", ms=4
        )
        ax_l.errorbar([rho], [sim.lq.mean], yerr=[sim.lq.half_width], fmt="o", color="black", ms=4)
    if sims:
        ax_w.plot([], [], "o", color="black", ms=4, label="simulation, 95% CI")
    if rate is not None and rate < capacity:
        ax_w.axvline(rate / capacity, color="grey", lw=0.8)
        ax_l.axvline(rate / capacity, color="grey", lw=0.8)
    for ax in (ax_w, ax_l):
        ax.axvline(1.0, color="red", lw=0.8)
        ax.set_xlim(0, 1.0)
        ax.set_xlabel("utilisation ρ (ρ ≥ 1: unbounded queue)")
        ax.grid(alpha=0.3)
    exact_top = queueing.mmc(workers, service, 0.96 * capacity)
    top_w = max(2.0 * service, exact_top.w * 1.15 if exact_top else 0.0)
    ax_w.set_ylim(0, min(10 * service, top_w) * 1000)
    ax_l.set_ylim(0, max(1.0, exact_top.lq * 1.15 if exact_top else 1.0))
    ax_w.set_ylabel("mean response time W (ms)")
    ax_l.set_ylabel("mean queue length Lq")
    ax_w.set_title(f"{workers} workers, {service * 1000:g} ms service")
    ax_w.legend(fontsize=7)
    return _save(fig, path)


def plot_permits(path: str | Path, rows: Sequence[PermitRow], sim_rows: Sequence[PermitRow] = ()) -> Path:
    """Goodput and mean latency against permits."""
    fig, (ax_g, ax_w) = _figure(path, 2)
    for data, style, label in ((rows, "o-", "fluid model"), (sim_rows, "s--", "simulation, 95% CI")):
        if not data:
            continue
        xs = [r.permits for r in data]
        ax_g.errorbar(
            xs,
            [r.goodput for r in data],
            yerr=[(r.half_widths or {}).get("goodput", 0.0) for r in data],
            fmt=style,
            label=label,
            ms=4,
        )
        ax_w.errorbar(
            xs,
            [r.latency * 1000 for r in data],
            yerr=[(r.half_widths or {}).get("latency", 0.0) * 1000 for r in data],
            fmt=style,
            label=label,
            ms=4,
        )
    for ax in (ax_g, ax_w):
        ax.set_xscale("log")
        ax.set_xlabel("permits (max concurrent calls)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax_g.set_ylabel("goodput (successful calls/s)")
    ax_w.set_ylabel("mean latency (ms)")
    ax_g.set_title("goodput vs permits")
    ax_w.set_title("latency vs permits")
    return _save(fig, path)


def plot_servers(path: str | Path, results: Mapping[int, Sequence[ServerResult]]) -> Path:
    """Throughput and mean latency against concurrency, one line per server model."""
    fig, (ax_x, ax_w) = _figure(path, 2)
    levels = sorted(results)
    for model in MODELS:
        rows = [next((r for r in results[n] if r.model == model), None) for n in levels]
        xs = [n for n, r in zip(levels, rows, strict=True) if r is not None]
        got = [r for r in rows if r is not None]
        if not got:
            continue
        ax_x.errorbar(
            xs, [r.throughput for r in got], yerr=[r.throughput_hw for r in got], fmt="o-", label=model
        )
        ax_w.errorbar(
            xs,
            [r.latency * 1000 for r in got],
            yerr=[r.latency_hw * 1000 for r in got],
            fmt="o-",
            label=model,
        )
    for ax in (ax_x, ax_w):
        ax.set_xlabel("concurrency (requests in flight)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax_x.set_ylabel("throughput (req/s), simulation 95% CI")
    ax_w.set_ylabel("mean latency (ms), simulation 95% CI")
    return _save(fig, path)


def plot_loop(path: str | Path, sched: LoopSchedule) -> Path:
    """How long the health check has been ready without running, against the budget."""
    fig, (ax,) = _figure(path, 1)
    s = sched.settings
    budget_ms = s.budget * 1000
    if sched.health_ready_at is not None:
        ready = sched.health_ready_at * 1000
        waited = (sched.health_waited or 0.0) * 1000
        if sched.health_waited is None:  # never ran within max_steps
            waited = max(r.health_wait or 0.0 for r in sched.rows) * 1000
        ax.plot(
            [ready, ready + waited, ready + waited],
            [0.0, waited, 0.0],
            "-",
            label="health check ready, not run",
        )
        if sched.budget_broken_at is not None:
            x = sched.budget_broken_at * 1000
            ax.plot(
                [x],
                [budget_ms],
                "x",
                color="red",
                ms=10,
                label=f"budget blown (step {sched.budget_broken_step})",
            )
    if s.probe_timeout is not None and sched.sigterm_step is not None:
        ax.axvline(
            (s.health_at + s.probe_timeout) * 1000,
            color="black",
            ls="--",
            lw=0.8,
            label="probe timeout: SIGTERM",
        )
    ax.axhline(budget_ms, color="red", lw=0.8, label=f"budget {budget_ms:g} ms")
    ax.set_xlabel("loop time (ms)")
    ax.set_ylabel("health check ready without running (ms)")
    ax.set_title(f"{s.cpu * 1000:g} ms CPU per request on one loop at {s.rate:g}/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)
