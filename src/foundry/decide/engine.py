"""PLACEHOLDER engine so the rest of the package can be built against the API.

To be replaced by the real table-driven engine (issue 2).
"""

from __future__ import annotations

from foundry.decide.model import Bill, Decision
from foundry.traits import Traits

__all__ = ["decide"]


def _bill(model: str) -> Bill:
    return Bill(model, "placeholder", "placeholder", "placeholder", "placeholder")


def decide(traits: Traits, *, phase: str = "main") -> Decision:
    delivery, execution = traits.override
    if delivery is None:
        if traits.multi_step or traits.compensate:
            delivery = "workflow"
        elif traits.durable and (traits.ordered or (traits.consumers or 1) > 1 or traits.replay):
            delivery = "stream"
        elif traits.durable or traits.background:
            delivery = "queue"
        else:
            delivery = "direct"
    if execution is None:
        if traits.isolate:
            execution = "processes"
        elif traits.partitionable:
            execution = "parallel"
        elif traits.stages:
            execution = "channels"
        elif traits.bound == "io" and (traits.concurrency or 1) > 1:
            execution = "async"
        elif traits.bound == "cpu" and (traits.concurrency or 1) > 1:
            execution = "bounded_pool"
        else:
            execution = "sequential"
    return Decision(
        phase=phase,
        delivery=delivery,
        execution=execution,
        decided_by="placeholder",
        delivery_decided_by="placeholder",
        questions=(),
        delivery_bill=_bill(delivery),
        execution_bill=_bill(execution),
        watch=("placeholder",),
        rejected=(),
        simpler="",
    )
