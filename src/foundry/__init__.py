"""Foundry: declare a unit of work; Foundry decides how it should run, writes down
the bill, and runs it.

The public surface is this module's ``__all__`` (pinned by ``tests/test_public_api.py``);
everything else is reachable by its module path and may change between minor versions.
"""

from foundry.app import Foundry, loop
from foundry.decide import Decision, Host, decide
from foundry.errors import (
    BackendError,
    BackendUnavailableError,
    CancelledError,
    ChildCrashedError,
    ConfigError,
    DeadLetteredError,
    DeclarationError,
    FoundryError,
    NonDeterminismError,
    NotFoundError,
    OverloadError,
    PayloadTooLargeError,
    PoolDeadlockError,
    RecordError,
    RemoteError,
    ResultTimeoutError,
    SubmitError,
    WorkTimeoutError,
)
from foundry.execute import checkpoint, scope
from foundry.execute.progress import progress
from foundry.handle import Handle, Status
from foundry.traits import Traits

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "BackendUnavailableError",
    "CancelledError",
    "ChildCrashedError",
    "ConfigError",
    "DeadLetteredError",
    "Decision",
    "DeclarationError",
    "Foundry",
    "FoundryError",
    "Handle",
    "Host",
    "NonDeterminismError",
    "NotFoundError",
    "OverloadError",
    "PayloadTooLargeError",
    "PoolDeadlockError",
    "RecordError",
    "RemoteError",
    "ResultTimeoutError",
    "Status",
    "SubmitError",
    "Traits",
    "WorkTimeoutError",
    "__version__",
    "checkpoint",
    "decide",
    "loop",
    "progress",
    "scope",
]
