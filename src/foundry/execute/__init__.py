"""In-process execution models: how a unit runs inside one process.

The app calls :func:`make_runner` for units whose delivery is ``direct`` or ``pool``;
it picks the runner named by ``spec.decision.execution``:

============== ==========================================================================
sequential     in the caller, now (:mod:`foundry.execute.sequential`)
async          tasks on an event loop, bounded by permits (:mod:`foundry.execute.asyncio_loop`)
threads        worker threads sharing state (:mod:`foundry.execute.threads`)
bounded_pool   a fixed pool with a bounded intake (:mod:`foundry.execute.threads`)
processes      child processes, crash-contained (:mod:`foundry.execute.processes`)
channels       bounded message-passing pipelines (:mod:`foundry.execute.channels`)
parallel       partition → map → merge on processes (:mod:`foundry.execute.parallel`)
============== ==========================================================================

A unit that declares ``ordered=True`` with a ``key`` runs on the same model inside
per-key lanes (:mod:`foundry.execute.lanes`): one unit per key at a time, in submission
order, different keys at once. Sequential keeps that order by running one at a time;
parallel restores input order at the join.

Runners are imported when first needed, so ``import foundry.execute`` starts nothing
and imports no model (the sequential model's tripwire test relies on it).
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from foundry.decide.advice import LANE_MODELS

if TYPE_CHECKING:
    from foundry.execute.structured import Scope
    from foundry.runtime import Runner, RuntimeContext, UnitSpec

__all__ = ["MODELS", "checkpoint", "make_runner", "scope"]

log = logging.getLogger("foundry.execute")

MODELS: tuple[str, ...] = (
    "sequential",
    "async",
    "threads",
    "bounded_pool",
    "processes",
    "channels",
    "parallel",
)


_MODULES: dict[str, str] = {
    "sequential": "foundry.execute.sequential",
    "async": "foundry.execute.asyncio_loop",
    "threads": "foundry.execute.threads",
    "bounded_pool": "foundry.execute.threads",
    "processes": "foundry.execute.processes",
    "channels": "foundry.execute.channels",
    "parallel": "foundry.execute.parallel",
}


def make_runner(spec: UnitSpec, ctx: RuntimeContext) -> Runner:
    """The runner for ``spec`` on the model its decision names (each model's module has
    ``make_runner(spec, ctx)``). A model whose module cannot be imported falls back to
    sequential, and says so in the log."""
    execution = spec.decision.execution
    path = _MODULES.get(execution)
    if path is None:
        raise ValueError(
            f"unit {spec.name!r}: execution model {execution!r} is not one of {', '.join(MODELS)}. "
            "Fix: declare model= with one of them"
        )
    try:
        module: Any = importlib.import_module(path)
    except ImportError as exc:
        if path == _MODULES["sequential"]:
            raise
        log.warning(
            "unit %r: the %s model is not available (%s); running it sequentially instead",
            spec.name,
            execution,
            exc,
        )
        module = importlib.import_module(_MODULES["sequential"])
    runner: Runner = module.make_runner(spec, ctx)
    traits = spec.traits
    if traits.ordered and traits.key and execution in LANE_MODELS and hasattr(runner, "try_submit"):
        from foundry.execute.lanes import KeyedRunner

        runner = KeyedRunner(runner, spec, ctx)  # type: ignore[arg-type]
    return runner


def checkpoint() -> None:
    """Raise in a unit running on ``threads``/``bounded_pool``, or in a durable job on a
    queue worker's thread, that was cancelled or timed out; a no-op elsewhere. Call it
    between steps of long work."""
    from foundry.execute.threads import checkpoint as pool_checkpoint

    pool_checkpoint()


def scope() -> Scope:
    """A structured scope (``with`` / ``async with``): every handle submitted inside it is
    finished when it exits; a failure cancels the rest (see :mod:`foundry.execute.structured`)."""
    from foundry.execute.structured import Scope

    return Scope()
