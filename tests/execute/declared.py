"""A module that declares a unit the usual way: ``@app.work`` replaces the module's
``triple`` with a WorkUnit, so a child process must resolve it to its function."""

from __future__ import annotations

from foundry import Foundry

app = Foundry("declared")


@app.work(model="processes", workers=1)
def triple(x: int) -> int:
    return 3 * x


@app.work(est="40ms", bound="io", concurrency=10)
async def checkout(body: str) -> tuple[str, int]:
    return await seal(body)


@checkout.phase("seal", bound="cpu", est="30ms", workers=1)
def seal(body: str) -> tuple[str, int]:
    """A phase declared compute-bound: on process workers from its first call (a child
    imports this module, where ``seal`` is the hook, and must run the function)."""
    import os

    return body.upper(), os.getpid()
