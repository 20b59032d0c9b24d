"""``foundry.progress()`` in a durable job: the worker keeps the latest record and writes
it to the store, fenced by the delivery's token — from a runner thread, an ``async def``
task and an ``isolate=True`` child alike — and the last record outlives the job (a crash
shows how far it got). ``foundry jobs list/show`` print it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import foundry
from foundry.backends.queue import JobProgress, JobState, JobStatus, open_queue_backend
from foundry.cli import main
from foundry.errors import ChildCrashedError
from tests.deliver._env import Env


def _state(env: Env, job_id: str) -> JobState:
    backend = open_queue_backend(env.url)
    try:
        state = backend.get(job_id)
    finally:
        backend.close()
    assert state is not None
    return state


def _wait_for(marker: Path, text: str) -> None:
    deadline = time.monotonic() + 30
    while not (marker.exists() and marker.read_text() == text):
        assert time.monotonic() < deadline, f"{marker} never said {text!r}"
        time.sleep(0.01)


@pytest.mark.parametrize("unit", ["steps", "steps_isolated"])
def test_progress_is_in_the_store_while_the_job_runs_and_after_it_ends(
    env: Env, tmp_path: Path, unit: str
) -> None:
    # Given a job that reports 5 of 10 steps, then waits
    env.worker(concurrency=1)
    marker = tmp_path / "marker"
    marker.write_text("")
    handle = env.unit(unit).submit(str(marker), 10)
    _wait_for(marker, "halfway")
    # Then another reader of the store sees it running at 50%
    deadline = time.monotonic() + 10
    while (state := _state(env, handle.id)).progress is None or state.progress.done < 5:
        assert time.monotonic() < deadline, f"no progress in the store: {state}"
        time.sleep(0.02)
    assert state.status is JobStatus.RUNNING
    assert (state.progress.done, state.progress.total, state.progress.note) == (5, 10, "steps")
    assert state.progress.describe() == "50% (5/10) steps"
    # When it goes on to the end, the last record is written before the outcome
    marker.write_text("go")
    assert handle.result(timeout=30) == 10
    done = _state(env, handle.id)
    assert done.status is JobStatus.SUCCEEDED
    assert done.progress is not None
    assert (done.progress.done, done.progress.fraction) == (10, 1.0)


def test_an_async_job_reports_from_its_task(env: Env) -> None:
    env.worker()
    handle = env.unit("async_steps").submit(7)
    assert handle.result(timeout=30) == 7
    progress = _state(env, handle.id).progress
    assert progress is not None
    assert (progress.done, progress.total, progress.note) == (7, 7, "awaits")


def test_a_crashed_child_leaves_how_far_it_got_and_jobs_show_prints_it(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    env.worker()
    handle = env.unit("steps_then_crash").submit(8)
    with pytest.raises(ChildCrashedError) as crashed:
        handle.result(timeout=30)
    assert crashed.value.exitcode == 3
    state = _state(env, handle.id)
    assert state.status is JobStatus.FAILED
    assert state.progress is not None
    assert (state.progress.done, state.progress.total) == (4, 8)
    assert main(["jobs", "show", handle.id, "--url", env.url]) == 0
    shown = capsys.readouterr().out
    assert "50% (4/8) steps" in shown
    assert main(["jobs", "list", "--url", env.url, "--json"]) == 0
    rows = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows[handle.id]["progress"]["done"] == 4


def test_progress_outside_a_job_records_nothing_and_bad_values_name_the_field() -> None:
    assert foundry.progress(1, 2, "rows") is False
    for bad, field in (((-1,), "done"), ((1, 0), "total"), ((float("nan"),), "done"), ((1, 2, 3), "note")):
        with pytest.raises(ValueError, match=f"progress\\({field}="):
            foundry.progress(*bad)  # type: ignore[arg-type]


def test_describe_without_a_total() -> None:
    assert JobProgress(12, None, "rows").describe() == "12 rows"
    assert JobProgress(12, None, "rows").fraction is None
