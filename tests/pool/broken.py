"""A unit whose module cannot be imported by a worker process (it raises there)."""

from __future__ import annotations

import multiprocessing

if multiprocessing.parent_process() is not None:
    raise ImportError("this module refuses to load in a worker (a missing native library, say)")


def never(x: int) -> int:
    return x
