"""One Handle API on every in-process model: results, failures, timeouts, cancellation,
await, map — the same assertions, parametrized over the models."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

import pytest

from foundry import Foundry
from foundry.errors import CancelledError, ResultTimeoutError
from foundry.handle import Status
from foundry.observe import names
from foundry.units import WorkUnit
from tests.execute import workloads
from tests.execute.workloads import Boom

MODELS = ["sequential", "async", "threads", "bounded_pool", "processes"]
CONCURRENT = [m for m in MODELS if m != "sequential"]
_ASYNC_TWIN: dict[Callable[..., Any], Callable[..., Any]] = {
    workloads.square: workloads.async_square,
    workloads.fail_on: workloads.async_fail_on,
    workloads.sleep_then: workloads.async_sleep_then,
}
_names = itertools.count()


def unit(app: Foundry, model: str, fn: Callable[..., Any], **traits: Any) -> WorkUnit:
    """``fn`` declared on ``model`` (its coroutine twin on ``async``), two workers."""
    if model == "async":
        fn = _ASYNC_TWIN.get(fn, fn)
        traits.setdefault("concurrency", 2)
    elif model != "sequential":
        traits.setdefault("workers", 2)
    return app.work(model=model, name=f"{fn.__name__}_{model}_{next(_names)}", **traits)(fn)


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


@pytest.mark.parametrize("model", MODELS)
def test_result_status_and_call(app: Foundry, model: str) -> None:
    square = unit(app, model, workloads.square)
    handle = square.submit(3)
    assert isinstance(handle.id, str)
    assert handle.id
    assert handle.result(timeout=10) == 9
    assert handle.status is Status.SUCCEEDED
    assert handle.done()
    assert handle.exception(timeout=0) is None
    assert square(4) == 16
    assert handle.unit == square.name
    assert square.decision.execution == model


@pytest.mark.parametrize("model", MODELS)
def test_failure_is_the_original_exception_with_its_traceback(app: Foundry, model: str) -> None:
    fail = unit(app, model, workloads.fail_on)
    handle = fail.submit(3)
    with pytest.raises(Boom, match="bad item 3") as info:
        handle.result(timeout=10)
    assert handle.status is Status.FAILED
    assert isinstance(handle.exception(timeout=0), Boom)
    if model == "processes":  # the child's traceback travels as a note
        assert any("fail_on" in note and "child pid" in note for note in info.value.__notes__)
    else:
        assert any(entry.name in ("fail_on", "async_fail_on") for entry in info.traceback)


@pytest.mark.parametrize("model", MODELS)
def test_one_failure_never_touches_another_handle(app: Foundry, model: str) -> None:
    fail = unit(app, model, workloads.fail_on, max_pending=64)
    handles = [fail.submit(i) for i in range(12)]
    for i, handle in enumerate(handles):
        if i == 3:
            assert isinstance(handle.exception(timeout=10), Boom)
        else:
            assert handle.result(timeout=10) == i
            assert handle.status is Status.SUCCEEDED
    assert app.metrics.value(names.UNIT_FAILED, unit=fail.name) == 1
    assert app.metrics.value(names.UNIT_COMPLETED, unit=fail.name) == 11


@pytest.mark.parametrize("model", MODELS)
def test_handles_are_awaitable_from_async_code(app: Foundry, model: str) -> None:
    square = unit(app, model, workloads.square)

    async def main() -> tuple[Any, Any, Any]:
        handle = await square.asubmit(5)
        other = square.submit(6)  # a sync submit from async code is fine too
        return await handle, await other.aresult(10), handle.status

    assert asyncio.run(main()) == (25, 36, Status.SUCCEEDED)


@pytest.mark.parametrize("model", CONCURRENT)
def test_result_timeout_leaves_the_work_running(app: Foundry, model: str) -> None:
    slow = unit(app, model, workloads.sleep_then)
    handle = slow.submit(0.3, "done")
    with pytest.raises(ResultTimeoutError, match="may still finish"):
        handle.result(timeout=0.01)
    assert handle.result(timeout=10) == "done"


@pytest.mark.parametrize("model", CONCURRENT)
def test_cancel_queued_work_never_runs(app: Foundry, model: str) -> None:
    slow = unit(app, model, workloads.sleep_then, est="1s")
    busy = [slow.submit(0.4, "busy") for _ in range(2)]
    queued = slow.submit(0.0, "queued")
    assert queued.status is Status.QUEUED
    assert queued.cancel()
    assert queued.status is Status.CANCELLED
    with pytest.raises(CancelledError):
        queued.result(timeout=10)
    assert [h.result(timeout=10) for h in busy] == ["busy", "busy"]
    assert queued.status is Status.CANCELLED  # and it never ran, so it never succeeded


@pytest.mark.parametrize("model", CONCURRENT)
def test_cancel_running_work(app: Foundry, model: str) -> None:
    slow = unit(app, model, workloads.sleep_then)
    handle = slow.submit(1.0 if model in ("threads", "bounded_pool") else 30.0, "late")
    wait_until(lambda: handle.status is Status.RUNNING)
    assert handle.cancel()
    with pytest.raises(CancelledError):
        handle.result(timeout=10)
    assert handle.status is Status.CANCELLED
    assert not handle.cancel() or handle.status is Status.CANCELLED
    # the model still works afterwards
    assert slow.submit(0.0, "after").result(timeout=10) == "after"


def test_sequential_handles_are_finished_when_returned(app: Foundry) -> None:
    fail = unit(app, "sequential", workloads.fail_on)
    handle = fail.submit(3)  # the failure is in the handle, not raised by submit
    assert handle.done()
    assert handle.status is Status.FAILED
    assert not handle.cancel()


@pytest.mark.parametrize("model", MODELS)
def test_map_ordered_and_unordered(app: Foundry, model: str) -> None:
    square = unit(app, model, workloads.square, max_pending=2)
    assert list(square.map(range(20))) == [i * i for i in range(20)]
    assert sorted(square.map(range(20), ordered=False)) == sorted(i * i for i in range(20))
    # lazy and bounded: an endless input is fine
    assert list(itertools.islice(square.map(itertools.count()), 5)) == [0, 1, 4, 9, 16]


@pytest.mark.parametrize("model", MODELS)
def test_map_raises_at_the_failing_item(app: Foundry, model: str) -> None:
    fail = unit(app, model, workloads.fail_on, max_pending=2)
    results = fail.map(range(10))
    assert [next(results) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(Boom):
        next(results)


@pytest.mark.parametrize("model", ["threads", "bounded_pool", "processes"])
def test_map_cancels_outstanding_work_when_the_consumer_stops(app: Foundry, model: str) -> None:
    slow = unit(app, model, workloads.sleep_then, max_pending=2, est="1s")
    results = slow.map([0.05] * 50)
    next(results)
    results.close()  # the consumer stopped: what was submitted and not finished is cancelled
    wait_until(lambda: app.metrics.value(names.UNIT_IN_FLIGHT, unit=slow.name) == 0)
    done = app.metrics.value(names.UNIT_COMPLETED, unit=slow.name)
    assert done < 10  # a window of at most 2 workers + 2 queued was ever submitted
