"""``app.stream(name, key=..., partitions=N)``: the declaration of an event stream.

The runtime (publish, consumer groups, offsets) lives in ``foundry.deliver.stream``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from foundry.errors import DeclarationError
from foundry.traits import traits_from_kwargs
from foundry.units import decide_phases

if TYPE_CHECKING:
    from foundry.app import Foundry

__all__ = ["StreamDecl"]


class StreamDecl:
    """An ordered, replayable log of events consumed by independent groups."""

    def __init__(
        self, app: Foundry, name: str, *, key: str | None = None, partitions: int = 1, **raw: Any
    ) -> None:
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise DeclarationError(
                name,
                "partitions",
                partitions,
                "is not a positive integer",
                "give partitions=N with N ≥ 1 (order is kept per key within a partition)",
            )
        self.app = app
        self.name = name
        self.partitions = partitions
        defaults: dict[str, Any] = {"durable": True, "ordered": key is not None, "replay": True}
        if key is not None:
            defaults["key"] = key
        self.traits = traits_from_kwargs(name, {**defaults, **raw})
        self.key = self.traits.key
        self.decision, self.phases = decide_phases(name, self.traits, None)

    def explain(self) -> str:
        from foundry.explain import render_text

        return render_text(self.name, self.decision, self.phases)

    def __repr__(self) -> str:
        return f"<StreamDecl {self.name} key={self.key} partitions={self.partitions}>"
