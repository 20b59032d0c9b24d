"""The public surface is deliberate: adding or removing a name is a decision, made here."""

from __future__ import annotations

import foundry

EXPECTED = {
    "BackendError", "BackendUnavailableError", "CancelledError", "ChildCrashedError", "ConfigError",
    "DeadLetteredError", "Decision", "DeclarationError", "Foundry", "FoundryError", "Handle", "Host",
    "NonDeterminismError", "NotFoundError", "OverloadError", "PayloadTooLargeError", "PoolDeadlockError",
    "RemoteError", "ResultTimeoutError", "Status", "SubmitError", "Traits", "WorkTimeoutError",
    "__version__", "checkpoint", "decide", "scope",
}  # fmt: skip


def test_all_is_pinned() -> None:
    assert set(foundry.__all__) == EXPECTED


def test_every_exported_name_exists_and_errors_share_one_root() -> None:
    for name in foundry.__all__:
        assert hasattr(foundry, name), name
        value = getattr(foundry, name)
        if isinstance(value, type) and issubclass(value, BaseException):
            assert issubclass(value, foundry.FoundryError), name
