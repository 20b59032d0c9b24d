"""Riding out an engine outage: a stream engine call retried with bounded back-off
while the engine is unavailable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from foundry.errors import (
    BackendUnavailableError,
)
from foundry.retry import OUTAGE

__all__ = ["ride_outage"]


T = TypeVar("T")


def ride_outage(stop: threading.Event, what: Callable[[], T], *, attempts: int | None = None) -> T:
    """Call ``what``, retrying while the backend is unavailable (bounded back-off), until
    ``stop`` is set (then the last error is raised)."""
    pauses = OUTAGE.pauses()
    tries = 0
    while True:
        try:
            return what()
        except BackendUnavailableError:
            tries += 1
            if stop.is_set() or (attempts is not None and tries >= attempts):
                raise
            stop.wait(next(pauses))
