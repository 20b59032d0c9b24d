"""The ``parallel`` planner: run a map in the caller or on processes, and in what chunks.

Pure: its inputs are measurements (how many items, how many workers, the per-item cost,
the per-item cost of serialising an item and its result) and its output is a
:class:`ChunkPlan` with its reason in words. It starts no process, reads no clock and
measures nothing, so every decision it makes can be checked with numbers alone; the
executor (:mod:`foundry.execute.parallel.executor`) does the measuring, then asks it.

The cost model. Shipping has two parts: a fixed cost per *chunk* (:data:`CHUNK_SHIP`:
the submit, the pipe's round trip, the wake-ups, the collect) and a cost per *item*
(``ship``: pickling it and its result both ways, measured, plus their bytes through the
pipe). A run on ``w`` workers is estimated at ``items × ship + chunks × CHUNK_SHIP +
items × est / w`` — every second of shipping counted as if the caller paid it alone,
which is pessimistic (the workers unpickle their half in parallel) but also covers the
caller's CPU taken from the workers' cores — against ``items × est`` in the caller.
Processes are chosen when they are expected to be at least :data:`MIN_SPEEDUP` times
faster. Chunks carry enough work that the per-chunk cost is at most :data:`AMORTISED`
of it, so the per-chunk cost never decides: a million 1 µs items are worth shipping in
chunks of 25,000 even though one item alone is not worth shipping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from foundry.errors import SubmitError

__all__ = [
    "CHUNK_SHIP",
    "DEFAULT_THRESHOLD",
    "MIN_WORK",
    "PIPE_BYTE_SECONDS",
    "ChunkPlan",
    "chunk_bounds",
    "plan_chunks",
]

DEFAULT_THRESHOLD = 64
"""Inputs with fewer items run sequentially in the caller."""
MIN_WORK = 0.1
"""Seconds of estimated total work below which processes cost more than they save."""
CHUNKS_PER_WORKER = 4
CHUNK_SHIP = 2e-4
"""Seconds one chunk costs to ship whatever its size: submit, pipe round trip, wake-ups,
collect (an empty function over 1-item chunks on 2 workers: 110–150 µs a chunk on a
loaded 2-core VM; rounded up)."""
PIPE_BYTE_SECONDS = 1e-9
"""Seconds one pickled byte costs through a pipe (≈ 1 GB/s: what a 1 MB
``send_bytes``/``recv_bytes`` loop measures on that VM); the executor adds it to ``ship``."""
AMORTISED = 0.02
"""The per-chunk cost is at most this share of a chunk's work: chunks carry at least
``CHUNK_SHIP / AMORTISED`` (10 ms) of it."""
MAX_CHUNK_SECONDS = 0.025
"""At most this much work a chunk: the last round leaves a worker idle for half a chunk on
average, and a descheduled worker holds the join for one chunk."""
TAPER = 2
"""The last chunks of an automatic plan shrink (guided self-scheduling): each carries the
items left ÷ (``TAPER`` × workers), between the full size and :data:`SMALLEST_TAIL` of
it, so the workers reach the join together. A chunk handed ahead to a busy worker waits
behind that worker's current one even when another worker is free: at the end of a run
that wait is a small chunk's, not a full one's."""
SMALLEST_TAIL = 0.25
"""The smallest tail chunk, as a share of the full size (6 ms of work for 25 ms chunks:
a handful more chunks a run, ≈ 200 µs each)."""
MIN_SPEEDUP = 1.5
"""Processes must be expected this many times faster than the loop. The model is
optimistic on a shared machine (it cannot see the other jobs on the cores): in one run of
``bench/inprocess_b.py`` at load 3–8 on 2 cores it predicted 1.7× for ~1 µs items and
they ran 1.4× the loop, and 1.26× for 0.27 µs items, which ran 0.8×."""


def parallel_seconds(items: int, workers: int, est: float, ship: float | None, chunks: int) -> float:
    """The cost model's wall time for ``items`` on ``workers`` processes in ``chunks``."""
    return items * (ship or 0.0) + chunks * CHUNK_SHIP + items * est / workers


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """How one run is split, and why. ``mode`` is ``"processes"`` or ``"sequential"``."""

    items: int
    workers: int
    mode: Literal["processes", "sequential"]
    chunksize: int
    chunks: int
    est: float | None
    reason: str
    probed: int = 0  # items run in the caller to measure ``est`` (their results are kept)
    ship: float | None = None  # measured seconds to serialise one item and its result, both ways
    engine: str = "local"  # where the chunks are computed: "local" processes, "dask", "ray"
    taper: bool = False  # the last chunks shrink (automatic plans; an explicit chunksize is kept)

    def bounds(self, start: int = 0) -> list[tuple[int, int]]:
        """The chunks as ``(lo, hi)`` index ranges, the first at ``start`` (the items
        probed in the caller come before it)."""
        return chunk_bounds(self.items, self.chunksize, self.workers if self.taper else 0, start)

    @property
    def expected_seconds(self) -> float | None:
        """Estimated wall time (the cost model's, on processes); ``None`` without an estimate."""
        if self.est is None:
            return None
        if self.mode == "sequential":
            return self.items * self.est
        return parallel_seconds(self.items, self.workers, self.est, self.ship, self.chunks)

    @property
    def note(self) -> str:
        return self.reason if self.mode == "sequential" else f"parallel: {self.reason}"


