"""`foundry profile MODULE:FN --args JSON --runs N`: measure a callable, classify it, decide.

Wall time, CPU time (this thread and the whole process with its children), the
CPU/wall ratio, peak Python memory; compute-bound, waiting-bound or mixed; the traits
that implies, and the decision they lead to. For a declared unit the declared traits
are kept and the measured ``est``/``bound`` replace theirs; a disagreement is reported
("declared io, measured cpu: reclassify this phase").
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from foundry.cli._target import Problem, reports_problems, resolve
from foundry.cli._target import console as make_console
from foundry.errors import SubmitError


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "profile",
        help="run a callable on sample input; measure wall, CPU, memory; infer its traits and model",
    )
    parser.add_argument("target", metavar="MODULE:FN", help="a function or a declared unit")
    parser.add_argument(
        "--args",
        default="[]",
        metavar="JSON",
        help="arguments as JSON: a list is positional, an object is keywords, "
        'or {"args": [...], "kwargs": {...}} (default: [])',
    )
    parser.add_argument("--runs", type=int, default=5, help="measured runs (default 5; 1..10000)")
    parser.add_argument("--json", action="store_true", help="print the measurement and decision as JSON")
    parser.set_defaults(func=run)


def parse_args_json(text: str) -> tuple[list[Any], dict[str, Any]]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise Problem(
            f"--args {text!r} is not JSON ({exc.msg} at position {exc.pos}). Fix: quote it, e.g. "
            "--args '[\"in.csv\"]' or --args '{\"n\": 3}'",
            2,
        ) from exc
    if isinstance(value, dict) and set(value) <= {"args", "kwargs"} and value:
        args, kwargs = value.get("args", []), value.get("kwargs", {})
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise Problem(
                '--args {"args": ..., "kwargs": ...} needs a list and an object. Fix: see --help', 2
            )
        return args, kwargs
    if isinstance(value, list):
        return value, {}
    if isinstance(value, dict):
        return [], value
    return [value], {}


@reports_problems("profile")
def run(args: argparse.Namespace) -> int:
    from foundry.profile import profile_callable

    positional, keywords = parse_args_json(args.args)
    if not 1 <= args.runs <= 10_000:
        raise Problem(f"--runs {args.runs} is out of range. Fix: give --runs between 1 and 10000", 2)
    _, name, target = resolve(args.target, "FN")
    fn = getattr(target, "fn", target)  # a declared unit carries its function
    declared = getattr(target, "traits", None)
    if not callable(fn):
        raise Problem(f"{args.target!r} is not callable. Fix: name a function or a declared unit")
    try:
        result = profile_callable(
            fn, positional, keywords, runs=args.runs, target=args.target, declared=declared
        )
    except SubmitError as exc:
        raise Problem(str(exc), 2) from exc
    except Exception as exc:
        first = (str(exc).splitlines() or [""])[0]
        raise Problem(
            f"{name} raised {type(exc).__name__}: {first}. Fix: profile it on input it accepts"
        ) from exc
    if args.json:
        json.dump(result.as_dict(), sys.stdout, indent=2)
        print()
        return 0
    _print(result)
    return 0


def _print(p: Any) -> None:
    from rich.table import Table

    from foundry.decide.questions import fmt_seconds
    from foundry.explain import first_failure

    console = make_console()
    walls = [r.wall for r in p.runs]
    table = Table(title=f"Profile of {p.target} ({len(p.runs)} runs)", title_justify="left")
    table.add_column("measure", style="bold", overflow="fold")
    table.add_column("value", justify="right", overflow="fold")
    table.add_row("wall time (median)", fmt_seconds(p.wall))
    table.add_row("wall time (min / max)", f"{fmt_seconds(min(walls))} / {fmt_seconds(max(walls))}")
    table.add_row("CPU time (median, process + children)", fmt_seconds(p.cpu))
    table.add_row("CPU / wall", f"{p.ratio:.2f}")
    table.add_row("peak Python memory (one run)", f"{p.peak_memory / 1024:.1f} KiB")
    table.add_row("classified", p.kind)
    if p.gil_speedup is not None:
        verdict = {True: "releases the GIL", False: "holds the GIL", None: "inconclusive"}[p.releases_gil]
        table.add_row("2 threads vs 1 (calls per second)", f"{p.gil_speedup:.2f}× — {verdict}")
    console.print(table)
    if p.wall < 0.001:
        console.print(
            "[dim]Under 1 ms per call the clocks' own cost skews CPU/wall: profile a larger input.[/dim]"
        )
    elif p.ratio > 1.2:
        console.print("[dim]CPU/wall above 1: it used several cores (native threads or children).[/dim]")
    gil = "" if p.releases_gil is None else f", releases_gil={p.releases_gil}"
    console.print(
        f'Inferred traits: [bold]est="{fmt_seconds(p.inferred.est)}", bound="{p.inferred.bound}"{gil}[/bold]'
    )
    if p.releases_gil is None and p.gil_speedup is not None:
        console.print(
            "[dim]2 threads were neither clearly faster nor as slow as 1: a loaded machine blurs it; "
            "profile again on a quiet one.[/dim]"
        )
    for line in p.disagreements:
        console.print(f"[yellow]! {line}[/yellow]")
    d = p.decision
    console.print(
        f"Decision: [bold cyan]{d.model}[/bold cyan] (delivery by {d.delivery_decided_by}, "
        f"execution by {d.decided_by}); first failure mode: {first_failure(d)}"
    )
    for line in d.load.lines:
        console.print(f"[dim]  {line}[/dim]")
    for w in d.warnings:
        console.print(f"[yellow]⚠ {w.title}: {w.message}. Fix: {w.fix}[/yellow]")
    console.print(
        "[dim]Declare what else you know (rate=, concurrency=, durable=) and run foundry explain.[/dim]"
    )
