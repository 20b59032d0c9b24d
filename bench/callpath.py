"""Where the nanoseconds of a sequential unit's call go: the call path built up one piece
at a time, each step timed against the plain call in the same round.

    python bench/callpath.py            # 21 rounds × 400,000 calls (about a minute)
    python bench/callpath.py --quick    # a few seconds

Steps (each includes the ones above it):

1. ``plain call`` — ``tiny(i)``, the floor.
2. ``+ a callable object`` — an object whose ``__call__`` slot holds ``tiny`` itself: what
   CPython charges for calling an instance rather than a function (the type's ``tp_call``,
   the slot's descriptor, an argument tuple). A ``WorkUnit`` is such an object.
3. ``+ a Python frame`` — the slot holds a wrapper compiled with ``tiny``'s own parameters
   (``foundry.execute.forwarding``) that only calls it.
4. ``+ the start count`` — the wrapper does ``next()`` on the unit's started counter (and
   tests it against the sampling mask).
5. ``+ the success count`` — and ``next()`` on the untimed-success counter.
6. ``foundry sequential unit`` — the real unit, metrics on: the above plus one call in 64
   timed (two clock reads and an append) and the buffered drains.

A generic ``*args, **kwargs`` wrapper is shown beside step 3 for comparison: it is what the
forwarding saves; a ``functools.partial`` subclass beside step 2: what building units on
C's ``tp_call`` instead of the ``__call__`` slot would save. Every round runs the steps
forward or backward (alternating), and each step's figure is the median over rounds of
its time minus the plain call's time in that round, per call.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table


def tiny(n: int) -> int:
    return n + 1


class _Callable:
    """An object called through its ``__call__`` slot, like a ``WorkUnit``."""

    if TYPE_CHECKING:

        def __call__(self, *args: Any) -> Any: ...

    else:
        __slots__ = ("__call__",)

    def __init__(self, call: Callable[..., Any]) -> None:
        setattr(self, "__call__", call)  # noqa: B010 (the slot)


class _Partial(functools.partial[Any]):
    """The other way to make an object callable: a ``functools.partial`` subclass, whose
    C ``tp_call`` calls the wrapped function without looking ``__call__`` up (timed beside
    step 2 as the alternative a ``WorkUnit`` could be built on; it has a ``__dict__``, as a
    unit needs)."""


def _wrapper(body: str, free: dict[str, Any]) -> Callable[..., Any]:
    from foundry.execute.forwarding import compile_wrapper

    template = "def _fwd_wrapper({params}):\n" + body
    return compile_wrapper(template, name="tiny", fn=tiny, free={"_fwd_fn": tiny, **free}, label="callpath")


def _generic() -> Callable[..., Any]:
    fn = tiny

    def generic(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return generic


def steps() -> dict[str, Callable[..., Any]]:
    from foundry import Foundry

    begun, untimed = itertools.count(), itertools.count()
    counts = {"_fwd_begun": begun, "_fwd_untimed": untimed, "_fwd_sample": 63}
    unit = Foundry("callpath").work(model="sequential", name="tiny")(tiny)
    return {
        "plain call": tiny,
        "+ a callable object": _Callable(tiny),
        "  (a functools.partial subclass instead)": _Partial(tiny),
        "+ a Python frame": _Callable(_wrapper("    return _fwd_fn({args})\n", {})),
        "  (a generic *args, **kwargs frame instead)": _Callable(_generic()),
        "+ the start count": _Callable(
            _wrapper("    if next(_fwd_begun) & _fwd_sample:\n        return _fwd_fn({args})\n", counts)
        ),
        "+ the success count": _Callable(
            _wrapper(
                "    if next(_fwd_begun) & _fwd_sample:\n"
                "        _fwd_result = _fwd_fn({args})\n"
                "        next(_fwd_untimed)\n"
                "        return _fwd_result\n",
                counts,
            )
        ),
        "foundry sequential unit (metrics on)": unit,
    }


def run(quick: bool) -> list[tuple[str, float, float, float]]:
    calls = 40_000 if quick else 400_000
    rounds = 5 if quick else 21
    variants = steps()

    def timed(call: Callable[..., Any]) -> float:
        started = time.perf_counter()
        for i in range(calls):
            call(i)
        return time.perf_counter() - started

    for call in variants.values():
        timed(call)  # warm-up
    samples: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    for round_ in range(rounds):
        for name in order if round_ % 2 == 0 else reversed(order):
            samples[name].append(timed(variants[name]))
    plain = samples["plain call"]
    rows = []
    for name, times in samples.items():
        extra = sorted((t - p) / calls * 1e9 for t, p in zip(times, plain, strict=True))
        rows.append((name, statistics.median(times) / calls * 1e9, statistics.median(extra), extra[0]))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a few seconds")
    args = parser.parse_args(argv)
    rows = run(args.quick)
    table = Table(title=f"the sequential call path, Python {sys.version.split()[0]}")
    for column in ("step", "ns per call (median)", "over a plain call (median of rounds)", "step's own cost"):
        table.add_column(column)
    previous = 0.0
    for name, per_call, extra, _low in rows:
        own = "" if name.startswith("  ") or name == "plain call" else f"{extra - previous:+.0f} ns"
        if not name.startswith("  "):
            previous = extra
        table.add_row(name, f"{per_call:.0f}", f"{extra:+.0f} ns", own)
    Console(width=160).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
