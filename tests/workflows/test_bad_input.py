"""Bad input gets a clear error naming the workflow, the field or step, and the fix —
and the journal is left intact (nothing accepted is lost or rewritten)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from foundry import Foundry
from foundry.backends.journal import open_journal
from foundry.backends.journal.base import WorkflowStatus
from foundry.deliver.workflow import WorkflowContext
from foundry.errors import (
    ConfigError,
    DeclarationError,
    NotFoundError,
    SubmitError,
    WorkflowFinishedError,
)
from foundry.handle import Status
from tests.workflows.conftest import Env

MakeEnv = Callable[..., Env]


def test_a_worker_leaves_workflows_it_does_not_know_untouched(make_env: MakeEnv) -> None:
    producer = make_env()

    @producer.app.workflow()
    def ghost(wf: WorkflowContext) -> None:
        return None

    handle = ghost.enqueue(id="ghost-1")
    # A worker whose app declares other workflows (an older deploy, another team's app)
    consumer = make_env()

    @consumer.app.workflow()
    def real(wf: WorkflowContext) -> None:
        return None

    worker = consumer.worker(journal=producer.journal)
    assert worker.drain() == 0
    state = producer.journal.get("ghost-1")
    assert state is not None
    assert state.status == WorkflowStatus.PENDING
    assert handle.status == Status.QUEUED
    # ... and says why when it is asked to run one
    with pytest.raises(NotFoundError, match="no workflow named 'ghost' is declared"):
        worker.runtime.spec("ghost")
    assert producer.worker().drain() == 1
    assert handle.result(5) is None


def test_a_workflow_name_that_is_not_declared(make_env: MakeEnv) -> None:
    env = make_env()

    @env.app.workflow()
    def parent(wf: WorkflowContext) -> Any:
        return wf.child("missing_child")

    with pytest.raises(NotFoundError, match=r"'missing_child'.*Fix:"):
        parent.run(id="p")
    state = env.journal.get("p")
    assert state is not None
    assert state.status == WorkflowStatus.FAILED
    with pytest.raises(NotFoundError, match="no unit named 'nope'"):
        env.app.get("nope")


def test_an_unserializable_step_result_fails_the_step_clearly(make_env: MakeEnv) -> None:
    env = make_env()
    undone: list[str] = []

    def reserve() -> str:
        return "seat-1"

    def connect() -> object:
        return object()  # a live object cannot be journaled

    @env.app.workflow()
    def book(wf: WorkflowContext) -> None:
        wf.step(reserve, undo=undone.append)
        wf.step(connect)

    with pytest.raises(SubmitError) as info:
        book.run(id="b")
    message = str(info.value)
    assert "connect'" in message
    assert "position 1" in message
    assert "not JSON-compatible" in message
    assert "Fix:" in message
    state, entries = env.journal.load("b")
    assert state.status == WorkflowStatus.FAILED
    assert undone == ["seat-1"]
    assert [(e.position, e.status) for e in entries] == [(0, "ok"), (1, "error"), (2, "ok")]
    assert entries[1].attempts == 1  # a bug, not a transient failure: not retried

    # The journal still serves other workflows
    @env.app.workflow()
    def fine(wf: WorkflowContext) -> int:
        return int(wf.step(lambda: 1, name="one"))

    assert fine.run() == 1


def test_an_unserializable_workflow_result_compensates(make_env: MakeEnv) -> None:
    env = make_env()
    undone: list[str] = []

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> object:
        wf.step(lambda: "a", name="a", undo=undone.append)
        return {1, 2}

    with pytest.raises(SubmitError, match="workflow's result"):
        flow.run(id="r")
    assert undone == ["a"]
    state = env.journal.get("r")
    assert state is not None
    assert state.compensation == "done"


def test_unserializable_arguments_are_refused_before_anything_is_written(make_env: MakeEnv) -> None:
    env = make_env()

    @env.app.workflow()
    def flow(wf: WorkflowContext, conn: Any) -> None:
        return None

    for call in (flow.start, flow.enqueue, flow.run):
        with pytest.raises(SubmitError, match="arguments are not JSON-compatible"):
            call(object(), id="x")
    assert env.journal.workflows() == []


def test_a_signal_to_a_finished_workflow_is_refused(make_env: MakeEnv) -> None:
    env = make_env()

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> int:
        return int(wf.step(lambda: 5, name="five"))

    assert flow.run(id="done") == 5
    before = env.journal.load("done")
    with pytest.raises(WorkflowFinishedError, match=r"already finished.*Fix:"):
        env.app.signal("done", "approve", True)
    assert env.journal.load("done") == before
    assert env.journal.signals("done") == []
    with pytest.raises(NotFoundError, match="no workflow with id 'nobody'"):
        env.app.signal("nobody", "approve", True)
    with pytest.raises(SubmitError, match="payload of signal 'approve'"):
        env.app.signal("done", "approve", object())


def test_bad_declarations_fail_at_declaration_time() -> None:
    app = Foundry("decl")

    async def coroutine(wf: WorkflowContext) -> None:
        return None

    def no_context() -> None:
        return None

    assert app.workflow(coroutine).spec.is_async  # async def workflows are declared as such
    with pytest.raises(DeclarationError, match="first argument is the wf context"):
        app.workflow(no_context)
    with pytest.raises(DeclarationError, match="model"):
        app.workflow(lambda wf: None, name="forced", model="queue")


def test_a_transactional_step_cannot_have_a_timeout(make_env: MakeEnv) -> None:
    env = make_env()

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> None:
        wf.step(lambda tx: None, name="tx", transactional=True, timeout=1)

    with pytest.raises(SubmitError, match="statement timeout"):
        flow.run()


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("mysql://db/x", "scheme"),
        ("sqlite://", "names no file"),
        ("sqlite:///x.db?synchronous=sometimes", "synchronous"),
        ("sqlite:///x.db?prefix=1bad", "prefix"),
        ("sqlite:///x.db?pool=0", "pool"),
    ],
)
def test_bad_journal_urls(url: str, match: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=match):
        open_journal(url)
