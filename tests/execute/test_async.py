"""``async``: permits, which loop runs the work, structured scopes, timeouts, and the
blocking-wait-on-the-loop error."""

from __future__ import annotations

import asyncio
import threading

import pytest

from foundry import Foundry
from foundry.errors import CancelledError, OverloadError, PoolDeadlockError, WorkTimeoutError
from foundry.execute import scope
from foundry.handle import Status
from foundry.observe import names
from tests.execute import workloads


def test_permits_bound_concurrency_across_every_path(app: Foundry) -> None:
    running = 0
    peak = 0

    @app.work(model="async", concurrency=3, max_pending=100)
    async def tracked(x: int) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.002)
        running -= 1
        return x

    async def main() -> list[int]:
        inline = [tracked(i) for i in range(20)]  # runs in the callers' tasks, under permits
        handles = [await tracked.asubmit(i) for i in range(20)]
        return list(await asyncio.gather(*inline)) + [await h for h in handles]

    assert asyncio.run(main()) == list(range(20)) * 2
    assert peak == 3
    assert app.metrics.value(names.UNIT_COMPLETED, unit="tracked") == 40
    assert app.metrics.value(names.UNIT_IN_FLIGHT, unit="tracked") == 0


def test_an_inline_caller_that_gives_up_in_line_loses_no_permit_and_no_count(app: Foundry) -> None:
    """``await unit(x)`` waiting for a permit: cancelled while it waits (withdrawn), or
    just after its permit was granted (the permit passes on); the rest all run, counted."""
    gate = asyncio.Event()
    ran: list[int] = []

    @app.work(model="async", concurrency=1, max_pending=100)
    async def one(x: int) -> int:
        if x == 0:
            await gate.wait()
        ran.append(x)
        return x

    async def main() -> list[object]:
        tasks = [asyncio.create_task(one(i)) for i in range(5)]
        await asyncio.sleep(0.01)  # 0 holds the permit; 1..4 wait in line
        tasks[1].cancel()  # withdrawn while it waits
        gate.set()
        await asyncio.sleep(0)  # 0 finishes and grants 2 its permit; 2 has not resumed yet
        tasks[2].cancel()  # granted, then cancelled: the permit must pass on to 3
        return await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5.0)

    outcomes = asyncio.run(main())
    assert outcomes[0] == 0
    assert outcomes[3:] == [3, 4]
    assert all(isinstance(o, asyncio.CancelledError) for o in outcomes[1:3])
    assert ran == [0, 3, 4]
    assert app.metrics.value(names.UNIT_COMPLETED, unit="one") == 3
    assert app.metrics.value(names.UNIT_IN_FLIGHT, unit="one") == 0

    async def again() -> int:  # every permit came back: the next caller runs at once
        return await asyncio.wait_for(one(9), 1.0)

    assert asyncio.run(again()) == 9


