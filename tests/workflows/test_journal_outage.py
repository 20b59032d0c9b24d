"""A journal that goes away for a moment (a database restart) is an outage, not a
workflow's failure: a transactional step whose journal connection the server drops is
run again, not recorded as failed, and a caller waiting on a handle keeps waiting.
(The whole restart, end to end: ``tests/faults/test_workflow_pg_restart.py``.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from foundry.backends.journal.base import WorkflowStatus
from foundry.deliver.workflow import WorkflowContext
from foundry.errors import BackendUnavailableError, ResultTimeoutError
from foundry.handle import Handle
from tests.services import URLS
from tests.workflows.conftest import Env

MakeEnv = Callable[..., Env]


@pytest.mark.parametrize("engine", ["postgres"])
def test_a_transactional_step_whose_connection_the_server_drops_runs_again(make_env: MakeEnv) -> None:
    import psycopg

    env = make_env()
    table = f"ledger_{time.time_ns()}"
    with env.journal._auto() as c:  # type: ignore[attr-defined]
        c.conn.execute(f"CREATE TABLE {table} (wf TEXT NOT NULL)")
    attempts: list[int] = []

    def charge(tx: Any, wf_id: str) -> int:
        attempts.append(1)
        if len(attempts) == 1:  # the server ends this session, as a restart does
            pid = tx.execute("SELECT pg_backend_pid()")[0][0]
            with psycopg.connect(URLS["postgres"], autocommit=True) as admin:
                assert admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone() == (True,)
        tx.execute(f"INSERT INTO {table} (wf) VALUES (?)", (wf_id,))
        return len(attempts)

    @env.app.workflow()
    def pay(wf: WorkflowContext) -> int:
        return int(wf.step(charge, wf.id, transactional=True))

    # the driver's "connection lost" is the journal's outage: retried, not the step's error
    assert pay.run(id="pay-1") == 2
    state = env.journal.get("pay-1")
    assert state is not None
    assert state.status is WorkflowStatus.SUCCEEDED
    with env.journal._auto() as c:  # type: ignore[attr-defined]
        assert c.all(f"SELECT wf FROM {table}") == [("pay-1",)]  # the dropped attempt left nothing


def test_a_handle_waits_through_a_journal_outage(make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_env()

    @env.app.workflow()
    def noop(wf: WorkflowContext) -> str:
        return "done"

    handle = noop.enqueue(id="n-1")
    real_get = env.journal.get
    outage = iter(range(3))

    def flaky_get(workflow_id: str) -> Any:
        if next(outage, None) is not None:
            raise BackendUnavailableError("journal: PostgreSQL is unreachable (restart)")
        return real_get(workflow_id)

    monkeypatch.setattr(env.journal, "get", flaky_get)
    env.worker().drain()
    # three failed reads, then the answer: the wait rides them out within its timeout
    assert handle.result(timeout=10) == "done"
    assert next(outage, None) is None

    def down(workflow_id: str) -> Any:
        raise BackendUnavailableError("journal: PostgreSQL is unreachable (restart)")

    monkeypatch.setattr(env.journal, "get", down)
    other = noop.enqueue(id="n-2")
    started = time.monotonic()
    with pytest.raises(ResultTimeoutError):  # an outage that outlasts the timeout is a timeout
        other.exception(timeout=0.3)
    assert time.monotonic() - started < 5


def test_a_timeout_during_a_journal_outage_is_a_timeout_not_the_database_error(
    make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = make_env()

    @env.app.workflow()
    def noop(wf: WorkflowContext) -> str:
        return "done"

    handle = noop.enqueue(id="t-1")  # no worker: it stays pending

    def down(workflow_id: str) -> Any:
        raise BackendUnavailableError("journal: PostgreSQL is unreachable (restart)")

    monkeypatch.setattr(env.journal, "get", down)
    # result(timeout) and aresult(timeout) raise the timeout; its message cannot read the
    # status (the journal is down) and says so instead of raising the journal's error
    with pytest.raises(
        ResultTimeoutError, match=r"t-1 within 0.2s \(status unknown: BackendUnavailableError"
    ):
        handle.result(timeout=0.2)
    with pytest.raises(ResultTimeoutError, match="status unknown"):
        asyncio.run(handle.aresult(timeout=0.2))
    # with the journal back, the message carries the status again
    monkeypatch.undo()
    with pytest.raises(ResultTimeoutError, match=r"\(status queued\)"):
        handle.result(timeout=0.05)


def finished(env: Env, workflow_id: str) -> Handle:
    """A workflow that ran to ``"done"``, and a handle on it as another process would hold
    it (it reads the journal)."""

    @env.app.workflow()
    def noop(wf: WorkflowContext) -> str:
        return "done"

    noop.enqueue(id=workflow_id)
    env.worker().drain()
    return noop.handle(workflow_id)


def journal_down(env: Env, monkeypatch: pytest.MonkeyPatch, down: Callable[[int], bool]) -> list[int]:
    """Make the journal's n-th ``get`` (from 1) fail as a restart does when ``down(n)``;
    the list counts the calls."""
    real_get = env.journal.get
    calls: list[int] = []

    def get(workflow_id: str) -> Any:
        calls.append(1)
        if down(len(calls)):
            raise BackendUnavailableError("journal: PostgreSQL is unreachable (restart)")
        return real_get(workflow_id)

    monkeypatch.setattr(env.journal, "get", get)
    return calls


def test_reading_the_outcome_rides_out_a_brief_journal_outage(
    make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = make_env()
    handle = finished(env, "o-1")
    # the wait sees it finished (call 1); then the journal restarts for three reads
    calls = journal_down(env, monkeypatch, lambda n: 2 <= n <= 4)
    assert handle.result(timeout=10) == "done"
    assert len(calls) == 5  # the wait's look, three failed reads, the outcome


def test_reading_the_outcome_gives_up_after_a_bounded_outage(
    make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = make_env(journal_retries=3)
    handle = finished(env, "o-2")
    calls = journal_down(env, monkeypatch, lambda n: n > 1)  # down for good after the wait's look
    started = time.monotonic()
    with pytest.raises(BackendUnavailableError):  # an outage longer than the retries is told
        handle.result(timeout=10)
    assert len(calls) == 1 + 3
    assert time.monotonic() - started < 5
