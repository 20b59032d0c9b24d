"""Fixtures for the dashboard tests: a private FOUNDRY_HOME, a dashboard server over the
test app, real `foundry worker` subprocesses, and a real headless Chromium.

The browser is Debian's ``chromium`` package driven by Playwright (``playwright`` is in
the dev extra; ``playwright install`` is never run: nothing is downloaded at test time
but the distribution package). When ``/usr/bin/chromium`` is missing: under ``CI=true``
the session installs it with ``apt-get install -y chromium`` (root and apt-get needed,
else the run fails); locally the browser tests skip and say how to install it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _install_chromium() -> str:
    """apt-get install chromium (CI only); the path, or a failure that says why."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.fail(
            "CI=true and chromium is missing, and this is not root with apt-get: install chromium first"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"],
    ):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1200)
        if done.returncode != 0:
            pytest.fail(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")
    path = _find_chromium()
    if path is None:
        pytest.fail("apt-get installed chromium but no chromium binary is on PATH")
    return path


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = _find_chromium()
    if path is not None:
        return path
    if os.environ.get("CI"):
        return _install_chromium()
    pytest.skip("chromium is not installed (apt-get install chromium); under CI=true the tests install it")
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def browser(chromium_path: str) -> Iterator[Any]:
    """One browser per module, never per session: Playwright's sync API keeps an asyncio
    loop marked running on the main thread while it is open, so every later test that calls
    ``asyncio.run`` would fail ("cannot be called from a running event loop")."""
    try:
        from playwright.sync_api import sync_playwright
    except ModuleNotFoundError:
        if os.environ.get("CI"):
            pytest.fail('playwright is missing: pip install -e ".[dev]"')
        pytest.skip('playwright is not installed: pip install -e ".[dev]"')
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.errors = errors
    try:
        yield pg
    finally:
        context.close()


@pytest.fixture
def foundry_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Private engines for this test: SQLite files and a fleet directory in tmp_path."""
    home = tmp_path / ".foundry"
    values = {
        "FOUNDRY_HOME": str(home),
        "FOUNDRY_QUEUE": f"sqlite:///{home / 'queue.db'}",
        "FOUNDRY_STREAM": f"sqlite:///{home / 'stream.db'}",
        "FOUNDRY_JOURNAL": f"sqlite:///{home / 'journal.db'}",
        "FOUNDRY_FLEET": (home / "fleet").as_uri(),
        "FOUNDRY_FLEET_INTERVAL": "0.5",
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


class Workers:
    """Real ``foundry worker`` subprocesses; every one is stopped at the end."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs = logs

    def start(self, app: str = "tests.dashboard.dashboard_app:app", *args: str) -> subprocess.Popen[bytes]:
        with open(self.logs / f"worker-{len(self.procs)}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "foundry.cli", "worker", app, "-q", "--queue", "images", *args],
                cwd=ROOT,
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture
def workers(foundry_env: dict[str, str], tmp_path: Path) -> Iterator[Workers]:
    w = Workers(foundry_env, tmp_path)
    try:
        yield w
    finally:
        w.stop_all()


def wait_for(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)