def chunk_bounds(items: int, size: int, workers: int = 0, start: int = 0) -> list[tuple[int, int]]:
    """``items`` cut into chunks of ``size``, as ``(lo, hi)`` ranges from ``start``; with
    ``workers`` the last ones taper (:data:`TAPER`, down to :data:`SMALLEST_TAIL` of
    ``size``), else only the last one may be short."""
    stop, lo = start + items, start
    least = max(1, int(size * SMALLEST_TAIL))
    out: list[tuple[int, int]] = []
    while lo < stop:
        step = size if not workers else min(size, max(least, math.ceil((stop - lo) / (TAPER * workers))))
        out.append((lo, min(stop, lo + step)))
        lo += step
    return out


def _fmt_seconds(seconds: float) -> str:
    if seconds < 1e-6:
        return f"{seconds * 1e9:.0f} ns"
    if seconds < 1e-5:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def plan_chunks(
    items: int,
    *,
    workers: int,
    est: float | None = None,
    chunksize: int | None = None,
    threshold: int = DEFAULT_THRESHOLD,
    min_work: float = MIN_WORK,
    probed: int = 0,
    ship: float | None = None,
) -> ChunkPlan:
    """Decide sequential vs processes and the chunk size. Pure; ``items`` excludes probed ones.

    ``ship`` is the measured cost of serialising one item and its result, both ways (and
    their bytes through the pipe); ``None`` when not measured (counted as nothing: only
    the per-chunk cost is charged then). See the module's cost model.
    """

    def sequential(reason: str) -> ChunkPlan:
        return ChunkPlan(
            items, workers, "sequential", max(1, items), 1 if items else 0, est, reason, probed, ship
        )

    total = items + probed
    if chunksize is not None:
        if isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1:
            raise SubmitError(
                f"parallel: chunksize={chunksize!r} must be an integer ≥ 1, or None for automatic"
            )
        if workers <= 1 or items == 0:
            return sequential(f"fell back to sequential: {workers} worker(s), {items} item(s)")
        chunks = math.ceil(items / chunksize)
        return ChunkPlan(
            items,
            workers,
            "processes",
            chunksize,
            chunks,
            est,
            f"{chunks} chunks of {chunksize} (explicit)",
            probed,
            ship,
        )
    if total < threshold:
        return sequential(f"fell back to sequential: {total} items < threshold {threshold}")
    if workers <= 1:
        return sequential("fell back to sequential: one worker (a single core is available)")
    if est is not None and items * est < min_work:
        return sequential(
            f"fell back to sequential: {items} items × {_fmt_seconds(est)} ≈ {_fmt_seconds(items * est)} "
            f"of work < {_fmt_seconds(min_work)}, less than shipping it to processes costs"
        )
    size = _chunk_size(items, workers, est)
    bounds = chunk_bounds(items, size, workers)
    smaller = sum(1 for lo, hi in bounds if hi - lo < size)
    tail = f" (the last {smaller} smaller)" if smaller > 1 else ""
    chunks = len(bounds)
    if est is None:
        reason = f"{chunks} chunks of {size} items{tail} over {workers} workers"
        return ChunkPlan(items, workers, "processes", size, chunks, est, reason, probed, ship, taper=True)
    here = items * est
    there = parallel_seconds(items, workers, est, ship, chunks)
    speedup = here / there
    shipping = (
        f"shipping ≈ {_fmt_seconds(ship)} an item and {_fmt_seconds(CHUNK_SHIP)} a chunk"
        if ship
        else f"shipping ≈ {_fmt_seconds(CHUNK_SHIP)} a chunk, per item not measured"
    )
    if speedup < MIN_SPEEDUP:
        return sequential(
            f"fell back to sequential: {items} items × {_fmt_seconds(est)} ≈ {_fmt_seconds(here)} here, "
            f"≈ {_fmt_seconds(there)} on {workers} workers ({shipping}): {speedup:.2f}× is less than "
            f"the {MIN_SPEEDUP}× that pays for processes"
        )
    return ChunkPlan(
        items,
        workers,
        "processes",
        size,
        chunks,
        est,
        f"{chunks} chunks of {size} items{tail} ≈ {_fmt_seconds(size * est)} each over {workers} workers, "
        f"≈ {speedup:.1f}× the loop ({shipping})",
        probed,
        ship,
        taper=True,
    )


def _chunk_size(items: int, workers: int, est: float | None) -> int:
    """About :data:`CHUNKS_PER_WORKER` chunks per worker (a slow chunk holds the join for
    one small chunk at most), each carrying between ``CHUNK_SHIP / AMORTISED`` and
    :data:`MAX_CHUNK_SECONDS` of work, evened out to a multiple of the workers (the
    tapered tail, :func:`chunk_bounds`, then lets them finish together)."""
    size = math.ceil(items / (workers * CHUNKS_PER_WORKER))
    if est is not None and est > 0:
        low = math.ceil(CHUNK_SHIP / AMORTISED / est)
        high = max(low, math.floor(MAX_CHUNK_SECONDS / est))
        size = min(max(size, low), high)
    size = max(1, size)
    chunks = math.ceil(items / size)
    if chunks > workers and chunks % workers:
        chunks += workers - chunks % workers
        size = max(1, math.ceil(items / chunks))
    return size
