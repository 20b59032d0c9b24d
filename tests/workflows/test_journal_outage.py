"""A journal that goes away for a moment (a database restart) is an outage, not a
workflow's failure: a transactional step whose journal connection the server drops is
run again, not recorded as failed, and a caller waiting on a handle keeps waiting.
(The whole restart, end to end: ``tests/faults/test_workflow_pg_restart.py``.)"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from foundry.backends.journal.base import WorkflowStatus
from foundry.deliver.workflow import WorkflowContext
from foundry.errors import BackendUnavailableError, ResultTimeoutError
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
