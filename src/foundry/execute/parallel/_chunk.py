"""The child side of ``parallel``: what runs in a worker process (or on a cluster's
worker) for one chunk. Kept apart from the parent's modules so that what a worker runs
is plain to see, and small: it maps, records failures, and measures its CPU time."""

from __future__ import annotations

import functools
import os
import pickle
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from foundry.serialize import encode_error

__all__ = ["map_resuming", "run_chunk", "run_shipped_chunk"]


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


def map_resuming(call: Callable[[Any], Any], items: Iterable[Any]) -> tuple[list[Any], list[int]]:
    """``[call(item) for item in items]``, each item exactly once: an item that raises holds
    its exception at its index and the loop resumes with the next (no ``try`` per item,
    so a chunk of microsecond items costs the plain loop's time). Returns the results and
    the offsets that failed."""
    results: list[Any] = []
    append = results.append
    failed: list[int] = []
    remaining = iter(items)
    while True:
        try:
            for item in remaining:
                append(call(item))
            return results, failed
        except Exception as exc:
            failed.append(len(results))
            append(exc)


def run_chunk(fn: Callable[..., Any], start: int, payload: bytes, kwargs: dict[str, Any]) -> Any:
    """Runs in a child: map ``fn`` over one chunk; failures are recorded, not raised, so
    one bad item does not lose its neighbours' results. The results come back pickled
    (``bytes``), or as the list itself when they cannot be."""
    cpu = time.process_time()
    call = functools.partial(fn, **kwargs) if kwargs else fn
    results, failed = map_resuming(call, pickle.loads(payload))
    failures: list[tuple[int, Any]] = []
    for offset in failed:
        failures.append((start + offset, _portable(results[offset])))
        results[offset] = None
    try:  # pickled here, unpickled by the caller's map thread: the pool's dispatcher only
        shipped: Any = pickle.dumps(results, pickle.HIGHEST_PROTOCOL)  # copies bytes, and hands
    except Exception:  # this child its next chunk without first decoding this one's results
        shipped = results  # the pool reports what cannot be pickled back, with the fix
    return start, shipped, failures, time.process_time() - cpu


def run_shipped_chunk(shipped: bytes, start: int, payload: bytes) -> Any:
    """Runs on a cluster worker: :func:`run_chunk` with the function and its keyword
    arguments unpickled *here*, inside the task. A worker that cannot import the
    function then fails this task with the ``ModuleNotFoundError`` (which the engine
    reports with the fix) instead of failing to decode the task message itself, which
    Dask does not report to the client at all: the run would hang."""
    fn, kwargs = pickle.loads(shipped)
    return run_chunk(fn, start, payload, kwargs)
