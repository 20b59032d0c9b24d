"""``@app.workflow``: the declaration of a durable multi-step workflow.

The runtime (journal, steps, compensation) lives in ``foundry.deliver.workflow``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from foundry.errors import DeclarationError
from foundry.handle import Handle
from foundry.runtime import UnitSpec
from foundry.traits import parse_duration, traits_from_kwargs
from foundry.units import decide_phases, refuse_adaptive, refuse_result_ttl, unit_error_types

if TYPE_CHECKING:
    from foundry.app import Foundry
    from foundry.deliver.workflow import WorkflowRuntime

__all__ = ["WorkflowUnit"]


class WorkflowUnit:
    """A workflow function ``fn(wf, *args, **kwargs)`` declared with ``@app.workflow(...)``.

    ``start(...)`` runs it in this process in the background and returns a
    :class:`~foundry.handle.Handle`; ``enqueue(...)`` leaves it to workers
    (``foundry workflows worker``); ``run(...)`` (or calling the unit) runs it in the
    calling thread and returns its result. ``id=`` is the idempotency key: starting an
    id that exists returns a handle on that same workflow. An ``async def`` workflow gets
    an :class:`~foundry.deliver.workflow.AsyncWorkflowContext` and awaits its durable
    calls. ``timeout=`` (a trait) bounds the whole workflow: its deadline is a timer in
    the journal, and a run past it compensates and ends ``timed_out``.
    """

    def __init__(self, app: Foundry, fn: Callable[..., Any], name: str, raw: Mapping[str, Any]) -> None:
        self.app = app
        self.fn = fn
        self.name = name
        params = list(inspect.signature(fn).parameters.values())
        if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
            raise DeclarationError(
                name,
                "fn",
                fn,
                "takes no positional first parameter for the workflow context",
                "write `def my_workflow(wf, ...)`: the first argument is the wf context",
            )
        defaults = {"multi_step": True, "compensate": True, "durable": True}
        self.traits = traits_from_kwargs(name, {**defaults, **raw})
        refuse_adaptive(name, self.traits, "a workflow")
        refuse_result_ttl(
            name,
            self.traits,
            "a workflow's result stays in its journal until purged",
            "drop result_ttl=, and purge old runs with `foundry workflows purge --older-than 30d`",
        )
        self.decision, self.phases = decide_phases(name, self.traits, None, app.host)
        if self.decision.delivery != "workflow":
            raise DeclarationError(
                name,
                "model",
                self.traits.model,
                f"routes a workflow to {self.decision.delivery!r} delivery",
                "drop model= (a workflow always runs on the journal), or declare it with @app.work",
            )
        if self.traits.codec != "json":
            raise DeclarationError(
                name,
                "codec",
                self.traits.codec,
                "is not available to workflows: the journal stores their arguments, step results "
                "and results as JSON",
                "drop codec= and return plain data (ids, numbers, strings, lists, dicts) from steps",
            )
        functools.update_wrapper(self, fn)
        self.error_types = unit_error_types(app, fn, self.traits)

    @property
    def spec(self) -> UnitSpec:
        return UnitSpec(
            name=self.name,
            fn=self.fn,
            traits=self.traits,
            decision=self.decision,
            phases=dict(self.phases),
            is_async=inspect.iscoroutinefunction(self.fn),
            module=getattr(self.fn, "__module__", "") or "",
            qualname=getattr(self.fn, "__qualname__", "") or "",
            errors=self.error_types,
        )

    @property
    def runtime(self) -> WorkflowRuntime:
        """The workflow runtime of this app in this process."""
        return self.app.runner_for(self.spec).runtime  # type: ignore[attr-defined,no-any-return]

    def start(self, *args: Any, id: str | None = None, **kwargs: Any) -> Handle:
        """Create the workflow and run it in this process, in the background."""
        return self.runtime.start(self.spec, args, kwargs, id=id)

    def enqueue(self, *args: Any, id: str | None = None, **kwargs: Any) -> Handle:
        """Create the workflow for workers to run (``foundry workflows worker APP``)."""
        return self.runtime.start(self.spec, args, kwargs, id=id, local=False)

    def run(
        self, *args: Any, id: str | None = None, timeout: float | str | None = None, **kwargs: Any
    ) -> Any:
        """Start the workflow, run it in this thread, return its result (or raise)."""
        wait = None if timeout is None else parse_duration(timeout, unit=self.name, field_name="timeout")
        return self.runtime.run(self.spec, args, kwargs, id=id, timeout=wait)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(*args, **kwargs)

    def handle(self, workflow_id: str) -> Handle:
        """A handle on an existing run of this workflow (any process may have started it)."""
        return self.runtime.handle(workflow_id, self.name)

    def query(self, workflow_id: str) -> dict[str, Any]:
        """What run ``workflow_id`` published (``wf.publish``), read without touching it."""
        return self.runtime.query(workflow_id)

    def reset(
        self,
        workflow_id: str,
        *,
        step: str | None = None,
        position: int | None = None,
        id: str | None = None,
    ) -> Handle:
        """Run the finished ``workflow_id`` again from a completed step (by name or
        position) as a new workflow ``id`` that keeps the steps before it; it runs here."""
        return self.runtime.reset(workflow_id, step=step, position=position, new_id=id)

    def explain(self) -> str:
        from foundry.explain import render_text

        return render_text(self.name, self.decision, self.phases)

    def __repr__(self) -> str:
        return f"<WorkflowUnit {self.name}>"
