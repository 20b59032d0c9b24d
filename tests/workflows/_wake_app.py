"""The app of the cross-process wake-up tests (``test_journal_wakeups``): run as a worker
process with ``python -m tests.workflows._wake_app <journal url> <poll>``."""

from __future__ import annotations

import sys

from foundry import Foundry
from foundry.deliver.workflow import Worker, WorkflowContext


def make_app() -> Foundry:
    """A fresh app (one per process and test) declaring the two workflows."""
    app = Foundry("wakeapp")

    def add_one(x: int) -> int:
        return x + 1

    @app.workflow(name="bump")
    def bump(wf: WorkflowContext, x: int) -> int:
        return int(wf.step(add_one, x))

    @app.workflow(name="await_go")
    def await_go(wf: WorkflowContext) -> object:
        return wf.wait_for("go")

    return app


def main(url: str, poll: float) -> None:
    worker = Worker(make_app(), journal=url, poll=poll, inline_wait=0.2)
    print("worker up", flush=True)
    try:
        worker.run()  # until the test kills this process
    finally:
        worker.stop(5)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
