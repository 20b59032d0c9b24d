"""foundry.outage.ride_outage: the one way a runtime rides out an engine that is down."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from foundry.errors import BackendUnavailableError, MalformedRecordError
from foundry.outage import aride_outage, ride_outage
from foundry.retry import Backoff


def flaky(failures: int) -> tuple[Callable[[], str], list[int]]:
    """A call that is unavailable ``failures`` times, then answers; and its call count."""
    calls = [0]

    def call() -> str:
        calls[0] += 1
        if calls[0] <= failures:
            raise BackendUnavailableError(f"redis://h:6379 is unreachable (try {calls[0]})")
        return "ok"

    return call, calls


def test_an_outage_shorter_than_the_tries_is_ridden_out_with_the_policys_pauses() -> None:
    call, calls = flaky(3)
    slept: list[float] = []
    assert ride_outage(call, tries=8, sleep=slept.append) == "ok"
    assert calls == [4]
    assert slept == [0.05, 0.1, 0.2]  # OUTAGE: 50 ms doubling, no jitter


def test_the_last_unavailable_error_is_raised_when_the_tries_run_out() -> None:
    call, calls = flaky(100)
    slept: list[float] = []
    with pytest.raises(BackendUnavailableError, match=r"try 3\)"):
        ride_outage(call, tries=3, sleep=slept.append)
    assert calls == [3]
    assert len(slept) == 2  # no pause after the last try


def test_within_refuses_a_pause_that_would_end_past_it() -> None:
    call, calls = flaky(100)
    started = time.monotonic()
    with pytest.raises(BackendUnavailableError):
        ride_outage(call, within=0.3, policy=Backoff(0.1, 0.1, jitter="none"))
    assert calls[0] in (3, 4)  # calls at 0, 0.1, 0.2 (and 0.3 on a slow machine's clock)
    assert time.monotonic() - started < 5.0


def test_a_stop_ends_the_riding_at_once_and_interrupts_the_pause() -> None:
    call, calls = flaky(100)
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    with pytest.raises(BackendUnavailableError):
        ride_outage(call, stop=stop, policy=Backoff(30.0, 30.0, jitter="none"))  # one long pause
    assert time.monotonic() - started < 10.0  # the stop ended the 30 s pause
    assert calls == [1]


def test_any_other_error_is_raised_at_once() -> None:
    calls = [0]

    def call() -> None:
        calls[0] += 1
        raise MalformedRecordError("job 7", "args", b"\\xff", "is not JSON")

    with pytest.raises(MalformedRecordError):
        ride_outage(call, tries=8, sleep=lambda _: None)
    assert calls == [1]


def test_tries_below_one_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="tries=0 is below 1"):
        ride_outage(lambda: None, tries=0)


def test_the_async_ride_awaits_its_pauses_and_keeps_the_same_bounds() -> None:
    call, calls = flaky(2)

    async def acall() -> str:
        return call()

    # An outage shorter than the tries: ridden out, the loop free during the pauses.
    ticks = [0]

    async def main() -> str:
        async def tick() -> None:
            while True:
                ticks[0] += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.ensure_future(tick())
        try:
            return await aride_outage(acall, tries=8, policy=Backoff(0.05, 0.05, jitter="none"))
        finally:
            ticker.cancel()

    assert asyncio.run(main()) == "ok"
    assert calls == [3]
    assert ticks[0] >= 3  # other tasks ran while it waited
    # Out of tries: the last unavailable error, no pause after the last try.
    never, tried = flaky(100)

    async def anever() -> str:
        return never()

    with pytest.raises(BackendUnavailableError, match=r"try 3\)"):
        asyncio.run(aride_outage(anever, tries=3, policy=Backoff(0.001, 0.001, jitter="none")))
    assert tried == [3]
    with pytest.raises(ValueError, match="tries=0"):
        asyncio.run(aride_outage(anever, tries=0))
