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
    """``pytest`` on the files written into ``pytester``'s directory, warnings as errors, no
    xdist: the plugin as installed (or by ``-p`` when the entry point is not installed)."""
    plugin = () if installed() else ("-p", PLUGIN)
    return pytester.runpytest_inprocess(*plugin, "-W", "error", "-p", "no:cacheprovider", "-q", *args)
