"""``rate_limit=``, ``max_concurrency=`` and ``per=`` on ``@app.work``: checked against
how the unit runs and what it takes, at declaration time (``docs/limits.md``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from foundry.decide import Decision
from foundry.errors import DeclarationError
from foundry.traits import Traits

__all__ = ["check_limits"]


def check_limits(unit: str, fn: Callable[..., Any], traits: Traits, decision: Decision) -> None:
    """Limits hold across the workers of a durable queue: refuse them on any other
    delivery, and a ``per=`` that names no argument of ``fn``."""
    declared = [
        (name, value)
        for name, value in (("rate_limit", traits.rate_limit), ("max_concurrency", traits.max_concurrency))
        if value is not None
    ]
    if not declared:
        return
    if decision.delivery != "queue":
        name, value = declared[0]
        raise DeclarationError(
            unit,
            name,
            str(value),
            f"is kept in the durable queue's engine for every worker, and this unit runs on "
            f"{decision.model}, not on a queue",
            'declare durable=True (or model="queue") so its jobs go through the workers, or use '
            "concurrency=/workers= to bound an in-process pool",
        )
    if traits.per is None:
        return
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: checked when a job runs
        return
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = params.get(traits.per)
    if (named is None or named.kind is inspect.Parameter.VAR_POSITIONAL) and not takes_any:
        choices = ", ".join(n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL)
        raise DeclarationError(
            unit,
            "per",
            traits.per,
            "is not an argument of the unit",
            f"name one of its arguments ({choices or 'it takes none'}), e.g. "
            f"per={next(iter(params), 'customer_id')!r}",
        )
