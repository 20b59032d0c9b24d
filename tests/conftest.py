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


@pytest.fixture(autouse=True)
def _no_terminal_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a command prints does not depend on the terminal the suite was started from:
    pytest-xdist's workers can run with ``COLUMNS=80`` and ``LINES=24`` in their environment,
    and the CLI sizes piped output by ``COLUMNS`` (a test that means a width sets it)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


# -- running side by side, and alone ----------------------------------------------------------
#
# The suite runs in several pytest-xdist workers (addopts in pyproject.toml). Most tests
# wait on servers and processes and share the machine well. The ones below measure time
# (latency, deadlines, loop lag, CPU/wall), or kill workers on tight leases and count the
# deaths: beside other tests they would measure the neighbours. They run *alone*: such a
# test takes the room exclusively, every other test takes it shared, and a turnstile in
# front keeps a stream of shared tests from starving an exclusive one. The wait happens
# before the test's own timeout starts (the hook below wraps pytest-timeout's). Fault
# tests that only count (nothing lost, nothing done twice) and the benchmarks' smoke runs
# (which assert that they ran, not how fast) share the machine like the rest.
ALONE = (
    "tests/pool/",  # deadlines, "no worker" in under 50 ms, SIGSTOP/SIGKILL of serve processes
    "tests/multihost/",  # a host cut off: its leases lapse while the other host finishes
    "tests/execute/test_adaptive.py",  # the incident's health-check p99 before and after
    "tests/examples/test_payments.py",  # the watchdog names the signing phase by how long it held the loop
    "tests/observe/",  # loop lag, stalls, the watchdog's samples
    "tests/cli/test_profile.py",  # CPU/wall and the two-thread GIL probe
    "tests/cli/test_worker_metrics.py",  # a stall seen through the worker's exporter
    "tests/dashboard/test_browser.py",  # a killed worker shown down within seconds
    "tests/adversarial/test_queue_poison.py",  # counts the worker deaths exactly
    "tests/adversarial/test_workflow_poison.py",
    "tests/schedules/test_exactly_once.py",  # SIGKILL on 2 s leases, a 1 s schedule, runs counted
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "alone: runs with no other test beside it (it measures time or counts deaths)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    for item in items:
        where = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        if where.startswith(ALONE):
            item.add_marker(pytest.mark.alone)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # one value for all workers of a run
    if run is None:  # one process: nothing runs beside anything
        yield
        return
    import fcntl
    import tempfile

    locks = Path(tempfile.gettempdir()) / f"foundry-pytest-{run}"
    locks.mkdir(exist_ok=True)
    alone = item.get_closest_marker("alone") is not None
    with (locks / "turnstile").open("a") as turnstile, (locks / "room").open("a") as room:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        if not alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
