"""Workflow journals: the :class:`JournalBackend` contract (``base``) and one module per
engine. ``open_journal(url)`` picks the engine from the URL's scheme and imports its
driver only then, so ``import foundry`` needs no database client.

=================================  =======================================================
``sqlite:///path/journal.db``       embedded default: one file, every process on the host
``memory://``                       in-process SQLite, gone at exit (tests, demos)
``postgresql://user@host/db``       many machines; ``?schema=`` keeps journals apart
=================================  =======================================================
"""

from __future__ import annotations

from foundry.backends.journal._records import set_aside_error, set_aside_reason
from foundry.backends.journal.base import (
    Clock,
    Entry,
    EntryKind,
    EntryStatus,
    JournalBackend,
    ManualClock,
    NewWorkflow,
    SystemClock,
    Tx,
    WorkflowState,
    WorkflowStatus,
)
from foundry.config import check_url

__all__ = [
    "Clock",
    "Entry",
    "EntryKind",
    "EntryStatus",
    "JournalBackend",
    "ManualClock",
    "NewWorkflow",
    "SystemClock",
    "Tx",
    "WorkflowState",
    "WorkflowStatus",
    "open_journal",
    "set_aside_error",
    "set_aside_reason",
]


def open_journal(url: str, *, clock: Clock | None = None) -> JournalBackend:
    """Open (and create if needed) the journal at ``url``. Close it when done."""
    check_url("journal", url)
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("postgresql", "postgres"):
        from foundry.backends.journal.postgres import PostgresJournal

        return PostgresJournal(url, clock=clock)
    from foundry.backends.journal.sqlite import SqliteJournal

    return SqliteJournal(url, clock=clock)
