"""Child workflows as runs of their own: started, awaited (the parent parks, freeing its
worker), cancelled with the parent, on every journal engine."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from foundry.backends.journal.base import WorkflowStatus
from foundry.deliver.workflow import WorkflowContext
from foundry.errors import CancelledError, WorkflowTimeoutError
from tests.workflows.conftest import Env

MakeEnv = Callable[..., Env]


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def status(env: Env, workflow_id: str) -> str:
    state = env.journal.get(workflow_id)
    assert state is not None
    return state.status.value


def test_a_child_is_a_run_of_its_own_and_its_parent_waits_parked(make_env: MakeEnv) -> None:
    env = make_env(inline_wait=0.0)

    @env.app.workflow()
    def child(wf: WorkflowContext, name: str) -> str:
        approval = wf.wait_for("go")
        return f"{name} approved by {approval}"

    @env.app.workflow()
    def parent(wf: WorkflowContext) -> str:
        return str(wf.child(child, "c1"))

    handle = parent.enqueue(id="p")
    worker = env.worker()
    worker.drain()
    # The parent started its child as a separate workflow and parked: no thread holds it
    wait_until(lambda: status(env, "p/0") == "waiting")
    assert status(env, "p") == "waiting"
    kid = env.journal.get("p/0")
    assert kid is not None
    assert (kid.parent_id, kid.parent_position, kid.claims) == ("p", 0, 1)
    # When the child gets its signal and finishes, its end wakes the parent
    env.app.signal("p/0", "go", "ann")
    wait_until(lambda: worker.drain() >= 0 and status(env, "p/0") == "succeeded")
    assert handle.result(10) == "c1 approved by ann"
    _, entries = env.journal.load("p")
    assert [(e.kind, e.status, e.detail) for e in entries] == [("child", "ok", "p/0")]


def test_cancelling_the_parent_cancels_its_children_and_each_compensates_itself(make_env: MakeEnv) -> None:
    env = make_env(inline_wait=0.0)
    done: list[str] = []

    def act(name: str) -> str:
        done.append(name)
        return name

    def undo(result: str) -> None:
        done.append(f"undo {result}")

    @env.app.workflow()
    def child(wf: WorkflowContext, name: str) -> None:
        wf.step(act, name, undo=undo)
        wf.wait_for("never")

    @env.app.workflow()
    def parent(wf: WorkflowContext) -> list[Any]:
        wf.step(act, "parent", undo=undo)
        return wf.gather(wf.child_branch(child, "c1"), wf.child_branch(child, "c2"))

    handle = parent.enqueue(id="pc")
    worker = env.worker()
    worker.drain()
    wait_until(lambda: status(env, "pc/2") == "waiting" and status(env, "pc/3") == "waiting")
    assert handle.cancel()
    wait_until(lambda: worker.drain() >= 0 and status(env, "pc") == "cancelled")
    with pytest.raises(CancelledError):
        handle.result(5)
    wait_until(lambda: worker.drain() >= 0 and {status(env, "pc/2"), status(env, "pc/3")} == {"cancelled"})
    assert sorted(done) == sorted(["parent", "c1", "c2", "undo c1", "undo c2", "undo parent"])


def test_a_parent_that_fails_leaves_no_child_running(make_env: MakeEnv) -> None:
    env = make_env(inline_wait=0.0)

    def fail() -> None:
        raise RuntimeError("parent step failed")

    @env.app.workflow()
    def child(wf: WorkflowContext) -> None:
        wf.wait_for("never")

    @env.app.workflow()
    def parent(wf: WorkflowContext) -> None:
        wf.gather(wf.child_branch(child), wf.branch(fail))

    with pytest.raises(RuntimeError, match="parent step failed"):
        parent.run(id="pf", timeout=10)
    wait_until(lambda: env.worker().drain() >= 0 and status(env, "pf/1") == "cancelled")


def test_a_parent_that_times_out_waiting_cancels_its_child(make_env: MakeEnv) -> None:
    env = make_env(inline_wait=0.0)

    @env.app.workflow()
    def child(wf: WorkflowContext) -> None:
        wf.wait_for("never")

    @env.app.workflow(timeout="5m")
    def parent(wf: WorkflowContext) -> None:
        wf.child(child)

    handle = parent.enqueue(id="pt")
    worker = env.worker()
    worker.drain()
    wait_until(lambda: status(env, "pt/0") == "waiting")
    state = env.journal.get("pt")
    assert state is not None
    assert state.wake_at == pytest.approx(state.created_at + 300)  # parked until its deadline
    env.clock.advance(300)
    worker.drain()
    with pytest.raises(WorkflowTimeoutError):
        handle.result(5)
    assert status(env, "pt") == WorkflowStatus.TIMED_OUT.value
    wait_until(lambda: worker.drain() >= 0 and status(env, "pt/0") == "cancelled")


def test_a_child_started_by_an_embedded_run_runs_here_and_resumes_its_parent(make_env: MakeEnv) -> None:
    env = make_env()

    @env.app.workflow()
    def child(wf: WorkflowContext, n: int) -> int:
        return int(wf.step(lambda: n * 2, name="double"))

    @env.app.workflow()
    def parent(wf: WorkflowContext) -> list[Any]:
        first = wf.child(child, 1)
        return [first, *wf.gather(wf.child_branch(child, 2), wf.child_branch(child, 3, id="named"))]

    assert parent.run(id="emb", timeout=10) == [2, 4, 6]
    kids = {w.id for w in env.journal.workflows(parent_id="emb")}
    assert kids == {"emb/0", "emb/2", "named"}
