"""The public surface is deliberate: adding or removing a name is a decision, made here."""

from __future__ import annotations

import pytest

import foundry

EXPECTED = {
    "BackendError", "BackendUnavailableError", "CancelledError", "ChildCrashedError", "ConfigError",
    "DeadLetteredError", "Decision", "DeclarationError", "Foundry", "FoundryError", "Handle", "Host",
    "NonDeterminismError", "NotFoundError", "OverloadError", "PayloadTooLargeError", "PoolDeadlockError",
    "RecordError", "RemoteError", "ResultTimeoutError", "Status", "SubmitError", "Traits", "WorkTimeoutError",
    "__version__", "checkpoint", "decide", "loop", "progress", "scope",
}  # fmt: skip


def test_all_is_pinned() -> None:
    assert set(foundry.__all__) == EXPECTED


def test_every_exported_name_exists_and_errors_share_one_root() -> None:
    for name in foundry.__all__:
        assert hasattr(foundry, name), name
        value = getattr(foundry, name)
        if isinstance(value, type) and issubclass(value, BaseException):
            assert issubclass(value, foundry.FoundryError), name


# -- foundry.CancelledError beside the standard library's two ---------------------------------


def _cancelled_handle() -> foundry.Handle:
    from foundry.handle import FutureSource

    handle = foundry.Handle("h-cancelled", "transcode", FutureSource())
    assert handle.cancel()
    return handle


def test_cancelled_error_is_concurrent_futures_but_not_asyncio_cancellation() -> None:
    import asyncio
    import concurrent.futures as cf

    assert issubclass(foundry.CancelledError, cf.CancelledError)
    assert issubclass(foundry.CancelledError, foundry.FoundryError)
    assert issubclass(foundry.CancelledError, Exception)
    assert not issubclass(foundry.CancelledError, asyncio.CancelledError)
    # code written for concurrent.futures catches a cancelled handle's result
    caught: BaseException | None = None
    try:
        _cancelled_handle().result(timeout=0)
    except cf.CancelledError as exc:
        caught = exc
    assert isinstance(caught, foundry.CancelledError)
    assert "cancelled" in str(caught)


def test_awaiting_cancelled_work_fails_the_task_and_does_not_cancel_it() -> None:
    import asyncio

    async def wait_for_it() -> object:
        return await _cancelled_handle()

    async def main() -> None:
        # gather reports it as this task's failure (a cancellation would cancel gather)
        task = asyncio.create_task(wait_for_it())
        (outcome,) = await asyncio.gather(task, return_exceptions=True)
        assert isinstance(outcome, foundry.CancelledError)
        assert task.done()
        assert not task.cancelled()
        # wait_for passes it through: neither a TimeoutError nor the loop's cancellation
        try:
            await asyncio.wait_for(_cancelled_handle().aresult(), timeout=5)
        except foundry.CancelledError:
            pass
        else:
            raise AssertionError("the cancelled work's error was not raised")
        # a TaskGroup collects it like any failure, in its ExceptionGroup
        with pytest.raises(ExceptionGroup) as group_error:
            async with asyncio.TaskGroup() as group:
                group.create_task(wait_for_it())
        assert [type(e) for e in group_error.value.exceptions] == [foundry.CancelledError]

    asyncio.run(asyncio.wait_for(main(), timeout=30))


def test_cancelling_the_waiting_task_is_still_asyncios_cancellation() -> None:
    import asyncio

    from foundry.handle import FutureSource

    handle = foundry.Handle("h-pending", "transcode", FutureSource())  # never finishes

    async def main() -> None:
        task = asyncio.create_task(handle.aresult(timeout=30))
        await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        assert task.cancelled()
        assert handle.status is foundry.Status.QUEUED  # the work itself was not touched

    asyncio.run(asyncio.wait_for(main(), timeout=30))
