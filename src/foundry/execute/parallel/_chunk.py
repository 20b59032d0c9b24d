"""The child side of ``parallel``: what runs in a worker process (or on a cluster's
worker) for one chunk. Kept apart from the parent's modules so that what a worker runs
is plain to see, and small: it maps, records failures, and measures its CPU time."""

from __future__ import annotations

import os
import pickle
import time
import traceback
from collections.abc import Callable
from typing import Any

from foundry.serialize import encode_error

__all__ = ["run_chunk", "run_shipped_chunk"]


def _portable(error: BaseException) -> Any:
    """The exception itself when it pickles (type and notes survive), else a JSON record."""
    error.add_note(
        f"--- raised in worker pid {os.getpid()} ---\n{''.join(traceback.format_exception(error))}"
    )
    try:
        pickle.dumps(error)
    except Exception:
        return encode_error(error)
    return error


def run_chunk(fn: Callable[..., Any], start: int, payload: bytes, kwargs: dict[str, Any]) -> Any:
    """Runs in a child: map ``fn`` over one chunk, item by item; failures are recorded,
    not raised, so one bad item does not lose its neighbours' results."""
    cpu = time.process_time()
    items = pickle.loads(payload)
    results: list[Any] = []
    failures: list[tuple[int, Any]] = []
    for offset, item in enumerate(items):
        try:
            results.append(fn(item, **kwargs))
        except Exception as exc:
            results.append(None)
            failures.append((start + offset, _portable(exc)))
    return start, results, failures, time.process_time() - cpu


def run_shipped_chunk(shipped: bytes, start: int, payload: bytes) -> Any:
    """Runs on a cluster worker: :func:`run_chunk` with the function and its keyword
    arguments unpickled *here*, inside the task. A worker that cannot import the
    function then fails this task with the ``ModuleNotFoundError`` (which the engine
    reports with the fix) instead of failing to decode the task message itself, which
    Dask does not report to the client at all: the run would hang."""
    fn, kwargs = pickle.loads(shipped)
    return run_chunk(fn, start, payload, kwargs)
