"""`foundry demo`: runs every section of foundry.demos in order on the embedded default."""

from __future__ import annotations

import argparse
import importlib
import os
import tempfile
from typing import Any

from foundry.demos import SECTIONS


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "demo", help="run the seed examples on the embedded default and show their decisions"
    )
    parser.add_argument(
        "--only", choices=[name for name, _ in SECTIONS], action="append", help="run only these sections"
    )
    parser.add_argument("--home", help="state directory (default: a fresh temporary directory)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.rule import Rule

    from foundry.cli._target import console as make_console

    console = make_console()  # a pipe gets COLUMNS (or 140) columns without trailing spaces
    home = args.home or tempfile.mkdtemp(prefix="foundry-demo-")
    console.print(f"[dim]state directory: {home}[/dim]")
    before = os.environ.get("FOUNDRY_HOME")
    os.environ["FOUNDRY_HOME"] = home  # the sections' apps find their state here
    try:
        for name, title in SECTIONS:
            if args.only and name not in args.only:
                continue
            try:
                module = importlib.import_module(f"foundry.demos.{name}")
            except ModuleNotFoundError as exc:
                if exc.name == f"foundry.demos.{name}":
                    continue
                raise
            console.print(Rule(f"[bold]{title}[/bold]"))
            module.run(console)
    finally:  # called in-process (a test, a notebook), the caller's environment is its own again
        if before is None:
            os.environ.pop("FOUNDRY_HOME", None)
        else:
            os.environ["FOUNDRY_HOME"] = before
    return 0
