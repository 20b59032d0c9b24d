"""Workflows for the adversarial journal tests, in the test process (``make_app``) and in
``foundry workflows worker`` processes (``app``; the journal comes with ``--journal``).

``doubling`` is healthy; ``slow`` too, with a step of 0.3 s (long enough that a worker
dying beside it kills it mid-step); ``parked`` runs a step and then waits for the
signal ``go`` (so its journal holds an entry while it waits); ``poison`` runs a step that
SIGKILLs the process running it, every time; ``unprintable`` raises an exception whose
``str()`` itself raises, so Foundry's own code fails on that run (writing its error
record), every time it runs.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from foundry import Foundry


def double(x: int) -> int:
    return x * 2


def slow_double(x: int) -> int:
    time.sleep(0.3)
    return x * 2


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception cannot be printed")


def make_app(journal: str | None = None, *, name: str = "adv-workflows", home: Path | None = None) -> Foundry:
    app = Foundry(name, journal=journal, home=home) if journal else Foundry(name)

    @app.workflow()
    def doubling(wf: Any, x: int) -> int:
        return int(wf.step(double, x))

    @app.workflow()
    def slow(wf: Any, x: int) -> int:
        return int(wf.step(slow_double, x))

    @app.workflow()
    def parked(wf: Any, x: int) -> int:
        y = int(wf.step(double, x))
        wf.wait_for("go", timeout=600)
        return y

    @app.workflow()
    def poison(wf: Any) -> None:
        wf.step(die)

    @app.workflow()
    def unprintable(wf: Any) -> None:
        wf.step(double, 1)
        raise Unprintable()

    return app


app = make_app()
