from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from foundry import Foundry


@pytest.fixture
def app(home: Path, request: pytest.FixtureRequest) -> Iterator[Foundry]:
    """An app with the embedded pool in a private FOUNDRY_HOME, closed after the test."""
    app = Foundry(f"pool-{request.node.name[:20]}".replace("[", "-").replace("]", ""), pool="local://")
    try:
        yield app
    finally:
        app.close(timeout=5)


def lines(path: Path) -> list[tuple[str, int]]:
    """The ``key pid`` records the units appended (O_APPEND: one whole line per run)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        key, pid = line.split()
        out.append((key, int(pid)))
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
