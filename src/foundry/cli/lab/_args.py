"""Argument types and options that every `foundry lab` model shares.

Syntax errors exit 2 through argparse, naming the bad text and its fix; the model modules
only say which option takes which type.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


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


def int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers") from exc


DURATION = _typed(_duration)
RATE = _typed(_rate)
SIZE = _typed(_size)
OPT_DURATION = _typed(_optional_duration)


def add_output_options(parser: argparse.ArgumentParser, *, sim: bool = True) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--plot", metavar="FILE", help="also draw a plot to FILE.png or FILE.svg")
    if sim:
        parser.add_argument("--seed", type=int, default=0, help="simulation seed (default 0: reproducible)")
        parser.add_argument(
            "--confidence", type=float, default=0.95, help="confidence level of intervals (default 0.95)"
        )
