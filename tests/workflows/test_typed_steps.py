"""Typed payloads through a workflow journal (SQLite and PostgreSQL): the workflow's
arguments, each step's result — on its first run and when a resumed run replays it
from the journal — and the workflow's result keep the types their annotations declare
(``foundry.typed``); a step result rewritten in the journal is refused."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from decimal import Decimal

import pytest

from foundry.backends.journal.base import WorkflowStatus
from foundry.errors import RecordError, SubmitError
from tests.deliver import typed_app
from tests.deliver.typed_app import Crash, Customer, Line, Order, Receipt
from tests.workflows.conftest import Env

MakeEnv = Callable[..., Env]
PLACED = dt.datetime(2024, 10, 27, 1, 30, tzinfo=dt.timezone(dt.timedelta(hours=2)))
TYPES = (Decimal, dt.datetime, Customer, uuid.UUID)


def an_order() -> Order:
    return Order(uuid.uuid4(), PLACED, [Line("a", Decimal("1.25"), 2), Line("b", Decimal("0.005"))])


def expected(order: Order) -> Receipt:
    return Receipt(
        order.id,
        Decimal("2.505"),
        dt.date(2024, 10, 27),
        typed_app.customer_of("ada"),
        (dt.time(3, 30), dt.timedelta(0)),
    )


def test_step_results_keep_their_types_when_run_and_when_replayed(make_env: MakeEnv) -> None:
    env = make_env()
    flow = env.app.workflow()(typed_app.checkout)
    order, run = an_order(), f"run-{uuid.uuid4().hex[:8]}"
    typed_app.SEEN.clear()
    # Given a run that dies in its last step, after three typed steps were journaled
    typed_app.CRASH.append(run)
    with pytest.raises(Crash):
        flow.run(order, run, id=run)
    state = env.journal.get(run)
    assert state is not None
    assert state.status == WorkflowStatus.RUNNING
    # When a worker resumes it (its arguments read back from the journal)
    env.expire_leases()
    assert env.worker().drain() == 1
    # Then the replayed steps gave the workflow the declared types, not their JSON
    assert typed_app.SEEN == [TYPES]
    # and its result, read back from the journal, is the declared Receipt
    receipt = flow.handle(run).result(5)
    assert receipt == expected(order)
    assert type(receipt) is Receipt
    assert type(receipt.customer.seen) is dt.datetime
    # A run that does not crash sees the same types on its first (live) pass
    other = f"run-{uuid.uuid4().hex[:8]}"
    assert flow.run(order, other, id=other) == expected(order)
    assert typed_app.SEEN == [TYPES, TYPES]


def test_a_workflow_argument_of_the_wrong_type_is_refused_at_start(make_env: MakeEnv) -> None:
    env = make_env()
    flow = env.app.workflow()(typed_app.checkout)
    with pytest.raises(
        SubmitError, match=r"unit 'checkout': parameter order is declared Order, and was given dict"
    ):
        flow.run({"id": "x"}, "r", id=f"bad-{uuid.uuid4().hex[:8]}")


def test_a_step_result_rewritten_in_the_journal_is_refused_on_replay(
    make_env: MakeEnv, journal_url: str
) -> None:
    env = make_env()
    flow = env.app.workflow()(typed_app.checkout)
    run = f"run-{uuid.uuid4().hex[:8]}"
    typed_app.CRASH.append(run)
    with pytest.raises(Crash):
        flow.run(an_order(), run, id=run)
    # When someone who can write to the journal rewrites the first step's result (a Decimal)
    _, entries = env.journal.load(run)
    first = entries[0]
    assert first.result is not None
    assert b'"decimal"' in first.result
    forged = b'{"$type":"model","class":"subprocess.Popen","value":{"args":["true"]}}'
    _rewrite_result(journal_url, run, first.position, forged)
    # Then the resumed run refuses it, naming the step and the reason, and builds nothing
    env.expire_leases()
    env.worker().drain()
    with pytest.raises(RecordError, match=r"refused the journal's step .*price.*the unit declares Decimal"):
        flow.handle(run).result(5)


def _rewrite_result(url: str, run: str, position: int, data: bytes) -> None:
    """Overwrite one journal entry's result in the journal's own table (the table whose
    rows have ``workflow_id``, ``pos`` and ``result``)."""
    wanted = {"workflow_id", "pos", "result"}
    if url.startswith("sqlite"):
        import sqlite3

        with sqlite3.connect(url.removeprefix("sqlite:///").split("?", 1)[0]) as conn:
            tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            (table,) = [
                t for t in tables if wanted <= {c[1] for c in conn.execute(f'PRAGMA table_info("{t}")')}
            ]
            sql = f'UPDATE "{table}" SET result = ? WHERE workflow_id = ? AND pos = ?'
            assert conn.execute(sql, (data, run, position)).rowcount == 1
        return
    import psycopg

    base, query = url.split("?", 1)
    schema = dict(p.split("=", 1) for p in query.split("&"))["schema"]
    with psycopg.connect(base, autocommit=True) as conn:
        columns: dict[str, set[str]] = {}
        for table_name, column in conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = %s",
            (schema,),
        ):
            columns.setdefault(table_name, set()).add(column)
        (table,) = [t for t, cols in columns.items() if wanted <= cols]
        sql = f'UPDATE "{schema}"."{table}" SET result = %s WHERE workflow_id = %s AND pos = %s'
        assert conn.execute(sql, (data, run, position)).rowcount == 1
