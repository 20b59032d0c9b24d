from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """A private ``FOUNDRY_HOME`` so tests never share SQLite files."""
    old = os.environ.get("FOUNDRY_HOME")
    os.environ["FOUNDRY_HOME"] = str(tmp_path / ".foundry")
    try:
        yield tmp_path / ".foundry"
    finally:
        if old is None:
            os.environ.pop("FOUNDRY_HOME", None)
        else:
            os.environ["FOUNDRY_HOME"] = old
