"""``ids_starting``: the engine query behind ``foundry jobs show`` / ``foundry workflows show``
of a short id, on every queue engine and both journal engines. A range over the index on
``id`` for SQL, a bounded ``SCAN MATCH`` for Redis, the state store's for RabbitMQ."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from foundry.backends.journal import open_journal
from foundry.backends.journal.base import NewWorkflow
from foundry.backends.queue import NewJob, open_queue_backend
from tests.backends.queue.engines import ENGINES, close, engine_url
from tests.workflows.conftest import ENGINES as JOURNALS
from tests.workflows.conftest import drop_schema, make_url

# Ids that share prefixes, with the characters a glob or a LIKE would take for wildcards.
IDS = ["abc123-1", "abc123-2", "abc124", "ab_c12", "a*c[12]%", "zzz"]


@pytest.fixture(params=ENGINES)
def queue_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    url = engine_url(str(request.param), tmp_path)
    backend = open_queue_backend(url, home=tmp_path)
    queue = f"q-{uuid.uuid4().hex[:8]}"
    try:
        for job_id in IDS:
            backend.enqueue(NewJob(id=job_id, queue=queue, unit="u", payload=b"[]"))
        yield backend
    finally:
        close(backend, url)


@pytest.fixture(params=JOURNALS)
def journal(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    url, schema = make_url(str(request.param), tmp_path)
    backend = open_journal(url)
    try:
        for workflow_id in IDS:
            backend.start(NewWorkflow(id=workflow_id, name="flow", args=b'{"args": [], "kwargs": {}}'))
        yield backend
    finally:
        backend.close()
        if schema is not None:
            drop_schema(url.split("?", 1)[0], schema)


EXPECTED = {
    "abc123": ["abc123-1", "abc123-2"],
    "abc12": ["abc123-1", "abc123-2", "abc124"],
    "abc124": ["abc124"],
    "ab_": ["ab_c12"],  # _ is a character here, not LIKE's any-character
    "a*c[": ["a*c[12]%"],  # nor are * and [ a glob's
    "a*": ["a*c[12]%"],
    "abd": [],
    "zzz": ["zzz"],
    "": [],
}


def test_a_queue_engine_finds_exactly_the_job_ids_with_a_prefix(queue_backend: Any) -> None:
    found = {prefix: queue_backend.ids_starting(prefix, limit=10) for prefix in EXPECTED}
    assert found == EXPECTED
    assert len(queue_backend.ids_starting("a", limit=2)) == 2  # it stops at its limit


def test_a_journal_finds_exactly_the_workflow_ids_with_a_prefix(journal: Any) -> None:
    found = {prefix: journal.ids_starting(prefix, limit=10) for prefix in EXPECTED}
    assert found == EXPECTED
    assert journal.ids_starting("a", limit=2) == ["a*c[12]%", "ab_c12"]  # the first two, in id order
