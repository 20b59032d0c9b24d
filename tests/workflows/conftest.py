"""Journals for the workflow tests: a fresh SQLite file, or a private PostgreSQL schema
(dropped afterwards), each with a manual clock so no test sleeps for time to pass."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from foundry.backends.journal import JournalBackend, ManualClock, open_journal
from tests.services import require

ENGINES = ["sqlite", "postgres"]


def drop_schema(base_url: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def make_url(engine: str, tmp_path: Path) -> tuple[str, str | None]:
    """(journal URL, schema to drop afterwards)."""
    if engine == "sqlite":
        return f"sqlite:///{tmp_path / 'journal.db'}", None
    base = require("postgres")
    schema = f"fw_test_{uuid.uuid4().hex[:10]}"
    return f"{base}?schema={schema}", schema


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def journal_url(engine: str, tmp_path: Path) -> Iterator[str]:
    url, schema = make_url(engine, tmp_path)
    try:
        yield url
    finally:
        if schema is not None:
            drop_schema(url.split("?", 1)[0], schema)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def journal(journal_url: str, clock: ManualClock) -> Iterator[JournalBackend]:
    j = open_journal(journal_url, clock=clock)
    try:
        yield j
    finally:
        j.close()
