"""Units for the adversarial queue tests, importable by a worker in another process:
``foundry worker tests.adversarial._queue_app:app`` (queue URL from ``FOUNDRY_QUEUE``);
a test declares the same units on an app of its own with :func:`make_app`."""

from __future__ import annotations

import ctypes
import time
from pathlib import Path

from foundry import Foundry


def healthy(i: int) -> int:
    time.sleep(0.01)  # long enough that several jobs are in flight together
    return i * 2


def poison() -> None:
    """Segfaults the process that runs it: every time, the whole worker dies."""
    ctypes.string_at(0)


def sleeper(seconds: float, started: str = "") -> float:
    """Sleeps; first creates the file ``started`` (if given), so a test knows it runs."""
    if started:
        Path(started).touch()
    time.sleep(seconds)
    return seconds


def make_app(url: str | None = None, name: str = "adversarial-queue") -> Foundry:
    app = Foundry(name, queue=url)
    for fn in (healthy, poison, sleeper):
        app.work(durable=True)(fn)
    return app


app = make_app()