def test_a_permit_freed_on_one_loop_starts_the_caller_waiting_on_another(app: Foundry) -> None:
    @app.work(model="async", concurrency=1, max_pending=100)
    async def slow(x: int) -> int:
        await asyncio.sleep(0.05)
        return x

    async def call(x: int) -> int:
        return await slow(x)  # inline, in this thread's own loop

    results: list[int] = []
    threads = [threading.Thread(target=lambda i=i: results.append(asyncio.run(call(i)))) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(results) == [0, 1, 2, 3]
    assert app.metrics.value(names.UNIT_COMPLETED, unit="slow") == 4


def test_sync_callers_use_the_managed_loop(app: Foundry) -> None:
    @app.work(model="async", concurrency=4)
    async def where() -> tuple[str, str]:
        loop = asyncio.get_running_loop()
        return threading.current_thread().name, type(loop).__module__

    thread, loop_module = where.submit().result(10)
    assert thread == "foundry-loop"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        assert loop_module.startswith("asyncio")
    else:
        assert loop_module.startswith("uvloop")
    assert where() == (thread, loop_module)


def test_async_callers_run_the_work_on_their_own_loop(app: Foundry) -> None:
    @app.work(model="async", concurrency=4)
    async def loop_id() -> int:
        return id(asyncio.get_running_loop())

    async def main() -> tuple[int, int, int]:
        handle = await loop_id.asubmit()
        return id(asyncio.get_running_loop()), await handle, await loop_id()

    mine, submitted, called = asyncio.run(main())
    assert mine == submitted == called


def test_timeout_cancels_the_coroutine(app: Foundry) -> None:
    cancelled = threading.Event()

    @app.work(model="async", concurrency=2, timeout="50ms")
    async def slow() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(WorkTimeoutError, match="past its timeout"):
        slow.submit().result(10)
    assert cancelled.is_set()


def test_the_works_own_timeout_error_stays_a_timeout_error(app: Foundry) -> None:
    @app.work(model="async", concurrency=2, timeout="5s")
    async def raises_timeout() -> None:
        raise TimeoutError("upstream timed out")

    with pytest.raises(TimeoutError, match="upstream") as info:
        raises_timeout.submit().result(10)
    assert not isinstance(info.value, WorkTimeoutError)


def test_blocking_on_the_loop_that_runs_the_task_raises(app: Foundry) -> None:
    square = app.work(model="async", concurrency=2, name="sq")(workloads.async_square)

    async def main() -> int:
        handle = await square.asubmit(7)
        with pytest.raises(PoolDeadlockError, match="await handle"):
            handle.result(5)
        return int(await handle)

    assert asyncio.run(main()) == 49


def test_plain_functions_run_in_threads_under_the_permits(app: Foundry) -> None:
    @app.work(model="async", concurrency=2)
    def blocking(x: int) -> str:
        return f"{x}:{threading.current_thread().name}"

    value = blocking.submit(1).result(10)
    assert value.startswith("1:") and "foundry-loop" not in value  # noqa: PT018


def test_reject_when_permits_and_intake_are_full(app: Foundry) -> None:
    gate = asyncio.Event()

    @app.work(model="async", concurrency=1, max_pending=1, overflow="reject")
    async def held() -> str:
        await gate.wait()
        return "ok"

    async def main() -> list[str]:
        first = await held.asubmit()
        second = await held.asubmit()
        with pytest.raises(OverloadError, match="overflow='reject'"):
            await held.asubmit()
        gate.set()
        return [await first, await second]

    assert asyncio.run(main()) == ["ok", "ok"]
    assert app.metrics.value(names.POOL_REJECTED, unit="held") == 1


def test_scope_cancels_siblings_when_one_fails(app: Foundry) -> None:
    slow = app.work(model="async", concurrency=4, name="slow")(workloads.async_sleep_then)
    fail = app.work(model="async", concurrency=4, name="fail")(workloads.async_fail_on)
    handles = []

    async def main() -> None:
        async with scope():
            handles.append(await slow.asubmit(10.0))
            handles.append(await fail.asubmit(3))

    with pytest.raises(ExceptionGroup) as info:
        asyncio.run(main())
    assert [type(e) for e in info.value.exceptions] == [workloads.Boom]
    assert [h.status for h in handles] == [Status.CANCELLED, Status.FAILED]


def test_scope_does_not_return_before_its_tasks_finished(app: Foundry) -> None:
    slow = app.work(model="async", concurrency=4, name="slow2")(workloads.async_sleep_then)

    async def main() -> list[Status]:
        async with scope():
            handles = [await slow.asubmit(0.02, i) for i in range(3)]
        return [h.status for h in handles]

    assert asyncio.run(main()) == [Status.SUCCEEDED] * 3


def test_cancelling_the_host_task_cancels_the_scope(app: Foundry) -> None:
    slow = app.work(model="async", concurrency=4, name="slow3")(workloads.async_sleep_then)
    handles = []

    async def body() -> None:
        async with scope():
            handles.append(await slow.asubmit(10.0))
            handles.append(await slow.asubmit(10.0))
            await asyncio.sleep(10)

    async def main() -> None:
        task = asyncio.create_task(body())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert [h.status for h in handles] == [Status.CANCELLED, Status.CANCELLED]
    with pytest.raises(CancelledError):
        handles[0].result(0)


def test_sync_scope_waits_for_every_model(app: Foundry) -> None:
    pooled = app.work(model="bounded_pool", workers=2, name="pooled")(workloads.sleep_then)
    looped = app.work(model="async", concurrency=2, name="looped")(workloads.async_sleep_then)
    with scope():
        handles = [pooled.submit(0.02, "p"), looped.submit(0.02, "a")]
    assert all(h.done() for h in handles)
    assert [h.result(0) for h in handles] == ["p", "a"]
