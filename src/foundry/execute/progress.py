"""``foundry.progress(done, total, note)``: how far a durable job got, kept in the store.

::

    @app.work(durable=True, isolate=True, est="90s")
    def transcode(src: str, dst: str) -> str:
        for frame, total in run_ffmpeg(src, dst):
            foundry.progress(frame, total, "frames")    # cheap: the worker writes it, throttled
        return dst

    foundry jobs list / foundry jobs show ID / the dashboard's Jobs view: "40% (24/60) frames"

The worker that runs a job gives the job a *sink* (a context variable: the runner thread
of a plain function, the task of an ``async def`` one, and — for ``isolate=True`` jobs — the
child process, which sends each record up its pipe). The sink only keeps the latest record
in memory; the worker's heartbeat thread writes it to the store (``QueueBackend.progress``,
fenced by the delivery's token) at most every :data:`WRITE_EVERY` seconds per job, and
once more before the job's outcome is written, so the last record survives the job: a job
that crashed shows how far it got (a child sends a record at once, or — within 50 ms of the
previous one — 50 ms later: a child that dies loses at most its last 50 ms of records).
Calling it 10,000 times a second costs a tuple and a clock read each; nothing blocks on
the store.

Outside a durable job (a direct call, a test) ``progress`` records nothing and returns
``False``. Bad values raise :class:`ValueError` naming the field and the fix.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from contextvars import ContextVar, Token

__all__ = ["WRITE_EVERY", "ProgressSink", "progress", "report_to", "reporting"]

WRITE_EVERY = 0.25  # seconds between two writes of one job's progress to the store, at most

ProgressSink = Callable[[float, "float | None", str], None]

_sink: ContextVar[ProgressSink | None] = ContextVar("foundry_progress", default=None)


def progress(done: float, total: float | None = None, note: str = "") -> bool:
    """Record that the running job has done ``done`` of ``total`` (``None``: unknown), with
    a short ``note`` ("frames", "rows", "uploading"); ``True`` when a worker will keep it,
    ``False`` outside a durable job."""
    if isinstance(done, bool) or not isinstance(done, int | float) or not math.isfinite(done) or done < 0:
        raise ValueError(f"progress(done={done!r}): done must be a finite number >= 0. Fix: pass a count")
    number = isinstance(total, int | float) and not isinstance(total, bool)
    if total is not None and (not number or not math.isfinite(total) or total <= 0):
        raise ValueError(
            f"progress(total={total!r}): total must be a finite number > 0, or None when unknown. "
            "Fix: pass how many there are, or leave it out"
        )
    if not isinstance(note, str):
        raise ValueError(f"progress(note={note!r}): note must be a string. Fix: pass e.g. note='frames'")
    sink = _sink.get()
    if sink is None:
        return False
    sink(float(done), None if total is None else float(total), note)
    return True


@contextlib.contextmanager
def reporting(sink: ProgressSink | None) -> Iterator[None]:
    """Send this context's :func:`progress` calls to ``sink`` while the block runs."""
    token = _sink.set(sink)
    try:
        yield
    finally:
        _sink.reset(token)


def report_to(sink: ProgressSink | None) -> Token[ProgressSink | None]:
    """Send this context's :func:`progress` calls to ``sink`` until the returned token is
    reset (``token.var.reset(token)``): what :func:`reporting` does, for a hot path that
    resets it in its own ``finally`` (a durable queue worker's runner, once per job)."""
    return _sink.set(sink)
