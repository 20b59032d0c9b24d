"""Foundry: declare a unit of work; Foundry decides how it should run, writes down
the bill, and runs it."""

from foundry.app import Foundry
from foundry.decide import Decision, decide
from foundry.errors import (
    CancelledError,
    ChildCrashedError,
    DeclarationError,
    FoundryError,
    PoolDeadlockError,
    ResultTimeoutError,
    SubmitError,
    WorkTimeoutError,
)
from foundry.handle import Handle, Status
from foundry.traits import Traits

__version__ = "0.1.0"

__all__ = [
    "CancelledError",
    "ChildCrashedError",
    "Decision",
    "DeclarationError",
    "Foundry",
    "FoundryError",
    "Handle",
    "PoolDeadlockError",
    "ResultTimeoutError",
    "Status",
    "SubmitError",
    "Traits",
    "WorkTimeoutError",
    "__version__",
    "decide",
]
