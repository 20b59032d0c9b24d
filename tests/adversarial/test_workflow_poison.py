"""A poison workflow beside healthy ones (issue 12, items 4 and 5, for workflows): one
whose step SIGKILLs the worker process running it, every time, is the only workflow
charged with those deaths. Workers restart as a supervisor would restart them; every
healthy workflow completes, and the poison one is set aside (failed) after
``MAX_CRASHES`` deaths while it ran alone, its error saying so.

Before, nothing was ever charged: the poison workflow killed every worker that claimed it,
for ever, and a healthy workflow claimed beside it each time (here, one whose step takes
0.3 s) never completed either."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from foundry import Foundry
from foundry.backends.journal._records import MAX_CRASHES
from foundry.backends.journal.base import WorkflowStatus

ROOT = Path(__file__).resolve().parents[2]


def start_worker(url: str, home: Path, log: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "foundry.cli", "workflows", "worker", "tests.adversarial._workflow_app:app",
        "--journal", url, "--lease", "1", "--poll", "0.05", "--concurrency", "4",
    ]  # fmt: skip
    with open(log, "ab") as sink:
        return subprocess.Popen(
            cmd, cwd=ROOT, env={**os.environ, "FOUNDRY_HOME": str(home)}, stdout=sink, stderr=sink
        )


def test_a_workflow_that_kills_its_worker_every_time_is_the_only_one_charged(
    workflow_app: Foundry, journal_url: str, tmp_path: Path
) -> None:
    app = workflow_app
    log = tmp_path / "workers.log"
    worker: subprocess.Popen[bytes] | None = None
    try:
        journal = app.workflows["slow"].runtime.journal  # type: ignore[attr-defined]
        # Given a workflow whose step kills its worker, first in line, then healthy ones
        poison = app.workflows["poison"].enqueue()
        healthy = [app.workflows["slow"].enqueue(i) for i in range(12)]
        # When a supervisor keeps one worker running, starting a new one whenever it dies
        deaths = 0
        deadline = time.monotonic() + 90

        def settled() -> bool:
            return all(journal.get(h.id).status.finished for h in [poison, *healthy])

        while not settled():
            assert time.monotonic() < deadline, (
                f"after {deaths} worker deaths: {journal.get(poison.id)}; "
                f"{sum(journal.get(h.id).status.finished for h in healthy)} of 12 healthy finished; "
                f"{log.read_text()[-3000:]}"
            )
            if worker is None or worker.poll() is not None:
                deaths += worker is not None
                worker = start_worker(journal_url, tmp_path / "home", log)
            time.sleep(0.05)
        # Then every healthy workflow completed ...
        assert [h.result(timeout=10) for h in healthy] == [2 * i for i in range(12)]
        # ... and the poison one was set aside after killing its worker MAX_CRASHES times alone
        state = journal.get(poison.id)
        assert state.status is WorkflowStatus.FAILED
        with pytest.raises(Exception, match=f"ran alone in it, {MAX_CRASHES} times") as info:
            poison.result(timeout=10)
        assert "its worker died" in str(info.value)
        assert deaths >= 1 + MAX_CRASHES  # one beside the others, then each time alone
    finally:
        if worker is not None and worker.poll() is None:
            worker.terminate()
            try:
                worker.wait(15)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(5)
