"""Durable timers and fan-out recovery under SIGKILL, on SQLite and PostgreSQL.

* A workflow's deadline and a timed step's timer are rows in the journal: the worker that
  started them is SIGKILLed mid-step, and the worker that takes the workflow over (after
  the dead one's lease lapsed, later than the timer) finds the timer expired — it does not
  start the step again on a fresh timer — compensates, and ends the workflow.
* A worker is SIGKILLed in the middle of a 10-branch fan-out: the branches whose results
  were journaled before the kill never run again; only the others do.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from foundry.backends.journal.base import WorkflowStatus
from foundry.deliver.workflow import configure
from foundry.errors import WorkflowTimeoutError, WorkTimeoutError
from tests.faults import _workflow_timer_app as timer_app
from tests.workflows.conftest import drop_schema, make_url

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.faults._workflow_timer_app:app"
LEASE = 2.0  # longer than the timers: the next worker claims after they ran out


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    journal_url, schema = make_url(str(request.param), tmp_path)
    try:
        yield journal_url
    finally:
        if schema is not None:
            drop_schema(journal_url.split("?", 1)[0], schema)


def _wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


class Workers:
    def __init__(self, url: str, log: Path, tmp: Path) -> None:
        self.url, self.log, self.tmp = url, log, tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        out = self.tmp / f"worker-{len(self.procs)}.out"
        cmd = [
            sys.executable, "-m", "foundry.cli", "workflows", "worker", APP,
            "--journal", self.url, "--lease", str(LEASE), "--poll", "0.05", "--concurrency", "4",
        ]  # fmt: skip
        with open(out, "wb") as sink:
            proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env={**os.environ, "FW_FAULT_LOG": str(self.log)},
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        _wait_for(lambda: b"workflow worker" in out.read_bytes() or proc.poll() is not None)
        assert proc.poll() is None, out.read_text()
        return proc

    def lines(self) -> list[tuple[str, str, int]]:
        return [
            (w, what, int(pid))
            for w, what, pid, _ in (ln.split() for ln in self.log.read_text().splitlines())
        ]

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


@pytest.fixture
def workers(url: str, tmp_path: Path) -> Iterator[Workers]:
    log = tmp_path / "steps.log"
    log.touch()
    w = Workers(url, log, tmp_path)
    try:
        yield w
    finally:
        w.stop()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workflow", "error", "status"),
    [
        ("deadline_order", WorkflowTimeoutError, WorkflowStatus.TIMED_OUT),
        ("step_timer_order", WorkTimeoutError, WorkflowStatus.FAILED),
    ],
)
def test_a_timer_outlives_the_worker_that_started_it(
    url: str, workers: Workers, workflow: str, error: type[BaseException], status: WorkflowStatus
) -> None:
    rt = configure(timer_app.app, journal=url)
    try:
        # Given worker A, SIGKILLed while the workflow's step hangs, its timer running
        first = workers.start()
        handle = getattr(timer_app, workflow).enqueue("o-1", id="o-1")
        _wait_for(lambda: ("o-1", "hang", first.pid) in workers.lines())
        workers.kill(first)
        # When worker B takes it over once A's lease lapsed (after the 1 s timer ran out)
        second = workers.start()
        # Then B finds the timer expired: the step is not started again, the completed
        # step is compensated, and the workflow ends as the timer says
        with pytest.raises(error):
            handle.result(60)
        state, entries = rt.journal.load("o-1")
        assert state.status == status
        assert state.compensation == "done"
        assert state.claims == 2
        ran = workers.lines()
        assert ran.count(("o-1", "hang", first.pid)) == 1
        assert not [r for r in ran if r[1] == "hang" and r[2] != first.pid]  # not run again by B
        assert [r[2] for r in ran if r[1] == "release"] == [second.pid]
        assert [e.kind for e in entries] == [
            "step",
            "timeout" if workflow == "deadline_order" else "step",
            "undo",
        ]
    finally:
        rt.close()


@pytest.mark.slow
def test_a_fan_out_resumed_after_sigkill_runs_only_its_unfinished_branches(
    url: str, workers: Workers
) -> None:
    rt = configure(timer_app.app, journal=url)
    try:
        # Given worker A, SIGKILLed when some branches of a 10-way fan-out are journaled
        first = workers.start()
        handle = timer_app.fan_out.enqueue("f-1", id="f-1")

        def recorded() -> set[int]:
            return {e.position for e in rt.journal.load("f-1")[1] if e.kind == "step" and e.status == "ok"}

        _wait_for(lambda: len(recorded()) >= 3)
        workers.kill(first)
        done_before = recorded()
        assert len(done_before) < 10, "the kill came too late: every branch had finished"
        # When worker B resumes it
        second = workers.start()
        # Then the fan-out completes with every result, in order
        assert handle.result(60) == [i * i for i in range(10)]
        ran = workers.lines()
        for pos in range(1, 11):
            i = pos - 1
            starts = [pid for w, what, pid in ran if what == f"start-{i}"]
            if pos in done_before:  # journaled before the kill: never run again
                assert starts == [first.pid], (i, starts)
            else:  # unfinished at the kill: run by B
                assert starts[-1] == second.pid, (i, starts)
        state = rt.journal.get("f-1")
        assert state is not None
        assert state.status == WorkflowStatus.SUCCEEDED
        assert state.claims == 2
    finally:
        rt.close()
