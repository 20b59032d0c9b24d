"""``parallel``: partition → map → merge over data in memory, on processes.

::

    from foundry.execute.parallel import parallel_map

    scores = parallel_map(score, rows)                  # a list, in input order
    scores = parallel_map(score, rows, chunksize=500)   # explicit chunking
    scores = parallel_map(score, rows, errors="return") # failed items hold their exception

    @app.work(partitionable=True, est="2ms")            # a unit: its function takes one item,
    def score(row): ...                                 # the unit is called with all of them
    scores = score(rows)

How it runs:

- **Plan** (:func:`plan_chunks`): inputs below ``threshold`` items, or whose estimated
  work is under ``min_work`` seconds, run *sequentially in the caller* — processes would
  cost more than they save — and the plan says so ("fell back to sequential: 12 items <
  threshold 64"), as do runs that processes would not make at least 1.5× faster —
  shipping charged per chunk (a fixed cost) and per item (pickling both ways, measured).
  Otherwise the per-item cost (``est``, or measured on the first items in the caller,
  whose results are kept) sizes chunks so that each carries at least 10 ms of work (the
  per-chunk cost stays ≤ 2 %) and there are about four chunks per worker (a slow chunk
  cannot hold the join for long: load imbalance is bounded by one chunk).
- **Map**: chunks go to the ``processes`` model's crash-contained pool (a child that
  dies loses its chunk only; children die with the parent), at most two per
  worker in flight, so memory stays bounded — the one it computes and the next, handed
  ahead into its pipe (it never waits a round trip between two chunks; a chunk handed
  ahead to a child that dies had not started, and runs on another); the last chunks of
  an automatic plan are smaller, so the workers finish together; each chunk is pickled in the caller, so an
  item that cannot be sent fails with :class:`~foundry.errors.SubmitError` naming its index.
  With ``cluster=`` (``tcp://scheduler:8786`` for Dask, ``ray://head:10001`` for Ray;
  :mod:`foundry.backends.cluster`) the same chunks go to that cluster's workers instead,
  with the same bound in flight; "workers" is then the cores the cluster offers (capped
  by ``workers=``), asked at the start of each run.
- **Merge**: results are put back in input order at the join.
  A failed item raises its original exception type, noted with its index and chunk; the
  other chunks still complete (``errors="return"`` keeps every outcome).

A progress bar (rich) shows for runs expected to last a second or more when the console is
a terminal; ``progress=False`` turns it off, ``progress=True`` forces it.

What the model keeps: every item is computed once and its result lands at its own index;
one item's failure does not discard the others'. Nothing is persisted: a crash of the
caller loses the run. Float reductions may differ from a sequential run (the order of
additions changes).

Metrics: ``foundry_unit_completed_total`` / ``failed`` count items (``unit``, ``model`` =
``parallel``), ``foundry_unit_in_flight`` the items in dispatched chunks,
``foundry_unit_duration_seconds`` whole runs, and ``foundry_cpu_utilisation`` the
fraction of the workers' cores the last run kept busy (CPU seconds ÷ wall × workers).

The model is a package, one concept a module: :mod:`~foundry.execute.parallel.plan` (the
planner: pure, measurements in and a :class:`ChunkPlan` out),
:mod:`~foundry.execute.parallel.executor` (:class:`ParallelExecutor`: measures, plans and
runs one map), ``_chunk`` (what a worker runs for one chunk) and ``_progress`` (the bar);
this module holds :func:`parallel_map` and the runner of ``@app.work(partitionable=True)``
units.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

from foundry.backends.cluster import is_local
from foundry.decide.model import Decision
from foundry.errors import OverloadError, SubmitError
from foundry.execute.instrument import IdMaker, check_in_process_options, usable_cpus
from foundry.execute.parallel.executor import MODEL, ParallelExecutor
from foundry.execute.parallel.plan import DEFAULT_THRESHOLD, ChunkPlan, plan_chunks
from foundry.handle import FutureSource, Handle
from foundry.runtime import RuntimeContext, SubmitOptions, UnitSpec

__all__ = [
    "DEFAULT_THRESHOLD",
    "ChunkPlan",
    "ParallelExecutor",
    "ParallelRunner",
    "make_runner",
    "parallel_map",
    "plan_chunks",
]

_new_id = IdMaker("par")


# -- the shared executor behind parallel_map() ------------------------------------------

_shared: dict[tuple[int | None, str | None], ParallelExecutor] = {}
_shared_lock = threading.Lock()


def _close_shared() -> None:
    with _shared_lock:
        executors = list(_shared.values())
        _shared.clear()
    for executor in executors:
        executor.close()


atexit.register(_close_shared)


def parallel_map(
    fn: Callable[..., Any],
    items: Iterable[Any],
    *,
    workers: int | None = None,
    chunksize: int | None = None,
    est: float | None = None,
    threshold: int = DEFAULT_THRESHOLD,
    progress: bool | None = None,
    errors: Literal["raise", "return"] = "raise",
    timeout: float | None = None,
    cluster: str | None = None,
    **kwargs: Any,
) -> list[Any]:
    """``[fn(item, **kwargs) for item in items]`` on processes, in input order (see the
    module docstring). Uses a shared pool per worker count, closed at exit.

    ``cluster`` (else ``FOUNDRY_CLUSTER``) computes the chunks on a Dask or Ray cluster
    (``tcp://scheduler:8786``, ``ray://head:10001``); one connection per URL, closed at exit."""
    target = cluster or os.environ.get("FOUNDRY_CLUSTER") or None
    if is_local(target):
        target = None
    key = (workers or usable_cpus(), None) if target is None else (workers, target)
    with _shared_lock:
        executor = _shared.get(key)
        if executor is None:
            executor = _shared[key] = ParallelExecutor(workers=key[0], cluster=target)
    return executor.map(
        fn,
        items,
        kwargs=kwargs,
        chunksize=chunksize,
        est=est,
        threshold=threshold,
        progress=progress,
        errors=errors,
        timeout=timeout,
    )


# -- the runner for @app.work(partitionable=True) units ----------------------------------


class ParallelRunner:
    """Runs a ``parallel`` unit: ``unit(items)`` maps its per-item function over ``items``."""

    def __init__(self, spec: UnitSpec, ctx: RuntimeContext) -> None:
        self.spec = spec
        self.executor = ParallelExecutor(
            workers=spec.traits.concurrency,
            name=spec.name,
            metrics=ctx.metrics,
            cluster=ctx.settings.cluster,
        )
        self._slots = threading.BoundedSemaphore(spec.traits.max_pending or 4)
        self._cancels: set[threading.Event] = set()
        self._closed = False

    @property
    def decision(self) -> Decision:
        """The unit's decision with the last run's plan in its notes ("fell back to ...")."""
        plan = self.executor.last_plan
        if plan is None:
            return self.spec.decision
        return dataclasses.replace(self.spec.decision, notes=(*self.spec.decision.notes, plan.note))

    @property
    def last_plan(self) -> ChunkPlan | None:
        return self.executor.last_plan

    def _data(self, args: tuple[Any, ...]) -> Iterable[Any]:
        if len(args) != 1 or isinstance(args[0], str | bytes) or not isinstance(args[0], Iterable):
            raise SubmitError(
                f"unit {self.spec.name!r} is parallel: call it with one iterable of items (its function "
                f"runs once per item), got {len(args)} positional argument(s). Fix: `{self.spec.name}(rows)`"
            )
        return args[0]

    def _run(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], cancel: threading.Event | None
    ) -> list[Any]:
        return self.executor.map(
            self.spec.fn,
            self._data(args),
            kwargs=kwargs,
            est=self.spec.traits.est,
            timeout=self.spec.traits.timeout,
            cancel=cancel,
        )

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self._run(args, kwargs, None)

    def map(
        self, iterable: Iterable[Any], *, ordered: bool = True, timeout: float | None = None
    ) -> Iterator[Any]:
        """``unit.map(items)``: the whole input is one parallel run (order restored)."""
        yield from self.executor.map(self.spec.fn, iterable, est=self.spec.traits.est, timeout=timeout)

    def submit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        check_in_process_options(self.spec.name, MODEL, options)
        self._data(args)
        if self._closed:
            raise SubmitError(
                f"unit {self.spec.name!r}: its runner is closed. Fix: submit before app.close()"
            )
        if not self._slots.acquire(timeout=30.0):
            raise OverloadError(
                f"unit {self.spec.name!r}: {self.spec.traits.max_pending or 4} parallel runs are already "
                "in progress and none finished within 30 s. Fix: raise max_pending, or wait for results"
            )
        cancel = threading.Event()

        def stop() -> bool:
            cancel.set()  # pending chunks are dropped; running ones finish and are discarded
            return True

        source = FutureSource(on_cancel=stop)
        self._cancels.add(cancel)

        def work() -> None:
            source.running = True
            try:
                source.future.set_result(self._run(args, kwargs, cancel))
            except BaseException as exc:
                try:
                    source.future.set_exception(exc)
                except cf.InvalidStateError:
                    pass
            finally:
                self._cancels.discard(cancel)
                self._slots.release()

        threading.Thread(target=work, name=f"foundry-{self.spec.name}-parallel", daemon=True).start()
        return Handle(_new_id(), self.spec.name, source)

    async def asubmit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        import asyncio

        return await asyncio.to_thread(self.submit, args, kwargs, options)

    def close(self, timeout: float = 10.0) -> None:
        self._closed = True
        deadline = time.monotonic() + timeout
        limit = self.spec.traits.max_pending or 4
        taken = 0
        while taken < limit and self._slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
            taken += 1
        if taken < limit:
            for cancel in list(self._cancels):
                cancel.set()
        for _ in range(taken):
            self._slots.release()
        self.executor.close()


def make_runner(spec: UnitSpec, ctx: RuntimeContext) -> ParallelRunner:
    """The ``parallel`` runner for ``spec`` (see the module docstring)."""
    return ParallelRunner(spec, ctx)
