"""The decision engine: pure, deterministic, table-driven.

``decide(traits) -> Decision``; ``reclassify(traits, measured) -> Decision`` re-decides
from measured traits. This package imports nothing from the rest of Foundry except
``foundry.traits`` and ``foundry.errors`` (the declaration it reads).
"""

from foundry.decide.engine import decide, drift, reclassify
from foundry.decide.model import Answer, Bill, Decision, Host, Load, Measured, Rejected, Warning

__all__ = [
    "Answer",
    "Bill",
    "Decision",
    "Host",
    "Load",
    "Measured",
    "Rejected",
    "Warning",
    "decide",
    "drift",
    "reclassify",
]
