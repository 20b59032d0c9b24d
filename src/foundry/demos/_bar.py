"""A progress bar for the demo's long parts (rich), fed a fraction from 0 to 1."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console


@contextlib.contextmanager
def bar(console: Console, what: str) -> Iterator[Callable[[float], None]]:
    """``with bar(console, "payments") as advance: advance(0.5)``; a plain line when the
    console is not a terminal."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    if not console.is_terminal:
        console.print(f"   {what} …")
        yield lambda fraction: None
        return
    with Progress(
        TextColumn("   {task.description}"), BarColumn(), TimeElapsedColumn(), console=console, transient=True
    ) as progress:
        task = progress.add_task(what, total=1.0)
        yield lambda fraction: progress.update(task, completed=max(0.0, min(1.0, fraction)))
