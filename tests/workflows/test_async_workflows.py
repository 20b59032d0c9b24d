"""`async def` workflows on the same journal (steps, waits, children, replay after a
crash), and `await handle` woken by the journal's notifications instead of a poll."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from foundry.backends.journal import open_journal
from foundry.deliver.workflow import AsyncWorkflowContext, Worker
from foundry.errors import SubmitError
from tests.workflows.conftest import Crash, Env

MakeEnv = Callable[..., Env]


def test_an_async_workflow_awaits_steps_waits_and_children_and_replays_after_a_crash(
    make_env: MakeEnv,
) -> None:
    env = make_env(inline_wait=0.0)
    calls: Counter[str] = Counter()

    async def fetch(n: int) -> int:
        calls["fetch"] += 1
        await asyncio.sleep(0)
        return n + 1

    def store(n: int) -> int:
        calls["store"] += 1
        if calls["store"] == 1:
            raise Crash("the process died in a sync step of an async workflow")
        return n * 10

    @env.app.workflow()
    async def child(wf: AsyncWorkflowContext, n: int) -> int:
        return int(await wf.step(fetch, n))

    @env.app.workflow()
    async def flow(wf: AsyncWorkflowContext, n: int) -> dict[str, Any]:
        first = await wf.step(fetch, n)
        stored = await wf.step(store, first)
        await wf.sleep("1h")
        approval = await wf.wait_for("approve")
        kid = await wf.child(child, stored)
        return {"first": first, "stored": stored, "approval": approval, "child": kid, "at": await wf.now()}

    with pytest.raises(Crash):
        flow.run(1, id="a")
    env.expire_leases()
    handle = flow.handle("a")
    worker = env.worker()
    worker.drain()  # resumes: fetch replayed, store runs again, then parks in its sleep
    assert calls == {"fetch": 1, "store": 2}
    env.clock.advance(3600)
    env.app.signal("a", "approve", "ann")
    for _ in range(50):  # parked on its sleep, its signal, then its child
        worker.drain()
        if handle.done():
            break
        threading.Event().wait(0.02)
    result = handle.result(10)
    assert result["first"] == 2
    assert result["stored"] == 20
    assert result["approval"] == "ann"
    assert result["child"] == 21
    kinds = [e.kind for e in env.journal.load("a")[1]]
    assert kinds == ["step", "step", "sleep", "signal", "child", "step"]


def test_an_async_workflow_may_not_run_durable_calls_side_by_side_itself(make_env: MakeEnv) -> None:
    env = make_env()

    async def one() -> int:
        await asyncio.sleep(0.01)
        return 1

    @env.app.workflow()
    async def flow(wf: AsyncWorkflowContext) -> list[Any]:
        return list(await asyncio.gather(wf.step(one, name="a"), wf.step(one, name="b")))

    with pytest.raises(SubmitError, match=r"one at a time.*wf\.gather"):
        flow.run(id="racy")


def test_await_handle_is_woken_by_the_journal_not_a_poll(make_env: MakeEnv, journal_url: str) -> None:
    env = make_env()
    gate = threading.Event()

    def slow() -> str:
        gate.wait(10)
        return "done"

    @env.app.workflow()
    def flow(wf: Any) -> str:
        return str(wf.step(slow))

    handle = flow.enqueue(id="awaited")
    looks = Counter[str]()
    real_get = env.journal.get

    def counted(workflow_id: str) -> Any:
        looks[workflow_id] += 1
        return real_get(workflow_id)

    env.journal.get = counted  # type: ignore[method-assign]
    # A worker on a journal of its own, as another process would have: its finish reaches
    # this one only through the engine's notification (SQLite's doorbell, PostgreSQL's NOTIFY)
    other = open_journal(journal_url, clock=env.clock)
    worker = Worker(env.app, journal=other, poll=0.02, lease=env.rt.lease)
    worker.start()
    try:

        async def wait() -> Any:
            waiter = asyncio.ensure_future(handle.aresult(20))
            await asyncio.sleep(0.3)  # a 100 ms poll would look three times or more meanwhile
            gate.set()
            return await waiter

        assert asyncio.run(wait()) == "done"
    finally:
        gate.set()
        worker.stop(5)
        other.close()
    assert env.journal.changes.cross_process
    # one look, one more when PostgreSQL's listener first connects, one when the finish's
    # notification arrives, one to read the outcome — a poll backing off to 100 ms would
    # have looked about nine times in the 0.3 s
    assert looks["awaited"] <= 4
