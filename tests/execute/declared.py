"""A module that declares a unit the usual way: ``@app.work`` replaces the module's
``triple`` with a WorkUnit, so a child process must resolve it to its function."""

from __future__ import annotations

from foundry import Foundry

app = Foundry("declared")


@app.work(model="processes", workers=1)
def triple(x: int) -> int:
    return 3 * x
