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

from foundry.backends._registry import PSYCOPG, Engine, Registry
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

__all__ = [
    "ENGINES",
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


# scheme -> the engine's module and class, and the extra that installs its driver
ENGINES = Registry("journal", __name__)
ENGINES.add(("sqlite", "memory"), Engine(".sqlite", "SqliteJournal"))
ENGINES.add(("postgresql", "postgres"), Engine(".postgres", "PostgresJournal", "postgres", PSYCOPG))


def open_journal(url: str, *, clock: Clock | None = None) -> JournalBackend:
    """Open (and create if needed) the journal at ``url``. Close it when done. A URL with
    an unknown scheme, a typo or a missing driver raises
    :class:`~foundry.errors.ConfigError` naming the fix."""
    journal: JournalBackend = ENGINES.load(url)(url, clock=clock)
    return journal
