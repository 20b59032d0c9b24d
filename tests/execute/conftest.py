from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from foundry import Foundry


@pytest.fixture
def app(home: Path, request: pytest.FixtureRequest) -> Iterator[Foundry]:
    """An app in a private FOUNDRY_HOME, closed (drained, then stopped) after the test."""
    app = Foundry(f"exec-{request.module.__name__.rsplit('.', 1)[-1]}")
    try:
        yield app
    finally:
        app.close(timeout=5)
