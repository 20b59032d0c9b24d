"""`foundry explain MODULE:NAME`: the whole bill for one unit and its phases."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from foundry.cli._target import Problem, reports_problems, resolve
from foundry.cli._target import console as make_console


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "explain",
        help="the whole bill for one unit: questions, bill, watch list, rejected, warnings",
    )
    parser.add_argument("target", metavar="MODULE:NAME", help="e.g. foundry.examples.seeds:transcode")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="the decisions as JSON")
    out.add_argument("--markdown", action="store_true", help="the decision record as Markdown")
    parser.set_defaults(func=run)


@reports_problems("explain")
def run(args: argparse.Namespace) -> int:
    from foundry.explain import decision_dict, explain_renderables, render_markdown

    _, name, unit = resolve(args.target)
    decision = getattr(unit, "decision", None)
    if decision is None:
        raise Problem(
            f"{name!r} in {args.target.rpartition(':')[0]!r} is not a declared unit. Fix: decorate it "
            "with @app.work(...), or use `foundry profile` to measure a plain function"
        )
    phases = dict(getattr(unit, "phases", {}))
    unit_name = getattr(unit, "name", name)
    if args.json:
        body = {"name": unit_name, "phases": [decision_dict(d) for d in (decision, *phases.values())]}
        json.dump(body, sys.stdout, indent=2)
        print()
        return 0
    if args.markdown:
        app = getattr(getattr(unit, "app", None), "name", "")
        sys.stdout.write(render_markdown([(app, unit_name, decision, phases)], source=args.target))
        return 0
    make_console().print(explain_renderables(unit_name, decision, phases))
    return 0
