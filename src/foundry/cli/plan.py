"""`foundry plan MODULE_OR_FILE`: every declared unit and phase, how it runs, and why."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from foundry.cli._target import Problem, find_apps, load_module, plan_rows, reports_problems
from foundry.cli._target import console as make_console


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "plan",
        help="decide every unit in a module: delivery, execution, deciding question, first failure",
        description="Import a module (pkg.mod) or a file (app.py), find every Foundry app in it and "
        "print the decision for every unit and phase.",
    )
    parser.add_argument("target", metavar="MODULE_OR_FILE", help="e.g. foundry.examples.seeds or ./app.py")
    out = parser.add_mutually_exclusive_group()
    out.add_argument(
        "--markdown",
        metavar="PATH",
        help="write a decision record (Markdown) a team can commit; '-' prints it",
    )
    out.add_argument("--json", action="store_true", help="print every decision as JSON")
    parser.set_defaults(func=run)


@reports_problems("plan")
def run(args: argparse.Namespace) -> int:
    from foundry.explain import plan_json, plan_table, render_markdown

    module = load_module(args.target)
    apps = find_apps(module)
    if not apps:
        raise Problem(
            f"no Foundry app in {args.target!r}. Fix: declare units with `app = Foundry()` and "
            "`@app.work(...)` at module level"
        )
    rows = plan_rows(apps)
    if args.json:
        json.dump(plan_json(rows), sys.stdout, indent=2)
        print()
        return 0
    if args.markdown:
        text = render_markdown(rows, source=args.target)
        if args.markdown == "-":
            sys.stdout.write(text)
            return 0
        try:
            Path(args.markdown).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise Problem(
                f"cannot write {args.markdown!r}: {exc.strerror}. Fix: pick a writable path"
            ) from exc
        print(f"wrote the decision record for {len(rows)} units to {args.markdown}")
        return 0
    console = make_console()
    console.print(plan_table(rows, title=f"Plan for {args.target}"))
    warned = sum(1 for _, _, main, phases in rows for d in (main, *phases.values()) if d.warnings)
    if warned:
        console.print(f"[yellow]{warned} decision(s) carry anti-pattern warnings.[/yellow]")
    first = rows[0][1] if rows else "NAME"
    console.print(f"[dim]The whole bill: foundry explain {args.target}:{first}[/dim]")
    return 0
