"""Cancelling a running durable job, end to end: a job on a worker's thread stops at
its ``checkpoint()``, an ``async def`` job has its task cancelled, an ``isolate=True``
job has its child killed (a fault test: a job that loops for ever, in a ``foundry
worker`` process, cancelled with ``foundry jobs cancel`` from another); a claimed job
that has not started is never started; every one ends ``cancelled`` once, never
retried, and the worker goes on. The store's own clauses are the conformance suite's
(``tests/backends/queue``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from foundry.backends.queue import JobStatus
from foundry.errors import CancelledError, WorkTimeoutError
from foundry.handle import Status
from tests.adversarial._queue_helpers import stored
from tests.backends.queue.engines import ENGINES, engine_url
from tests.deliver._env import ROOT, Env
from tests.deliver.queue_app import make_app


def until(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.01)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("engine", ENGINES)
def test_a_running_job_on_a_thread_stops_at_its_checkpoint_and_ends_cancelled(
    make_env: Callable[[str], Env], engine: str, tmp_path: Path
) -> None:
    # Given a job (retries=3) that runs until it is cancelled, calling checkpoint()
    env = make_env(engine)
    env.worker()
    marker = tmp_path / "spin"
    handle = env.unit("spin").submit(str(marker))
    until("the job started", marker.exists)
    assert handle.status is Status.RUNNING
    # When its handle cancels it
    assert handle.cancel()
    # Then the caller's result() raises CancelledError, and the job ended cancelled, once
    with pytest.raises(CancelledError, match="while it ran"):
        handle.result(timeout=30)
    until("the worker reported it", lambda: "cancelled" in env.kinds(handle.id))
    state = stored(env.url, handle.id)
    assert state.status is JobStatus.CANCELLED
    assert (state.deliveries, state.attempts) == (1, 0)  # never retried
    assert state.cancel_requested_at is not None
    assert "retry" not in env.kinds(handle.id)
    assert int(env.app.metrics.value("foundry_job_cancelled_total", unit="spin")) == 1
    # And the worker goes on
    assert env.unit("add").submit(2, 3).result(timeout=30) == 5


def test_a_thread_past_its_timeout_is_stopped_at_its_checkpoint_too(env: Env, tmp_path: Path) -> None:
    env.worker()
    marker = tmp_path / "timed"
    handle = env.unit("spin_timed").submit(str(marker))
    with pytest.raises(WorkTimeoutError, match="checkpoint"):
        handle.result(timeout=30)
    until("the thread stopped", lambda: marker.read_text() == "WorkTimeoutError")


def test_a_running_async_job_has_its_task_cancelled(env: Env, tmp_path: Path) -> None:
    env.worker()
    marker = tmp_path / "async"
    handle = env.unit("async_spin").submit(str(marker))
    until("the task started", lambda: marker.exists() and marker.read_text() == "started")
    assert handle.cancel()
    with pytest.raises(CancelledError):
        handle.result(timeout=30)
    assert marker.read_text() == "cancelled"  # the cancellation reached the coroutine
    assert stored(env.url, handle.id).status is JobStatus.CANCELLED
    assert env.unit("async_add").submit(4, 5).result(timeout=30) == 9


def test_an_async_job_past_its_timeout_has_its_task_cancelled(env: Env) -> None:
    env.worker()
    with pytest.raises(WorkTimeoutError, match="it was cancelled"):
        env.unit("async_sleepy").submit(30.0).result(timeout=30)
    assert env.unit("async_sleepy").submit(0.01).result(timeout=30) == 0.01


def test_an_async_job_that_blocks_its_loop_is_failed_by_the_watcher_naming_the_block(env: Env) -> None:
    env.worker()
    with pytest.raises(WorkTimeoutError, match="its event loop did not cancel it"):
        env.unit("async_blocking").submit(4.0).result(timeout=30)
    assert env.unit("async_sleepy").submit(0.01).result(timeout=30) == 0.01  # the loop serves again


def test_a_claimed_job_that_has_not_started_never_starts(env: Env, tmp_path: Path) -> None:
    # Given a worker with one runner busy, and a second job claimed into its buffer
    env.worker(concurrency=1, prefetch=2)
    marker = tmp_path / "first"
    first = env.unit("spin").submit(str(marker))
    until("the first job started", marker.exists)
    second = env.unit("add").submit(1, 1)
    until("the second job was claimed", lambda: stored(env.url, second.id).status is JobStatus.RUNNING)
    # When the waiting one is cancelled, then it ends cancelled without ever starting
    assert second.cancel()
    with pytest.raises(CancelledError):
        second.result(timeout=30)
    assert "started" not in env.kinds(second.id)
    assert stored(env.url, first.id).status is JobStatus.RUNNING  # the other job is untouched
    assert first.cancel()
    with pytest.raises(CancelledError):
        first.result(timeout=30)


def test_a_job_that_finished_before_the_cancel_keeps_its_result(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    from foundry.cli import main

    env.worker()
    handle = env.unit("add").submit(1, 2)
    assert handle.result(timeout=30) == 3
    assert not handle.cancel()
    assert handle.result() == 3
    capsys.readouterr()
    assert main(["jobs", "cancel", handle.id, "--url", env.url]) == 1
    assert f"job {handle.id} had already finished (succeeded): nothing to cancel" in capsys.readouterr().err
    assert main(["jobs", "cancel", "no-such-job", "--url", env.url]) == 1
    assert main(["jobs", "cancel", handle.id, "--url", env.url, "--wait", "soon"]) == 2


def test_a_cancelled_isolated_job_that_loops_for_ever_has_its_child_killed_and_nothing_else_is_touched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The fault test: a ``foundry worker`` process runs two isolated jobs that never call
    ``checkpoint()`` (each in a child of its own); ``foundry jobs cancel`` from this
    process cancels one of them."""
    from foundry.cli import main

    url = engine_url("sqlite", tmp_path)
    app = make_app(url, name="cancel-fault")
    env = {**os.environ, "FOUNDRY_QUEUE": url, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    log = tmp_path / "worker.log"
    with log.open("w") as err:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "foundry.cli",
                "worker",
                "tests.deliver.queue_app:app",
                "-q",
                "--concurrency",
                "2",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        # Given two isolated jobs that loop for ever, each running in a child of the worker
        markers = [tmp_path / "doomed", tmp_path / "bystander"]
        doomed, bystander = (app.units["spin_blind"].submit(str(m)) for m in markers)
        until("both children run", lambda: all(m.exists() and m.read_text() for m in markers), 60)
        doomed_pid, bystander_pid = (int(m.read_text()) for m in markers)
        assert worker.pid not in (doomed_pid, bystander_pid)
        # When one is cancelled from the command line (another process), waiting for its end
        capsys.readouterr()
        assert main(["jobs", "cancel", doomed.id, "--url", url, "--wait", "30s"]) == 0
        out = capsys.readouterr().out
        assert "cancel requested" in out
        assert f"job {doomed.id} cancelled" in out
        # Then its child is killed, the job ended cancelled once and was not retried
        with pytest.raises(CancelledError, match="while it ran"):
            doomed.result(timeout=10)
        until("the doomed child is gone", lambda: not pid_alive(doomed_pid))
        state = stored(url, doomed.id)
        assert (state.status, state.deliveries, state.attempts) == (JobStatus.CANCELLED, 1, 0)
        assert b"its child was killed" in (state.error or b"")
        # And nothing else is touched: the other job still runs in its child
        assert pid_alive(bystander_pid)
        assert stored(url, bystander.id).status is JobStatus.RUNNING
        # And the worker goes on with the next job, isolated ones included
        assert app.units["add"].submit(2, 3).result(timeout=30) == 5
        assert app.units["where"].submit().result(timeout=60) not in (doomed_pid, worker.pid)
        assert worker.poll() is None
        assert bystander.cancel()
        with pytest.raises(CancelledError):
            bystander.result(timeout=30)
        until("the bystander's child is gone", lambda: not pid_alive(bystander_pid))
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=10)
        app.close()
    assert worker.returncode == 0, log.read_text()
