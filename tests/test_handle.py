"""Handle: one API over any Source, sync and async, failures delivered intact."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading

import pytest

from foundry.errors import CancelledError, ResultTimeoutError
from foundry.handle import FutureSource, Handle, Outcome, Status, completed_handle


class Boom(Exception):
    pass


def _raise() -> None:
    raise Boom("bad row 7")


def test_lifecycle_queued_running_succeeded() -> None:
    source = FutureSource()
    handle = Handle("h1", "import_csv", source)
    assert handle.status is Status.QUEUED
    assert not handle.done()
    source.running = True
    assert handle.status is Status.RUNNING
    source.future.set_result(40)
    assert handle.status is Status.SUCCEEDED
    assert handle.result(0) == 40
    assert handle.exception(0) is None


def test_failure_is_the_original_exception_with_its_traceback() -> None:
    source = FutureSource()
    try:
        _raise()
    except Boom as exc:
        source.future.set_exception(exc)
    handle = Handle("h2", "import_csv", source)
    with pytest.raises(Boom, match="bad row 7") as info:
        handle.result(1)
    assert any(entry.name == "_raise" for entry in info.traceback)
    assert handle.status is Status.FAILED
    assert isinstance(handle.exception(0), Boom)


def test_result_timeout_says_the_work_may_still_finish() -> None:
    handle = Handle("h3", "transcode", FutureSource())
    with pytest.raises(ResultTimeoutError, match="may still finish"):
        handle.result(timeout=0.01)
    with pytest.raises(TimeoutError):  # also a builtin TimeoutError for generic callers
        handle.exception(timeout=0.01)


def test_cancel_before_running() -> None:
    handle = Handle("h4", "x", FutureSource())
    assert handle.cancel()
    assert handle.status is Status.CANCELLED
    with pytest.raises(CancelledError):
        handle.result(0)


def test_cancel_while_running_uses_the_models_hook() -> None:
    stopped = threading.Event()

    def stop() -> bool:
        stopped.set()
        return True

    future: cf.Future[int] = cf.Future()
    future.set_running_or_notify_cancel()
    source = FutureSource(future, on_cancel=stop)
    handle = Handle("h5", "x", source)
    assert handle.cancel()
    assert stopped.is_set()
    assert handle.status is Status.CANCELLED
    with pytest.raises(CancelledError):
        handle.result(0)


def test_cancel_after_completion_is_refused() -> None:
    source = FutureSource()
    source.future.set_result(1)
    assert not Handle("h6", "x", source).cancel()


def test_awaitable_from_async_code() -> None:
    source = FutureSource()
    handle = Handle("h7", "x", source)

    async def main() -> int:
        asyncio.get_running_loop().call_later(0.01, source.future.set_result, 5)
        return int(await handle)

    assert asyncio.run(main()) == 5


def test_async_result_timeout() -> None:
    handle = Handle("h8", "x", FutureSource())

    async def main() -> None:
        await handle.aresult(timeout=0.01)

    with pytest.raises(ResultTimeoutError):
        asyncio.run(main())


def test_one_handles_failure_never_touches_another() -> None:
    good, bad = FutureSource(), FutureSource()
    bad.future.set_exception(Boom("only me"))
    good.future.set_result("fine")
    assert Handle("a", "x", good).result(0) == "fine"
    with pytest.raises(Boom):
        Handle("b", "x", bad).result(0)


def test_completed_handle() -> None:
    ok = completed_handle("u", Outcome(value=3))
    assert ok.status is Status.SUCCEEDED
    assert ok.result() == 3
    failed = completed_handle("u", Outcome(error=Boom("x")))
    assert failed.status is Status.FAILED
    cancelled = completed_handle("u", Outcome(error=CancelledError("c")))
    assert cancelled.status is Status.CANCELLED
