"""``unit.map(items)``: lazy, bounded, and tidy when the consumer stops early.

At most ``window`` items are submitted and unfinished at any time; the next item is
taken from the input only when a result is handed out, so an endless or huge iterable
is fine and memory stays bounded. Every submission meets the model's own intake and
overflow policy; a ``reject`` from a pool that other producers also fill waits for one
of this map's own units to finish and tries again (only when it has none in flight is
the :class:`~foundry.errors.OverloadError` raised). When the consumer stops — ``break``,
an exception in its loop, ``close()`` or garbage collection of the generator — the
outstanding handles are cancelled.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from foundry.errors import OverloadError, ResultTimeoutError
from foundry.execute.structured import wait_first
from foundry.handle import Handle

__all__ = ["bounded_map"]


def bounded_map(
    submit: Callable[[Any], Handle],
    iterable: Iterable[Any],
    *,
    ordered: bool = True,
    timeout: float | None = None,
    window: int = 64,
) -> Iterator[Any]:
    """Yield ``submit(item).result()`` for each item (see the module docstring)."""
    window = max(1, window)
    items = iter(iterable)
    outstanding: deque[Handle] = deque()

    def refill() -> None:
        while len(outstanding) < window:
            try:
                item = next(items)
            except StopIteration:
                return
            while True:
                try:
                    outstanding.append(submit(item))
                    break
                except OverloadError:
                    if not outstanding:
                        raise
                    wait_first(outstanding, None)

    try:
        refill()
        if ordered:
            while outstanding:
                handle = outstanding[0]
                value = handle.result(timeout)
                outstanding.popleft()
                yield value
                refill()
            return
        while outstanding:
            finished = [h for h in outstanding if h.done()]
            if not finished:
                if not wait_first(outstanding, timeout):
                    raise ResultTimeoutError(
                        f"map: none of {len(outstanding)} outstanding units finished within {timeout}s. "
                        "Fix: raise timeout=, or check the units' status"
                    )
                continue
            for handle in finished:
                outstanding.remove(handle)
                yield handle.result(0)
            refill()
    finally:
        for handle in outstanding:
            if not handle.done():
                handle.cancel()
