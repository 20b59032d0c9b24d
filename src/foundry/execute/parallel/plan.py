"""The ``parallel`` planner: run a map in the caller or on processes, and in what chunks.

Pure: its inputs are measurements (how many items, how many workers, the per-item cost,
the cost of shipping one item and its result) and its output is a :class:`ChunkPlan`
with its reason in words. It starts no process, reads no clock and measures nothing, so
every decision it makes can be checked with numbers alone; the executor
(:mod:`foundry.execute.parallel.executor`) does the measuring, then asks it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from foundry.errors import SubmitError

__all__ = ["DEFAULT_THRESHOLD", "MIN_WORK", "ChunkPlan", "plan_chunks"]

DEFAULT_THRESHOLD = 64
"""Inputs with fewer items run sequentially in the caller."""
MIN_WORK = 0.1
"""Seconds of estimated total work below which processes cost more than they save."""
CHUNKS_PER_WORKER = 4
MIN_CHUNK_SECONDS = 0.005
MAX_CHUNK_SECONDS = 0.1
SHIP_FLOOR = 1e-6
"""Seconds an item costs to send to a process and back, at the least (pipe, queue threads)."""
SHIP_FACTOR = 4.0
"""The round trip costs about this many times the caller's measured pickling share."""


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
    ship: float | None = None  # estimated seconds to send one item and its result across
    engine: str = "local"  # where the chunks are computed: "local" processes, "dask", "ray"

    @property
    def expected_seconds(self) -> float | None:
        """Estimated wall time (work ÷ workers); ``None`` without an estimate."""
        if self.est is None:
            return None
        lanes = self.workers if self.mode == "processes" else 1
        return self.items * self.est / lanes

    @property
    def note(self) -> str:
        return self.reason if self.mode == "sequential" else f"parallel: {self.reason}"


def _fmt_seconds(seconds: float) -> str:
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

    ``ship`` is the measured cost of pickling one item and its result (the caller's share
    of IPC); the real round trip costs several times that, and never less than
    ``SHIP_FLOOR``.
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
    round_trip = max(SHIP_FLOOR, SHIP_FACTOR * (ship or 0.0))
    if est is not None and est * (1 - 1 / workers) < round_trip:
        return sequential(
            f"fell back to sequential: an item computes in ≈ {_fmt_seconds(est)} but costs ≈ "
            f"{_fmt_seconds(round_trip)} to ship to a process and back; {workers} workers would "
            "spend more time shipping than they save"
        )
    size = math.ceil(items / (workers * CHUNKS_PER_WORKER))
    if est is not None and est > 0:
        low = math.ceil(MIN_CHUNK_SECONDS / est)
        high = max(low, math.floor(MAX_CHUNK_SECONDS / est))
        size = min(max(size, low), high)
    size = max(1, size)
    chunks = math.ceil(items / size)
    if chunks > workers and chunks % workers:  # a last round with idle workers: even it out
        chunks += workers - chunks % workers
        size = max(1, math.ceil(items / chunks))
        chunks = math.ceil(items / size)
    per = f" ≈ {_fmt_seconds(size * est)} each" if est else ""
    return ChunkPlan(
        items,
        workers,
        "processes",
        size,
        chunks,
        est,
        f"{chunks} chunks of {size} items{per} over {workers} workers",
        probed,
        ship,
    )
