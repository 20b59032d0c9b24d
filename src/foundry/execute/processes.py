"""``processes``: child processes with crash containment.

::

    @app.work(isolate=True, timeout="30s", max_pending=64)
    def render(doc_id: str) -> bytes: ...      # a segfault here fails this call only

    handle = render.submit("doc-7")
    handle.result(timeout=60)   # ChildCrashedError(exitcode=-11, signal_name="SIGSEGV") if it crashed

A small pool of its own over ``multiprocessing`` (the ``forkserver`` start method on
Linux, ``spawn`` elsewhere: ``fork`` is unsafe in a process that has threads), with one
duplex pipe per child, so the parent always knows which unit each child is running:

- **Crash containment.** A child that dies (a segfault, ``os._exit``, the OOM killer)
  fails only the unit it was running, with :class:`~foundry.errors.ChildCrashedError`
  carrying the exit code (``-11``) and the signal's name (``"SIGSEGV"``). Units that
  were handed to it but had not started go back to the queue (children run their
  units one at a time, in order, so "which one was running" is exact). The pool starts
  a replacement and counts ``foundry_child_exits_total{code}`` and
  ``foundry_child_restarts_total``. Other children's work is not touched.
- **Timeouts kill.** A unit past its ``timeout`` (from when its child started it) fails
  with :class:`~foundry.errors.WorkTimeoutError`; its child gets ``SIGTERM``, then
  ``SIGKILL`` after a grace, and is replaced. Cancelling a running unit does the same
  with :class:`~foundry.errors.CancelledError`; a queued unit is dropped before it runs.
- **Children that cannot start.** A child re-imports the function's module, and with
  spawn/forkserver the main script too. A child that dies while starting, before it
  ever ran anything, is a bootstrap failure, and restarting it would only fail again
  (the classic case: a main script without ``if __name__ == "__main__":`` that submits
  at its top level). Until one child of the pool has started, children are started
  one at a time, and the first bootstrap failure fails the pool: every pending unit and
  every later submit gets one :class:`~foundry.errors.SubmitError` with the fix, and
  one child traceback is printed. A pool that has run work retries a replacement that
  dies while starting with a back-off, and fails the same way after
  :data:`BOOT_RETRIES` in a row. A child that has not started within
  :data:`BOOT_TIMEOUT` seconds is killed and counts as one.
- **Recycling.** ``max_tasks_per_child`` (a trait; default unlimited) replaces a child
  after that many units: the remedy for native leaks.
- **No orphans.** Each child sets ``PR_SET_PDEATHSIG=SIGKILL`` (Linux) and runs a
  thread that exits the process when its lifeline pipe from the parent closes, so
  children die with the parent even when the parent is killed with SIGKILL. Children
  are started from the pool's own long-lived thread (the death signal follows the
  thread that forked, not the process).
- **What can be carried.** The function is sent by reference (module + qualified
  name; a ``@app.work`` unit is resolved to its function in the child), so it must be
  importable: a lambda, a closure, or a function defined in ``python -c`` fails at
  submit time with :class:`~foundry.errors.SubmitError`, as do arguments that cannot be
  pickled (the error names the unit and the value). Results that cannot be pickled
  fail their own handle.
- **Throughput.** Submitters write to an idle child's pipe themselves (no thread hop);
  when every child is busy and units are short (measured), a few units are handed
  ahead to each child in one message. A child is never handed a unit ahead while the
  unit has a timeout or is long, so timeouts and cancellation stay exact; for short
  units, cancelling one that was handed ahead drops it in the child before it starts
  unless the child reached it in the same instant.

Guarantees: each accepted unit runs at most once (a unit that was running when its
child died is failed, never re-run) and its handle resolves exactly once; one unit's
crash never discards another's result. Nothing is persisted: if the parent dies, its
queue and its children's work die with it.

The pool itself (children, pipes, dispatch, timeouts, replacement) is
:mod:`foundry.execute.process_pool`, the child's side :mod:`foundry.execute._child`; this
module is the model's runner: a unit's traits turned into a pool, and the check, once,
that a child can import the unit's function.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Literal

from foundry.errors import SubmitError
from foundry.execute._child import resolve_target
from foundry.execute.instrument import IdMaker, check_in_process_options, usable_cpus
from foundry.execute.process_pool import (
    DEFAULT_BLOCK_TIMEOUT,
    MODEL,
    PENDING_PER_WORKER,
    SHORT,
    WARM_TIMEOUT,
    ProcessPool,
)
from foundry.execute.progress import ProgressSink
from foundry.handle import Handle
from foundry.runtime import RuntimeContext, SubmitOptions, UnitSpec

__all__ = ["ProcessPool", "ProcessRunner", "importability_error", "make_runner", "resolve_target"]


class ProcessRunner:
    """Runs a ``processes`` unit on its own :class:`ProcessPool`."""

    model = MODEL

    def __init__(self, spec: UnitSpec, ctx: RuntimeContext) -> None:
        traits = spec.traits
        self.spec = spec
        self.ctx = ctx
        # The decision sized it from the load (for computing: no more than the cores); a
        # declared concurrency of 300 waiting units is not 300 processes.
        self.workers = traits.workers or spec.decision.load.concurrency or usable_cpus()
        self.map_window = 2 * self.workers + (traits.max_pending or PENDING_PER_WORKER * self.workers)
        self.max_tasks_per_child = traits.max_tasks_per_child
        self._pool: ProcessPool | None = None
        self._checked: SubmitError | Literal[False] | None = False
        self._lock = threading.Lock()
        self._ids = IdMaker("proc")

    def _target(self) -> tuple[str, str]:
        """Check once that the child can import the function; the error is cached."""
        if self._checked is False:
            self._checked = importability_error(self.spec)
        if self._checked is not None:
            raise self._checked
        return self.spec.module, self.spec.qualname

    @property
    def pool(self) -> ProcessPool:
        with self._lock:
            if self._pool is None:
                module, qualname = self._target()
                traits = self.spec.traits
                self._pool = ProcessPool(
                    self.spec.name,
                    module,
                    qualname,
                    workers=self.workers,
                    max_pending=traits.max_pending,
                    overflow=traits.overflow,
                    block_timeout=traits.latency if traits.latency is not None else DEFAULT_BLOCK_TIMEOUT,
                    max_tasks_per_child=self.max_tasks_per_child,
                    timeout=traits.timeout,
                    short=None if traits.est is None else traits.est < SHORT,
                    registry=self.ctx.metrics,
                    errors=self.spec.errors,
                )
            return self._pool

    def submit(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: SubmitOptions,
        *,
        on_progress: ProgressSink | None = None,
    ) -> Handle:
        if options is not _NO_OPTIONS:
            check_in_process_options(self.spec.name, MODEL, options)
        self._target()
        task = self.pool.submit(args, kwargs, options.timeout, on_progress)
        return Handle(self._ids(), self.spec.name, task)

    def try_submit(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions
    ) -> Handle | None:
        """Accept without blocking; ``None`` when the intake is full (per-key lanes)."""
        if options is not _NO_OPTIONS:
            check_in_process_options(self.spec.name, MODEL, options)
        self._target()
        task = self.pool.try_submit(args, kwargs, options.timeout)
        return None if task is None else Handle(self._ids(), self.spec.name, task)

    async def asubmit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        pool = self.pool
        if pool.has_room():
            return self.submit(args, kwargs, options)
        import asyncio

        return await asyncio.to_thread(self.submit, args, kwargs, options)

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.submit(args, kwargs, _NO_OPTIONS).result()

    def warm(self, timeout: float = WARM_TIMEOUT) -> None:
        """Start the pool and wait for its first child (:meth:`ProcessPool.start`)."""
        self._target()
        self.pool.start(timeout)

    def measured(self) -> tuple[int, float, float]:
        """``(calls, wall seconds, CPU seconds)`` answered so far (:meth:`ProcessPool.measured`)."""
        with self._lock:
            pool = self._pool
        return (0, 0.0, 0.0) if pool is None else pool.measured()

    def close(self, timeout: float = 10.0) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close(timeout)


_NO_OPTIONS = SubmitOptions()


def importability_error(spec: UnitSpec) -> SubmitError | None:
    """Why a child could not import ``spec.fn`` by module + qualified name (or None)."""
    fix = (
        "define the function at the top level of an importable module (not a lambda, not inside "
        "another function, not in `python -c` or an interactive session)"
    )
    module, qualname = spec.module, spec.qualname
    if not module or not qualname or "<" in qualname:
        what = "a lambda" if "<lambda>" in qualname else "a nested function or closure"
        return SubmitError(
            f"unit {spec.name!r} runs in a child process, which finds its function by name, but "
            f"{module or '?'}.{qualname or '?'} is {what}. Fix: {fix}"
        )
    if module == "__main__":
        main = sys.modules.get("__main__")
        if getattr(main, "__file__", None) is None:
            return SubmitError(
                f"unit {spec.name!r} runs in a child process, but its function {qualname} is defined in "
                f"a __main__ that has no file (`python -c`, a notebook, the REPL), so a child cannot "
                f"import it. Fix: {fix}"
            )
    try:
        target = resolve_target(module, qualname)
    except Exception as exc:
        return SubmitError(
            f"unit {spec.name!r}: a child process could not import {module}.{qualname} "
            f"({type(exc).__name__}: {exc}). Fix: {fix}"
        )
    if target is not spec.fn and getattr(target, "__wrapped__", None) is not spec.fn:
        return SubmitError(
            f"unit {spec.name!r}: {module}.{qualname} names another object than this unit's function "
            f"(it was redefined or shadowed). Fix: {fix}"
        )
    return None


def make_runner(spec: UnitSpec, ctx: RuntimeContext) -> ProcessRunner:
    """The ``processes`` runner for ``spec``."""
    return ProcessRunner(spec, ctx)
