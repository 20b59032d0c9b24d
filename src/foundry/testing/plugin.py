"""The pytest plugin (entry point ``pytest11``: loaded in every pytest session once Foundry
is installed). It only defines fixtures; a test that asks for none of them runs exactly
as it would without the plugin — no autouse fixture, no hook, no command-line option.

* ``foundry_home`` — a fresh directory for Foundry's state, set as ``FOUNDRY_HOME`` for
  the test (so an app that resolves its settings during the test keeps them there).
* ``foundry_clock`` — a :class:`~foundry.testing.ManualClock` shared by the test's
  sandboxes: ``foundry_clock.advance(60)``.
* ``foundry_sandbox`` — ``foundry_sandbox(app)`` holds your app for the test
  (:class:`~foundry.testing.Sandbox`: stores in ``foundry_home``, queue jobs eager,
  workflows and schedules on ``foundry_clock``) and gives it back afterwards;
  ``foundry_sandbox(app, eager=False)`` keeps the real queue delivery.
* ``foundry_app`` — a new, empty ``Foundry`` app already in a sandbox, for tests that
  declare their units inline.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from foundry.app import Foundry
    from foundry.testing import ManualClock, Sandbox

__all__ = ["foundry_app", "foundry_clock", "foundry_home", "foundry_sandbox"]


@pytest.fixture
def foundry_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh directory for Foundry's state, also ``FOUNDRY_HOME`` during the test."""
    home = tmp_path_factory.mktemp("foundry-home", numbered=True)
    monkeypatch.setenv("FOUNDRY_HOME", str(home))
    return home


@pytest.fixture
def foundry_clock() -> ManualClock:
    """The test's manual clock (it moves only by ``advance``)."""
    from foundry.testing import ManualClock

    return ManualClock()


@pytest.fixture
def foundry_sandbox(foundry_home: Path, foundry_clock: ManualClock) -> Iterator[Callable[..., Sandbox]]:
    """``foundry_sandbox(app, eager=True)``: hold ``app`` for this test."""
    from foundry.testing import Sandbox

    opened: list[Sandbox] = []

    def hold(app: Foundry, *, eager: bool = True, **options: Any) -> Sandbox:
        home = foundry_home / f"{re.sub(r'[^A-Za-z0-9_.-]', '-', app.name)[:60]}-{len(opened)}"
        sandbox = Sandbox(app, home=home, clock=foundry_clock, eager=eager, **options).open()
        opened.append(sandbox)
        return sandbox

    try:
        yield hold
    finally:
        for sandbox in reversed(opened):
            sandbox.close()


@pytest.fixture
def foundry_app(foundry_sandbox: Callable[..., Sandbox]) -> Foundry:
    """A new, empty app in a sandbox (declare units on it in the test)."""
    from foundry import Foundry

    app = Foundry(f"test-{uuid.uuid4().hex[:8]}")
    foundry_sandbox(app)
    return app
