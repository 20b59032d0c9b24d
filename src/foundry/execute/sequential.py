"""``sequential``: the work runs in the caller, now, and nothing else happens.

No thread, no loop, no pool, no backend, no queue: ``unit(x)`` is ``fn(x)`` plus about a
hundred nanoseconds of bookkeeping (two atomic counts; a clock read on the calls that
are timed, see :meth:`SequentialRunner._direct_call`; :mod:`foundry.execute.instrument` for why
that is enough to publish every metric).
``unit.submit(x)`` runs it too and returns a handle that is already finished, so code
written against handles works unchanged when a unit moves to another model.

Guarantees: the work runs exactly once, in the caller's thread, and its outcome (value
or the original exception, traceback intact) goes straight back to the caller. Nothing
is persisted, nothing is retried; if the process dies, the work in progress dies with
it — which is also true of the caller that was waiting for it.

Timeouts: a unit's ``timeout`` (or ``options(timeout=...)``) is enforced with
``SIGALRM`` when the call runs on the main thread (the way pytest-timeout does; an
outer interval timer is kept and re-armed). CPython delivers signals to the main thread
only, so a call on another thread cannot be interrupted: it runs to completion and the
overrun is logged. Cancellation: the work has started by the time a handle exists, so
``cancel()`` returns ``False``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from foundry.errors import WorkTimeoutError
from foundry.execute.forwarding import compile_wrapper
from foundry.execute.instrument import IdMaker, UnitMetrics, check_in_process_options
from foundry.handle import Handle, Outcome, completed_handle
from foundry.runtime import RuntimeContext, SubmitOptions, UnitSpec

__all__ = ["SequentialRunner", "deadline", "make_runner"]

log = logging.getLogger("foundry.execute")
MODEL = "sequential"
SAMPLE_ABOVE = 100e-6  # seconds: slower calls are all timed
SAMPLE_MASK = 63  # faster ones: one call in 64 is timed


class SequentialRunner:
    """Runs a unit inline, in the caller."""

    __slots__ = ("_ids", "direct", "fn", "metrics", "spec", "timeout")
    model = MODEL
    map_window = 1  # unit.map() runs one item per item taken: lazy, like a generator

    def __init__(self, spec: UnitSpec, ctx: RuntimeContext) -> None:
        self.spec = spec
        self.fn = spec.fn
        self.timeout = spec.traits.timeout
        self.metrics = UnitMetrics(ctx.metrics, spec.name, MODEL)
        self._ids = IdMaker("seq")
        self.direct: Callable[..., Any] = self._direct_call()
        """``unit(...)`` itself: the unit installs it as its call (``WorkUnit._call_for``)."""

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``unit(...)`` with its arguments packed (the runner protocol's form)."""
        return self.direct(*args, **kwargs)

    def _direct_call(self) -> Callable[..., Any]:
        """The work, two atomic counts, and a clock read on sampled calls.

        Every call is counted (completed, failed, in flight: ``next()`` of an
        ``itertools.count`` at the start and at a success, the cheapest atomic counts
        CPython has). Durations are recorded for every call of work that takes 100 µs or
        more; for faster work, one call in 64 is timed, so the histogram of a microsecond
        function is a sample (its count is lower than the completed count) and timing
        costs ≈ 1 % instead of ≈ 10 %. The wrapper is compiled with ``fn``'s own
        parameters (:mod:`foundry.execute.forwarding`) and everything it reads is a cell
        of its closure: no attribute lookups, no argument packing, no method frame
        between the caller and ``fn`` (``bench/callpath.py`` times each piece).
        """
        if self.timeout is not None or self.spec.is_async:
            run, timeout = self._run, self.timeout

            def guarded(*args: Any, **kwargs: Any) -> Any:
                return run(args, kwargs, timeout)

            return guarded
        metrics = self.metrics
        free = {
            "_fwd_fn": self.fn,
            "_fwd_begun": metrics._begun,
            "_fwd_untimed": metrics._untimed,
            "_fwd_fail": metrics.fail,
            "_fwd_ok": metrics.ok,
            "_fwd_clock": time.perf_counter,
            "_fwd_sample": 0,  # time every call until one is seen to be fast
            "_fwd_mask": SAMPLE_MASK,
            "_fwd_above": SAMPLE_ABOVE,
        }
        return compile_wrapper(
            _DIRECT,
            name=getattr(self.fn, "__name__", self.spec.name),
            fn=self.fn,
            free=free,
            reserved=_DIRECT_GLOBALS,
            label=f"sequential unit {self.spec.name!r}",
        )

    def _run(self, args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None) -> Any:
        next(self.metrics._begun)
        started = time.perf_counter()
        try:
            with deadline(self.spec.name, timeout):
                result = self.fn(*args, **kwargs)
                if self.spec.is_async:
                    result = asyncio.run(result)
        except BaseException:
            self.metrics.fail(time.perf_counter() - started)
            raise
        now = time.perf_counter()
        self.metrics.ok(now - started, now)
        return result

    def submit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        check_in_process_options(self.spec.name, MODEL, options)
        timeout = options.timeout if options.timeout is not None else self.timeout
        try:
            value = self._run(args, kwargs, timeout)
        except Exception as exc:
            return completed_handle(self.spec.name, Outcome(error=exc), self._ids())
        return completed_handle(self.spec.name, Outcome(value=value), self._ids())

    async def asubmit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        """From a loop: a coroutine function is awaited right here, on the caller's loop;
        a plain function runs inline (it is small, or it would not be sequential)."""
        if not self.spec.is_async:
            return self.submit(args, kwargs, options)
        check_in_process_options(self.spec.name, MODEL, options)
        timeout = options.timeout if options.timeout is not None else self.timeout
        next(self.metrics._begun)
        started = time.perf_counter()
        try:
            async with asyncio.timeout(timeout):
                value = await self.fn(*args, **kwargs)
        except TimeoutError as exc:
            self.metrics.fail(time.perf_counter() - started)
            error = WorkTimeoutError(
                f"unit {self.spec.name!r} ran longer than its timeout of {timeout}s and was cancelled. "
                "Fix: raise timeout=, or make the work smaller"
            )
            error.__cause__ = exc
            return completed_handle(self.spec.name, Outcome(error=error), self._ids())
        except Exception as exc:
            self.metrics.fail(time.perf_counter() - started)
            return completed_handle(self.spec.name, Outcome(error=exc), self._ids())
        now = time.perf_counter()
        self.metrics.ok(now - started, now)
        return completed_handle(self.spec.name, Outcome(value=value), self._ids())

    def close(self, timeout: float = 10.0) -> None:
        self.metrics.close()


