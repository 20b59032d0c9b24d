"""How `foundry lab` prints: one wide console, JSON, and the number formats the models share.

Each model labels its numbers with the method that produced them; these helpers only keep the
formats (milliseconds, ± half-widths, the plot note) the same from one model to the next.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


def lab_console() -> Console:
    from foundry.cli._target import console

    out: Console = console(width=160)
    return out


def emit_json(data: dict[str, Any]) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


def ms(seconds: float | None, digits: int = 1) -> str:
    return "—" if seconds is None else f"{seconds * 1000:.{digits}f}"


def pm(value: str, half: float | None, digits: int = 1, scale: float = 1.0) -> str:
    return value if half is None else f"{value} ±{half * scale:.{digits}f}"


def plot_note(path: str) -> str:
    return f"[dim]plot written to {path}[/dim]"
