"""Running a worker until it stops by itself (the adversarial thread tests)."""

from __future__ import annotations

import threading
from typing import Protocol

from foundry.errors import WorkerFailedError


class Runs(Protocol):
    def run(self) -> None: ...


def run_until_it_fails(worker: Runs, timeout: float = 30.0) -> WorkerFailedError:
    """``worker.run()`` in a thread: it must end by itself, raising WorkerFailedError."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:
            raised.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "the worker kept running with a dead thread (a zombie)"
    assert len(raised) == 1, raised
    assert isinstance(raised[0], WorkerFailedError), raised
    return raised[0]
