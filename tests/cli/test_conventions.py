"""The conventions every Python tool keeps: ``--version`` and ``python -m``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from importlib.metadata import version

import foundry

CLI = Callable[..., tuple[int, str, str]]


def test_version_is_the_installed_distributions(cli: CLI) -> None:
    code, out, _ = cli("--version")
    assert code == 0
    assert out == f"foundry {version('foundry-exec')}\n"
    assert foundry.__version__ == version("foundry-exec")  # the package says the same


def test_python_dash_m_foundry_is_the_foundry_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "foundry", "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"foundry {version('foundry-exec')}\n"
    done = subprocess.run(
        [sys.executable, "-m", "foundry", "plan", "foundry.examples.seeds", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("{")
    done = subprocess.run(
        [sys.executable, "-m", "foundry", "jobs", "bogus"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.startswith("usage: foundry jobs")  # the same program name as the script
