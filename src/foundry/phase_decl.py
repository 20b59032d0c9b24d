"""``@unit.phase("sign")``: declaring the function that does one phase of an ``async def``
unit. The hook itself (where a call runs, how it is moved) is
:class:`foundry.execute.phase.Phase`; this module checks the declaration, decides the
phase, and hands the hook to the app's :class:`~foundry.execute.adaptive.PhaseMover`
(which attributes its stalls and, for ``adaptive=True``, moves it).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from foundry.decide import decide
from foundry.errors import DeclarationError
from foundry.execute.phase import IN_THE_CALLER, POOLS, Phase
from foundry.runtime import UnitSpec
from foundry.traits import traits_from_kwargs
from foundry.units import check_adaptive, check_callable, check_phase_name

if TYPE_CHECKING:
    from foundry.units import WorkUnit

__all__ = ["declare_phase"]


def declare_phase(unit: WorkUnit, name: str, fn: Callable[..., Any], raw: Mapping[str, Any]) -> Phase:
    """The hook for phase ``name`` of ``unit``, run by ``fn`` (see ``WorkUnit.phase``)."""
    check_phase_name(unit.name, name, "phase")
    subject = f"{unit.name}.{name}"
    check_callable(subject, fn)
    if not unit.is_async:
        raise DeclarationError(
            unit.name,
            "phase",
            name,
            "marks a phase awaited inside an `async def` unit (it moves work off the unit's event "
            "loop), and this unit is a plain function",
            "call the function directly in a def unit, or declare it a unit of its own with @app.work",
        )
    if name in unit.hooks:
        raise DeclarationError(
            unit.name,
            "phase",
            name,
            f"already has its function ({unit.hooks[name].fn.__qualname__})",
            "mark one function per phase, or give this one another phase name",
        )
    if inspect.iscoroutinefunction(fn):
        raise DeclarationError(
            subject,
            "fn",
            fn,
            "is an async function: it already awaits on the loop, and a pool cannot run it",
            "mark the plain function that computes (a `def`) as the phase, and await the hook",
        )
    if name in unit.phase_traits:
        if raw:
            raise DeclarationError(
                subject,
                "traits",
                dict(raw),
                "are given here and in the unit's phases=",
                f"declare phase {name!r}'s traits once: in phases= or in .phase()",
            )
        traits, decision = unit.phase_traits[name], unit.phases[name]
    else:
        traits = traits_from_kwargs(subject, raw, base=unit.traits.merged(model=None))
        decision = decide(traits, phase=name, host=unit.app.host)
    # A phase runs inside its unit, wherever the unit's delivery carries it: its own traits
    # may choose how it executes, not another delivery.
    if decision.delivery != unit.decision.delivery or decision.execution not in IN_THE_CALLER | POOLS:
        raise DeclarationError(
            subject,
            "model",
            decision.model,
            "is not a model a phase hook runs: it runs a phase inside its unit, in its caller "
            "(sequential, async) or on a pool of that process (threads, bounded_pool, processes)",
            "declare the phase's traits (or model=) for one of those, or make it a unit of its own",
        )
    unit.phase_traits[name], unit.phases[name] = traits, decision
    if traits.adaptive:
        check_adaptive(unit)

    def changed(phase: Phase) -> None:  # moved: plan, explain and the dashboard show it
        unit.phases[phase.name] = phase.decision

    spec = UnitSpec(
        name=subject,
        fn=fn,
        traits=traits,
        decision=decision,
        module=getattr(fn, "__module__", "") or "",
        qualname=getattr(fn, "__qualname__", "") or "",
        errors=unit.error_types,
    )
    hook = Phase(unit.name, name, fn, traits, decision, spec, unit.app.context, on_change=changed)
    unit.hooks[name] = hook
    unit.app.phase_mover().add(hook)
    return hook
