"""What runtimes open outside a runner is given back by app.close(), through ctx.closers."""

from __future__ import annotations

from pathlib import Path

import pytest

from foundry import Foundry
from foundry.deliver import queue as queue_module
from foundry.runtime import Closers


def test_each_key_closes_once_in_order_and_a_failing_closer_does_not_stop_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    closers, ran = Closers(), []

    def boom() -> None:
        raise RuntimeError("a closer that fails")

    closers.add("a", lambda: ran.append("a"))
    closers.add("a", lambda: ran.append("a again"))  # the first registration is kept
    closers.add("boom", boom)
    closers.add("b", lambda: ran.append("b"))
    closers.close()
    assert ran == ["a", "b"]
    assert "closing a runtime resource failed" in caplog.text
    closers.close()  # nothing left: closing twice runs nothing twice
    assert ran == ["a", "b"]


def test_app_close_gives_back_the_connection_of_an_app_job_handle(tmp_path: Path) -> None:
    app = Foundry("closers", queue=f"sqlite:///{tmp_path}/q.db")

    @app.work(durable=True)
    def add(a: int, b: int) -> int:
        return a + b

    job = add.submit(1, 2)
    app.job(job.id)  # opens a runtime on the queue, outside any runner
    mine = id(app.context().metrics)
    assert any(key[0] == mine for key in queue_module._HANDLE_RUNTIMES)
    app.close()
    assert not any(key[0] == mine for key in queue_module._HANDLE_RUNTIMES)
