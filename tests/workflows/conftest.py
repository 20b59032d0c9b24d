"""Journals for the workflow tests: a fresh SQLite file, or a private PostgreSQL schema
(dropped afterwards), each with a manual clock so no test sleeps for time to pass."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from foundry import Foundry
from foundry.backends.journal import JournalBackend, ManualClock, open_journal
from foundry.deliver.workflow import Worker, WorkflowRuntime, configure
from tests.services import require

ENGINES = ["sqlite", "postgres"]
LEASE = 30.0


class Crash(BaseException):
    """Stands in for a process dying mid-step: nothing of ours catches it."""


def drop_schema(base_url: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def make_url(engine: str, tmp_path: Path) -> tuple[str, str | None]:
    """(journal URL, schema to drop afterwards)."""
    if engine == "sqlite":
        return f"sqlite:///{tmp_path / f'journal-{uuid.uuid4().hex[:6]}.db'}", None
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


class Env:
    """An app whose workflow runtime runs on the test's journal and manual clock."""

    def __init__(self, url: str, clock: ManualClock, **options: Any) -> None:
        self.app = Foundry(f"t{uuid.uuid4().hex[:6]}")
        settings: dict[str, Any] = {"lease": LEASE, "poll": 0.02, **options}
        self.rt: WorkflowRuntime = configure(self.app, journal=url, clock=clock, **settings)
        self.clock = clock
        self.journal = self.rt.journal
        self._workers: list[Worker] = []

    def worker(self, **options: Any) -> Worker:
        settings: dict[str, Any] = {
            "journal": self.journal,
            "lease": self.rt.lease,
            "inline_wait": self.rt.inline_wait,
            "poll": 0.02,
            **options,
        }
        w = Worker(self.app, **settings)
        self._workers.append(w)
        return w

    def expire_leases(self) -> None:
        self.clock.advance(self.rt.lease + 1)

    def close(self) -> None:
        for w in self._workers:
            w.stop(5)
        self.app.close(5)
        self.rt.close(5)


@pytest.fixture
def make_env(journal_url: str, clock: ManualClock) -> Iterator[Callable[..., Env]]:
    envs: list[Env] = []

    def make(**options: Any) -> Env:
        env = Env(journal_url, clock, **options)
        envs.append(env)
        return env

    try:
        yield make
    finally:
        for env in envs:
            env.close()
