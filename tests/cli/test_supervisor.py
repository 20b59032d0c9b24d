"""``Supervisor`` in-process: a component that stops by itself is reported with its
kind and reason, and stopping drains what runs."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from foundry import Foundry
from foundry.supervisor import Options, Supervisor


def test_a_failed_scheduler_is_reported_by_name(tmp_path: Path) -> None:
    app = Foundry("sup", queue=f"sqlite:///{tmp_path / 'q.db'}", home=tmp_path)

    @app.work(schedule="every 1s")
    def beat() -> None: ...

    supervisor = Supervisor(app, Options(grace=1.0), only=["schedules"])
    [component] = supervisor.components
    scheduler: Any = component.scheduler  # type: ignore[attr-defined]

    def broken() -> list[Any]:
        raise RuntimeError("a bug in a look")

    scheduler.store.records = broken
    try:
        supervisor.start()
        give_up = threading.Event()
        timer = threading.Timer(10.0, give_up.set)  # watch() returns None then: the test fails
        timer.start()
        failure = supervisor.watch(give_up, poll=0.01)
        timer.cancel()
        assert failure is not None, "the scheduler's failure was not reported within 10 s"
        assert (failure.kind, failure.component) == ("schedules", "scheduler")
        assert "RuntimeError: a bug in a look" in failure.reason
    finally:
        supervisor.stop()
        app.close()
    assert supervisor.components == []
    assert supervisor.summary() == "ticks enqueued: 0"
