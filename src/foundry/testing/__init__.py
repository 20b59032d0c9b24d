"""Testing mode: an isolated app per test, durable units run eagerly, a manual clock.

``Sandbox(app, home=tmp_path)`` holds an app for one test: its stores in ``home``, queue
jobs run at submit with the real encode/decode, a stream's publish handled by its
consumers before it returns, workflows and schedules on a :class:`ManualClock`.
:mod:`foundry.testing.plugin` (loaded by pytest once Foundry is installed) gives the same
as fixtures: ``foundry_home``, ``foundry_clock``, ``foundry_sandbox`` and ``foundry_app``.
See ``docs/testing.md``.
"""

from __future__ import annotations

from foundry.testing.clock import Clock, ManualClock, SystemClock
from foundry.testing.sandbox import Sandbox

__all__ = ["Clock", "ManualClock", "Sandbox", "SystemClock"]
