"""``@app.workflow``: the declaration of a durable multi-step workflow.

The runtime (journal, steps, compensation) lives in ``foundry.deliver.workflow``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from foundry.traits import traits_from_kwargs
from foundry.units import decide_phases

if TYPE_CHECKING:
    from foundry.app import Foundry

__all__ = ["WorkflowUnit"]


class WorkflowUnit:
    """A workflow function ``fn(wf, *args)`` declared with ``@app.workflow(...)``."""

    def __init__(self, app: Foundry, fn: Callable[..., Any], name: str, raw: Mapping[str, Any]) -> None:
        self.app = app
        self.fn = fn
        self.name = name
        defaults = {"multi_step": True, "compensate": True, "durable": True}
        self.traits = traits_from_kwargs(name, {**defaults, **raw})
        self.decision, self.phases = decide_phases(name, self.traits, None)

    def explain(self) -> str:
        from foundry.explain import render_text

        return render_text(self.name, self.decision, self.phases)

    def __repr__(self) -> str:
        return f"<WorkflowUnit {self.name}>"
