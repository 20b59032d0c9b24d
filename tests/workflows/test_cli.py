"""`foundry workflows list|show|cancel|signal` on a journal, and the demo section."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from foundry.backends.journal import ManualClock
from foundry.cli import main
from foundry.deliver.workflow import WorkflowContext
from tests.workflows.conftest import Env


@pytest.fixture
def env(tmp_path: Path) -> Any:
    e = Env(f"sqlite:///{tmp_path / 'cli.db'}", ManualClock(), inline_wait=0.0)

    def act(name: str) -> str:
        return name

    def fail() -> None:
        raise RuntimeError("deploy failed")

    @e.app.workflow()
    def flow(wf: WorkflowContext, broken: bool) -> Any:
        wf.step(act, "compute", undo=lambda r: None, name="compute")
        if broken:
            wf.step(fail)
        return wf.wait_for("approve", timeout="1h", default="auto")

    flow.enqueue(False, id="waits")
    with pytest.raises(RuntimeError):
        flow.run(True, id="broke")
    e.worker().drain()
    yield e
    e.close()


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["workflows", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_list_shows_every_workflow(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "list", "--journal", env.journal.url)
    assert code == 0
    assert "waits" in out
    assert "broke" in out
    assert "failed" in out
    code, out, _ = cli(capsys, "list", "--journal", env.journal.url, "--status", "waiting", "--json")
    rows = json.loads(out)
    assert [(r["id"], r["current_step"]) for r in rows] == [("waits", "signal approve")]


def test_show_prints_history_attempts_timings_and_compensation(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli(capsys, "show", "broke", "--journal", env.journal.url)
    assert code == 0
    for text in ("compute", "undo", "undoes #0", "RuntimeError: deploy failed", "compensation", "done"):
        assert text in out
    code, out, _ = cli(capsys, "show", "broke", "--journal", env.journal.url, "--json")
    record = json.loads(out)
    assert record["compensation"] == "done"
    assert [h["kind"] for h in record["history"]] == ["step", "step", "undo"]
    assert record["history"][1]["error"]["message"] == "deploy failed"
    code, _, err = cli(capsys, "show", "nope", "--journal", env.journal.url)
    assert code == 1
    assert "no workflow with id 'nope'" in err


def test_signal_and_cancel(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    url = env.journal.url
    code, out, _ = cli(capsys, "signal", "waits", "approve", '{"by": "ann"}', "--journal", url)
    assert code == 0
    assert "delivered" in out
    code, _, err = cli(capsys, "signal", "waits", "approve", "{oops", "--journal", url)
    assert code == 1
    assert "not JSON" in err
    code, _, err = cli(capsys, "signal", "broke", "approve", "1", "--journal", url)
    assert code == 1
    assert "already finished" in err
    env.worker().drain()
    handle = env.rt.handle("waits")
    assert handle.result(5) == {"by": "ann"}
    code, _, err = cli(capsys, "cancel", "waits", "--journal", url)
    assert code == 1
    assert "already finished" in err


def test_cancel_from_the_command_line_compensates(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "cancel", "waits", "--journal", env.journal.url)
    assert code == 0
    assert "cancellation of waits requested" in out
    env.worker().drain()
    state = env.journal.get("waits")
    assert state is not None
    assert state.status == "cancelled"
    assert state.compensation == "done"


def test_worker_needs_an_app(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = cli(capsys, "worker", "no_such_module_xyz", "--journal", f"sqlite:///{tmp_path / 'j.db'}")
    assert code == 1
    assert "no module named 'no_such_module_xyz'" in err


def test_the_demo_section_compensates_in_reverse_order(home: Path) -> None:
    from foundry.demos import workflow

    out = io.StringIO()
    workflow.run(Console(file=out, width=160))
    text = out.getvalue()
    assert "✓ provision-web-1" in text
    assert "DeployError" in text
    assert "detach_ip then delete_vm" in text
    assert "undoes #2" in text
    assert "undoes #1" in text


def test_purge_deletes_only_old_finished_workflows(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    url = env.journal.url
    code, out, _ = cli(capsys, "purge", "--older-than", "36500d", "--journal", url)
    assert code == 0
    assert "purged 0" in out
    code, out, _ = cli(capsys, "purge", "--older-than", "0s", "--journal", url)
    assert "purged 1" in out  # "broke" finished; "waits" is still waiting
    assert env.journal.get("broke") is None
    assert env.journal.get("waits") is not None
    code, _, err = cli(capsys, "purge", "--older-than", "soon", "--journal", url)
    assert code == 1
    assert "--older-than" in err


def test_show_draws_the_children_as_a_tree_and_list_shows_timed_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    e = Env(f"sqlite:///{tmp_path / 'tree.db'}", ManualClock(), inline_wait=0.0)
    try:

        @e.app.workflow()
        def leaf(wf: WorkflowContext) -> None:
            wf.wait_for("go")

        @e.app.workflow()
        def middle(wf: WorkflowContext) -> None:
            wf.child(leaf)

        @e.app.workflow(timeout="1m")
        def root(wf: WorkflowContext) -> None:
            wf.gather(wf.child_branch(middle), wf.child_branch(leaf, id="side"))

        root.enqueue(id="r")
        worker = e.worker()
        for _ in range(200):
            worker.drain()
            if (s := e.journal.get("r/1/0")) is not None and s.status.value == "waiting":
                break
            time.sleep(0.01)
        code, out, _ = cli(capsys, "show", "r", "--journal", e.journal.url)
        assert code == 0
        for text in ("r/1", "r/1/0", "side", "middle", "leaf", "deadline", "fan-out of 2 branches"):
            assert text in out
        code, out, _ = cli(capsys, "show", "r", "--journal", e.journal.url, "--json")
        tree = json.loads(out)["tree"]
        assert [(n["id"], [c["id"] for c in n["children"]]) for n in tree] == [
            ("r/1", ["r/1/0"]),
            ("side", []),
        ]
        e.clock.advance(60)
        worker.drain()
        code, out, _ = cli(capsys, "list", "--journal", e.journal.url, "--status", "timed_out", "--json")
        assert [r["id"] for r in json.loads(out)] == ["r"]
    finally:
        e.close()
