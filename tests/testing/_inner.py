"""Running a user's test files in an inner pytest session, with Foundry's plugin."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

PLUGIN = "foundry.testing.plugin"


def installed() -> bool:
    """Whether the ``pytest11`` entry point is installed (an editable install made before it
    was declared has not got it: the inner session is then given ``-p`` instead)."""
    return any(ep.value == PLUGIN for ep in entry_points(group="pytest11"))


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """``pytest`` on the files written into ``pytester``'s directory, warnings as errors:
    the plugin as installed (or by ``-p`` when the entry point is not installed)."""
    plugin = () if installed() else ("-p", PLUGIN)
    return session(pytester, *plugin, "-W", "error", "-q", *args)


def session(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """An inner pytest session in this process (in an xdist worker too: it is not one)."""
    with pytest.MonkeyPatch.context() as env:
        for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
            env.delenv(name, raising=False)
        return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist", *args)
