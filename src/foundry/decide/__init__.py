"""The decision engine: pure, deterministic, table-driven.

``decide(traits) -> Decision``. This package imports nothing from the rest of
Foundry except ``foundry.traits`` and ``foundry.errors`` (the declaration it reads).
"""

from foundry.decide.engine import decide
from foundry.decide.model import Answer, Bill, Decision, Host, Rejected, Warning

__all__ = ["Answer", "Bill", "Decision", "Host", "Rejected", "Warning", "decide"]
