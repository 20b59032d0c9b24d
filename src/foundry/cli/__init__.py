"""The ``foundry`` command. Each subcommand lives in its own module under
``foundry.cli`` and registers itself through :data:`COMMANDS`.

A module ``foundry.cli.<name>`` provides ``add_parser(subparsers) -> None`` which
adds its subparser(s) and sets ``func=callable(args) -> int`` as the default.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["COMMANDS", "build_parser", "main", "version"]

# Order is the order in `foundry --help`.
COMMANDS: tuple[str, ...] = (
    "demo",
    "plan",
    "explain",
    "advise",
    "profile",
    "run",
    "worker",
    "pool",
    "jobs",
    "workflows",
    "streams",
    "schedules",
    "top",
    "dashboard",
    "metrics",
    "lab",
)


def version() -> str:
    """The installed distribution's version (its metadata), else the package's own."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("foundry-exec")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from foundry import __version__

        return __version__


class _Version(argparse.Action):
    """``--version``, its metadata read only when asked (a lookup costs tens of ms)."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        print(f"foundry {version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="foundry",
        description="Decide how work should run, write down the bill, and run it.",
    )
    parser.add_argument("--version", action=_Version, help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"foundry.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"foundry.cli.{name}":
                continue  # command not built yet
            raise
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    from foundry.errors import FoundryError

    try:
        return int(func(args))
    except FoundryError as exc:
        print(f"foundry {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
