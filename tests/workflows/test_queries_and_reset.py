"""Queries (a workflow's published state, read from outside without changing it) and
reset (a finished run restarted from a completed step, keeping the steps before it), on
every journal engine, from code and from the CLI."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from foundry.backends.journal.base import WorkflowStatus
from foundry.cli import main
from foundry.deliver.workflow import WorkflowContext
from foundry.errors import SubmitError
from tests.workflows.conftest import Crash, Env

MakeEnv = Callable[..., Env]


def test_a_query_reads_the_published_state_and_changes_nothing(make_env: MakeEnv) -> None:
    env = make_env(inline_wait=0.0)
    gate = threading.Event()
    entered = threading.Event()

    def load(name: str) -> str:
        if name == "b":
            entered.set()
            gate.wait(10)
        return name

    @env.app.workflow()
    def ingest(wf: WorkflowContext, files: list[str]) -> int:
        for i, name in enumerate(files):
            wf.step(load, name)
            wf.publish(done=i + 1, total=len(files), last=name)
        wf.wait_for("close")
        return len(files)

    handle = ingest.start(["a", "b", "c"], id="ing")
    assert entered.wait(10)
    # While a step runs: the state published so far, and nothing in the journal moved
    before = env.journal.get("ing")
    assert ingest.query("ing") == {"done": 1, "total": 3, "last": "a"}
    assert env.journal.get("ing") == before
    gate.set()
    for _ in range(500):
        if env.journal.get("ing").status == WorkflowStatus.WAITING:  # type: ignore[union-attr]
            break
        threading.Event().wait(0.01)
    # While it is parked: the last state, from any process, and it stays parked
    assert env.rt.query("ing") == {"done": 3, "total": 3, "last": "c"}
    parked = env.journal.get("ing")
    assert parked is not None
    assert parked.status == WorkflowStatus.WAITING
    assert parked.wakeups == before.wakeups  # type: ignore[union-attr]
    env.app.signal("ing", "close", None)
    assert handle.result(10) == 3


def test_a_replayed_run_does_not_publish_older_state_again(make_env: MakeEnv) -> None:
    env = make_env()
    writes: list[Any] = []
    calls = Counter[str]()

    def step(n: int) -> int:
        calls[str(n)] += 1
        if n == 2 and calls[str(n)] == 1:
            raise Crash("died")
        return n

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> None:
        for n in range(3):
            wf.step(step, n)
            wf.publish(n=n)

    real = env.journal.publish

    def counted(workflow_id: str, token: int, state: bytes) -> None:
        writes.append(json.loads(state))
        real(workflow_id, token, state)

    env.journal.publish = counted  # type: ignore[method-assign]
    with pytest.raises(Crash):
        flow.run(id="re")
    env.expire_leases()
    env.worker().drain()
    assert writes == [{"n": 0}, {"n": 1}, {"n": 2}]  # the replay of n=0, n=1 wrote nothing
    assert env.rt.query("re") == {"n": 2}


def test_query_of_an_unknown_workflow_and_unpublishable_state(make_env: MakeEnv) -> None:
    env = make_env()

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> None:
        wf.publish(conn=object())

    from foundry.errors import NotFoundError

    with pytest.raises(NotFoundError, match="no workflow with id 'nope'"):
        env.rt.query("nope")
    with pytest.raises(SubmitError, match="published state"):
        flow.run(id="bad")


def test_reset_restarts_a_failed_run_from_a_named_step_keeping_the_steps_before(make_env: MakeEnv) -> None:
    env = make_env()
    calls: Counter[str] = Counter()
    fixed = {"deploy": False}

    def act(name: str) -> str:
        calls[name] += 1
        if name == "deploy" and not fixed["deploy"]:
            raise RuntimeError("deploy failed")
        return f"{name}-{calls[name]}"

    @env.app.workflow()
    def provision(wf: WorkflowContext) -> list[str]:
        return [wf.step(act, name, name=name) for name in ("compute", "network", "configure", "deploy")]

    with pytest.raises(RuntimeError, match="deploy failed"):
        provision.run(id="web-1")
    fixed["deploy"] = True  # the bug is fixed and deployed
    handle = provision.reset("web-1", step="configure", id="web-1b")
    assert handle.result(10) == ["compute-1", "network-1", "configure-2", "deploy-2"]
    assert calls == {"compute": 1, "network": 1, "configure": 2, "deploy": 2}
    old, new = env.journal.get("web-1"), env.journal.get("web-1b")
    assert old is not None
    assert new is not None
    assert old.status == WorkflowStatus.FAILED  # the old run is left as it was
    assert new.origin == "reset of web-1 from position 2 (step 'configure')"


def test_reset_refuses_what_it_cannot_restart(make_env: MakeEnv) -> None:
    env = make_env(inline_wait=0.0)

    @env.app.workflow()
    def flow(wf: WorkflowContext, fail: bool) -> None:
        wf.step(lambda: 1, name="a")
        wf.step(lambda: 1, name="a")
        wf.gather(wf.branch(lambda: 2, name="b"))
        if fail:
            raise RuntimeError("no")
        wf.wait_for("go")

    flow.enqueue(False, id="open")
    env.worker().drain()
    with pytest.raises(RuntimeError):
        flow.run(True, id="done")
    with pytest.raises(SubmitError, match="still waiting"):
        env.rt.reset("open", step="a")
    with pytest.raises(SubmitError, match="no completed step named 'zz'"):
        env.rt.reset("done", step="zz")
    with pytest.raises(SubmitError, match="completed 2 times"):
        env.rt.reset("done", step="a")
    with pytest.raises(SubmitError, match="branch of the fan-out at position 2"):
        env.rt.reset("done", position=3)
    with pytest.raises(SubmitError, match="is taken"):
        env.rt.reset("done", position=1, new_id="open")


def test_foundry_workflows_reset_and_query(make_env: MakeEnv, capsys: pytest.CaptureFixture[str]) -> None:
    env = make_env()

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> None:
        wf.step(lambda: 1, name="one")
        wf.publish(stage="one done")
        raise RuntimeError("then it failed")

    with pytest.raises(RuntimeError):
        flow.run(id="cli")
    url = env.journal.url
    assert main(["workflows", "query", "cli", "--journal", url]) == 0
    assert json.loads(capsys.readouterr().out) == {"stage": "one done"}
    assert main(["workflows", "reset", "cli", "--step", "one", "--new-id", "cli-2", "--journal", url]) == 0
    assert "reset of cli from position 0" in capsys.readouterr().out
    state = env.journal.get("cli-2")
    assert state is not None
    assert state.status == WorkflowStatus.PENDING  # a worker running the app runs it
    assert main(["workflows", "reset", "cli", "--step", "nope", "--journal", url]) == 1
    assert "no completed step named 'nope'" in capsys.readouterr().err
