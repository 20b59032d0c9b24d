"""The testing mode's tests run a user's test files in an inner pytest session
(``pytester``), with the plugin loaded the way an installed Foundry loads it."""

from __future__ import annotations

pytest_plugins = ["pytester"]
