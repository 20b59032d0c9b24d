"""The progress bar of a ``parallel`` run (rich), or nothing: one bar at a time per
process, shown only on a terminal for runs expected to last a second or more."""

from __future__ import annotations

import threading
from typing import Any

from foundry.execute.parallel.plan import ChunkPlan

__all__ = ["ProgressBar", "show_progress"]

_progress_lock = threading.Lock()


class ProgressBar:
    """A rich progress bar, or nothing (not a terminal, asked not to, or one is showing)."""

    def __init__(self, enabled: bool, total: int, label: str, console: Any) -> None:
        self._bar: Any = None
        self._task: Any = None
        if not enabled or not _progress_lock.acquire(blocking=False):
            return
        try:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=console,
                transient=False,
            )
            self._task = self._bar.add_task(label, total=total)
            self._bar.start()
        except Exception:
            self._bar = None
            _progress_lock.release()

    def advance(self, n: int) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
            _progress_lock.release()


def show_progress(progress: bool | None, plan: ChunkPlan, console: Any) -> bool:
    if progress is not None:
        return progress
    if console is None or not getattr(console, "is_terminal", False):
        return False
    expected = plan.expected_seconds
    return expected >= 1.0 if expected is not None else plan.items >= 10_000
