"""The ``pool`` delivery model: stateless worker processes behind a dispatcher.

Seed 000's work pool: each request goes to the first free worker; nothing is
persisted; a request in a worker that dies is lost, and only an idempotent unit is
retried (on another worker, with the same idempotency key). Workers run on this
machine by default (``local://``) or on many hosts behind NATS (``nats://``, started
with ``foundry pool serve``). Between ``min_workers`` and ``max_workers`` the pool sizes
itself with M/M/c to hold the unit's ``latency=`` target (``controller``).

``runner`` (deadlines, intake, loss), ``controller`` (elastic sizing), ``metrics``,
``serve`` (the worker host behind ``foundry pool serve``). Guide: ``docs/pool.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from foundry.deliver.pool.runner import PoolRunner
    from foundry.runtime import RuntimeContext, UnitSpec

__all__ = ["make_runner"]


def make_runner(spec: UnitSpec, ctx: RuntimeContext) -> PoolRunner:
    """The ``pool`` runner for ``spec`` (its workers start on the first submit)."""
    from foundry.deliver.pool.runner import PoolRunner

    return PoolRunner(spec, ctx)
