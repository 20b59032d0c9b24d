"""The workflow delivery of a sandbox: the real one, on the sandbox's journal and manual
clock (its runtime configured before the first runner takes it)."""

from __future__ import annotations

from foundry.deliver.workflow import UnitRunner
from foundry.runtime import RuntimeContext, UnitSpec

__all__ = ["make_runner"]


def make_runner(spec: UnitSpec, ctx: RuntimeContext) -> UnitRunner:
    from foundry.testing.sandbox import sandbox_of

    sandbox_of(ctx).ensure_workflows()
    return UnitRunner(spec, ctx)