# -- the SIGALRM deadline ---------------------------------------------------------------


@contextlib.contextmanager
def deadline(unit: str, timeout: float | None) -> Iterator[None]:
    """Raise :class:`WorkTimeoutError` in this (main) thread after ``timeout`` seconds.

    Off the main thread, or without ``setitimer``, nothing can interrupt the caller: the
    block runs to completion and an overrun is logged. An interval timer that was
    already armed (pytest-timeout, an outer ``deadline``) is honoured: whichever is due
    first fires, and the outer one is re-armed with its remaining time afterwards.
    """
    if timeout is None:
        yield
        return
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        started = time.monotonic()
        yield
        took = time.monotonic() - started
        if took > timeout:
            log.warning(
                "unit %r ran %.3fs, past its timeout of %ss: a sequential unit off the main thread "
                "cannot be interrupted. Fix: declare model='threads' or 'processes' to enforce it",
                unit,
                took,
                timeout,
            )
        return
    now = time.monotonic()
    due = now + timeout
    outer_handler = signal.getsignal(signal.SIGALRM)
    outer_delay, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    outer_due = now + outer_delay if outer_delay > 0 else None

    def on_alarm(signum: int, frame: Any) -> None:
        if time.monotonic() >= due - 0.001:
            raise WorkTimeoutError(
                f"unit {unit!r} ran longer than its timeout of {timeout}s and was interrupted. "
                "Fix: raise timeout=, or make the work smaller"
            )
        if callable(outer_handler):  # the outer timer fired first
            outer_handler(signum, frame)

    signal.signal(signal.SIGALRM, on_alarm)
    first = timeout if outer_due is None else min(timeout, outer_delay)
    signal.setitimer(signal.ITIMER_REAL, max(first, 1e-6))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, outer_handler)
        if outer_due is not None:
            signal.setitimer(signal.ITIMER_REAL, max(outer_due - time.monotonic(), 1e-6), outer_interval)


# ``SequentialRunner.direct``: compiled per unit with the function's own parameters
# (foundry.execute.forwarding), so a call is this one frame and the function's.
_DIRECT = """
def _fwd_wrapper({params}):
    nonlocal _fwd_sample
    if next(_fwd_begun) & _fwd_sample:
        try:
            _fwd_result = _fwd_fn({args})
        except BaseException:
            _fwd_fail(None)
            raise
        next(_fwd_untimed)
        return _fwd_result
    _fwd_started = _fwd_clock()
    try:
        _fwd_result = _fwd_fn({args})
    except BaseException:
        _fwd_fail(_fwd_clock() - _fwd_started)
        raise
    _fwd_now = _fwd_clock()
    _fwd_sample = 0 if _fwd_now - _fwd_started >= _fwd_above else _fwd_mask
    _fwd_ok(_fwd_now - _fwd_started, _fwd_now)
    return _fwd_result
"""
_DIRECT_GLOBALS = frozenset({"next", "BaseException"})


def make_runner(spec: UnitSpec, ctx: RuntimeContext) -> SequentialRunner:
    """The ``sequential`` runner for ``spec``."""
    return SequentialRunner(spec, ctx)
