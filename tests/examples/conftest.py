"""Fixtures of the examples' tests: Debian's ffmpeg for the transcoder.

When ``ffmpeg`` is missing: under ``CI=true`` the session installs it with ``apt-get
install -y ffmpeg`` (root and apt-get needed, else the run fails), as
``tests/dashboard/conftest.py`` installs chromium; locally the transcoder's test skips
and says how to install it.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def _install_ffmpeg() -> str:
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.fail("CI=true and ffmpeg is missing, and this is not root with apt-get: install ffmpeg first")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", "ffmpeg"],
    ):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1200)
        if done.returncode != 0:
            pytest.fail(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")
    path = shutil.which("ffmpeg")
    if path is None:
        pytest.fail("apt-get installed ffmpeg but no ffmpeg binary is on PATH")
    return path


@pytest.fixture(scope="session")
def ffmpeg_path() -> str:
    path = shutil.which("ffmpeg")
    if path is not None:
        return path
    if os.environ.get("CI"):
        return _install_ffmpeg()
    pytest.skip("ffmpeg is not installed (apt-get install -y ffmpeg); under CI=true the tests install it")
    raise AssertionError("unreachable")
