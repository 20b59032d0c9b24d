"""Code that changes while runs are in flight: wf.patched, and replaying recorded
histories against new code before it is deployed (programmatically and with `foundry
workflows replay`), on every journal engine."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from foundry.backends.journal import ManualClock
from foundry.cli import main
from foundry.deliver.workflow import Worker, WorkflowRuntime, configure
from foundry.deliver.workflow.replay import assert_replays, replay
from foundry.errors import NonDeterminismError
from tests.workflows import _pricing_app as pricing


@pytest.fixture
def recorded(journal_url: str) -> Iterator[WorkflowRuntime]:
    """Two runs recorded on v1: ``done`` finished, ``open`` waiting for its confirmation."""
    pricing.VERSION["v"] = 1
    rt = configure(pricing.app, journal=journal_url, clock=ManualClock(), inline_wait=0.0, poll=0.02)
    worker = Worker(pricing.app, journal=rt.journal, inline_wait=0.0, poll=0.02)
    try:
        pricing.checkout.enqueue("o-1", id="done")
        pricing.checkout.enqueue("o-2", id="open")
        worker.drain()
        pricing.app.signal("done", "confirm", True)
        worker.drain()
        assert pricing.checkout.handle("done").result(5) == {"order": "o-1", "amount": 10}
        yield rt
    finally:
        pricing.VERSION["v"] = 1
        worker.stop(5)
        rt.close(5)


def by_id(reports: list[Any]) -> dict[str, Any]:
    return {r.workflow_id: r for r in reports}


def test_replay_fails_for_code_changed_without_a_patch(recorded: WorkflowRuntime) -> None:
    pricing.VERSION["v"] = 2
    reports = by_id(replay(pricing.app, journal=recorded.journal))
    for workflow_id in ("done", "open"):
        report = reports[workflow_id]
        assert not report.ok
        assert report.position == 0
        assert "'price-v2'" in report.problem
        assert "'price'" in report.problem
    with pytest.raises(NonDeterminismError, match="2 of 2 recorded histories"):
        assert_replays(pricing.app, journal=recorded.journal)


def test_replay_passes_for_code_changed_behind_a_patch_and_old_runs_keep_the_old_path(
    recorded: WorkflowRuntime,
) -> None:
    pricing.VERSION["v"] = 3
    reports = assert_replays(pricing.app, journal=recorded.journal)
    assert {r.workflow_id: (r.ok, r.checked) for r in reports} == {"done": (True, 3), "open": (True, 2)}
    # The run in flight resumes on the new code and keeps the price it started with
    worker = Worker(pricing.app, journal=recorded.journal, inline_wait=0.0, poll=0.02)
    try:
        pricing.app.signal("open", "confirm", True)
        worker.drain()
        assert pricing.checkout.handle("open").result(5) == {"order": "o-2", "amount": 10}
        # A new run takes the new path and records the patch where it decided
        pricing.checkout.enqueue("o-3", id="new")
        worker.drain()
        pricing.app.signal("new", "confirm", True)
        worker.drain()
        assert pricing.checkout.handle("new").result(5) == {"order": "o-3", "amount": 12}
    finally:
        worker.stop(5)
    kinds = [(e.kind, e.name) for e in recorded.journal.load("new")[1]]
    assert kinds[:2] == [("patch", "new-pricing"), ("step", "price-v2")]
    assert all(r.ok for r in replay(pricing.app, journal=recorded.journal))
    # Rolling back to v1 would break the run recorded with the patch, and only that one
    pricing.VERSION["v"] = 1
    verdicts = {r.workflow_id: r.ok for r in replay(pricing.app, journal=recorded.journal)}
    assert verdicts == {"done": True, "open": True, "new": False}


def test_foundry_workflows_replay_reports_the_first_difference_and_exits_1(
    recorded: WorkflowRuntime, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    app = "tests.workflows._pricing_app:app"
    url = recorded.journal.url
    pricing.VERSION["v"] = 2
    assert main(["workflows", "replay", app, "--journal", url, "--json"]) == 1
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["done"]["position"] == 0
    assert not rows["done"]["ok"]
    # Histories exported from production replay the same way, without its database
    assert main(["workflows", "export", "done", "open", "--journal", url]) == 0
    exported = tmp_path / "histories.json"
    exported.write_text(capsys.readouterr().out)
    assert main(["workflows", "replay", app, "--from", str(exported)]) == 1
    out = capsys.readouterr()
    assert "diverges" in out.out
    assert "2 of 2 histories diverge" in out.err
    pricing.VERSION["v"] = 3
    assert main(["workflows", "replay", app, "--from", str(exported)]) == 0
    assert main(["workflows", "replay", app, "--journal", url, "--id", "open"]) == 0
    capsys.readouterr()


def test_patched_is_asked_once_per_run_and_deprecate_patch_steps_over_its_marker(
    make_env: Callable[..., Any],
) -> None:
    env = make_env()
    stage = {"code": "patched"}

    @env.app.workflow()
    def flow(wf: Any) -> list[Any]:
        if stage["code"] == "patched":
            first = wf.patched("p")
            again = wf.patched("p")  # remembered: no second marker
        else:
            wf.deprecate_patch("p")
            first = again = True
        return [first, again, wf.step(lambda: 1, name="s")]

    assert flow.run(id="a") == [True, True, 1]
    assert [e.kind for e in env.journal.load("a")[1]] == ["patch", "step"]
    stage["code"] = "deprecated"
    assert all(r.ok for r in replay(env.app, journal=env.journal))
    assert flow.run(id="b") == [True, True, 1]
    assert [e.kind for e in env.journal.load("b")[1]] == ["step"]
