"""Fixtures of the queue conformance suite: one backend per engine in ``ENGINES``."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from foundry.backends.queue import QueueBackend
from tests.backends.queue._helpers import Namespace
from tests.backends.queue.engines import ENGINES, drop_schema, engine_url


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def queue_url(engine: str, tmp_path: Path) -> Iterator[str]:
    url = engine_url(engine, tmp_path)
    try:
        yield url
    finally:
        drop_schema(url)


@pytest.fixture
def open_backend(queue_url: str) -> Iterator[Callable[[], QueueBackend]]:
    """Open more backends on the same URL (another "process"); afterwards all are closed
    and what they created is removed (``_helpers.Namespace``)."""
    with Namespace[Any](queue_url, object) as namespace:
        yield namespace.open


@pytest.fixture
def backend(open_backend: Callable[[], QueueBackend]) -> QueueBackend:
    return open_backend()


@pytest.fixture
def queue() -> str:
    """A queue name no other test uses."""
    return f"q-{uuid.uuid4().hex[:12]}"
