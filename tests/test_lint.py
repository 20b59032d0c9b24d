"""ruff and mypy --strict are part of the test suite, so one command checks everything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff_is_clean() -> None:
    proc = _run("ruff", "check", "src", "tests", "bench")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_strict_is_clean() -> None:
    proc = _run("mypy", "--strict", "src/foundry")
    assert proc.returncode == 0, proc.stdout + proc.stderr
