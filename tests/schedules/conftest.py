"""Fixtures of the schedule tests: ``cli`` runs ``foundry ARGS`` in-process (as in tests/cli)."""

from __future__ import annotations

from tests.cli.conftest import cli

__all__ = ["cli"]
