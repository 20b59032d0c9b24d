"""What a declared unit needs from the app that declared it: the :class:`DeclaringApp`
Protocol.

``foundry.app`` makes the units (``WorkUnit`` in ``foundry.units``, their phases in
``foundry.phase_decl``), so it imports them; they keep their app and ask it for a
runner, a runtime context, its host and its error types. Typing that app as the concrete
:class:`~foundry.app.Foundry` would make the two modules a circle; a unit types it by
this Protocol instead, which :class:`~foundry.app.Foundry` satisfies (checked under
``mypy --strict``: ``Foundry.work`` hands ``self`` to ``WorkUnit``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from foundry.decide import Host
    from foundry.execute.adaptive import PhaseMover
    from foundry.observe.metrics import Registry
    from foundry.runtime import Runner, RuntimeContext, UnitSpec
    from foundry.serialize import ErrorTypes

__all__ = ["DeclaringApp"]


class DeclaringApp(Protocol):
    """The part of :class:`~foundry.app.Foundry` a declared unit uses."""

    @property
    def name(self) -> str:
        """The app's name (``Foundry(name)``)."""

    @property
    def host(self) -> Host:
        """The machine the unit's decisions are made for."""

    @property
    def errors(self) -> ErrorTypes:
        """The app's exception types, which a unit's own allow-list extends."""

    @property
    def metrics(self) -> Registry:
        """The app's metrics registry."""

    def context(self) -> RuntimeContext:
        """What a runtime needs from the app (settings, metrics, lookup, errors, tracing)."""

    def runner_for(self, spec: UnitSpec) -> Runner:
        """The unit's runner, made once and kept until the app closes."""

    def phase_mover(self) -> PhaseMover:
        """What attributes and moves the app's phase hooks (``@unit.phase``)."""
