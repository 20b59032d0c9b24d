"""The loop-lag monitor and the starvation watchdog, on the seed's payments example.

Assertions are about detection and attribution (which function, which unit, which new
decision) and about the order of events, never about how many milliseconds passed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from foundry import Foundry
from foundry.demos.inprocess import build_units, payments_scenario
from foundry.observe import names
from foundry.observe.metrics import Registry
from foundry.observe.stall import Target
from foundry.observe.watchdog import LoopMonitor, Watchdog
from foundry.profile import current_host
from foundry.traits import traits_from_kwargs


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x = (x * 31 + 7) % 1_000_003


def pure_python_compute() -> str:
    """What decide v2 gives Python code measured compute-bound with many in flight, on
    this machine: process workers under the GIL, threads without it, and nothing in
    parallel on one core."""
    host = current_host()
    if host.cores == 1:
        return "sequential"
    return "bounded_pool" if host.gil is False else "processes"


@pytest.fixture
def app(home: Any) -> Any:
    app = Foundry("watchdog-test")
    yield app
    app.close()


def test_the_monitor_records_lag_for_a_blocked_loop() -> None:
    registry = Registry()

    async def main() -> dict[str, float]:
        monitor = LoopMonitor(asyncio.get_running_loop(), registry=registry, name="t", interval=0.01)
        monitor.start()
        await asyncio.sleep(0.05)
        spin(0.2)  # hold the loop: the next tick is late by at least most of this
        await asyncio.sleep(0.05)
        monitor.stop()
        return monitor.summary()

    summary = asyncio.run(main())
    assert summary["count"] >= 3
    assert summary["max"] >= 0.1  # a lower bound set by the block itself
    assert registry.snapshot()[names.LOOP_LAG][0]["labels"] == {"loop": "t"}


def test_inline_signing_fires_the_watchdog_naming_sign_body_and_proposing_a_pool(app: Any) -> None:
    units = build_units(app)
    assert units.handle_payment_inline.runner is not None  # made here, not on the watched loop

    run = asyncio.run(
        payments_scenario(
            units.handle_payment_inline,  # `await unit(...)` runs in the caller's task, on this loop
            variant="inline",
            units=[units.handle_payment_inline],
            threshold=0.05,
            registry=app.metrics,
        )
    )
    # Then: detected, attributed to the signing function inside the declared handler ...
    signing = [r for r in run.reports if r.culprit is not None and r.culprit.function == "sign_body"]
    assert signing, f"the watchdog did not name sign_body for 6 × 35 ms of signing: {run.reports}"
    report = signing[0]
    assert report.unit == "handle_payment_inline"
    assert report.phase == "sign_body"
    assert report.coroutine is not None
    assert "handle_payment_inline" in report.coroutine
    assert report.decision is not None
    # The watchdog cannot see that sign_body releases the GIL (nobody declared the phase):
    # measured compute in pure Python, 300 in flight -> process workers (decide v2).
    assert report.decision.execution == pure_python_compute()
    assert "compute-bound: reclassify" in report.message
    assert any(frame.function == "handle_payment_inline" for frame in report.stack)
    assert app.metrics.value(names.LOOP_BLOCKED, loop="inline") >= 1
    # ... and the health check could only run once a signature had finished.
    assert run.health_ran_after_first_signature
    assert len(run.signed_at) == 6


def test_signing_on_a_pool_keeps_the_watchdog_quiet_and_the_health_check_prompt(app: Any) -> None:
    units = build_units(app)
    assert units.sign.decision.execution == "bounded_pool"
    assert units.handle_payment.runner is not None
    run = asyncio.run(
        payments_scenario(
            units.handle_payment,  # awaits sign.asubmit(...): the signing runs on sign's pool
            variant="pooled",
            units=[units.handle_payment, units.handle_payment_inline],
            threshold=0.05,
            registry=app.metrics,
        )
    )
    assert not [r for r in run.reports if r.culprit is not None and r.culprit.function == "sign_body"]
    assert len(run.signed_at) == 6
    assert run.health_ran_before_last_signature  # the loop was free while the pool signed
    assert app.metrics.value(names.UNIT_COMPLETED, unit="sign", model="bounded_pool") == 6


def test_an_unknown_culprit_is_still_named_and_re_decided_from_its_measured_cost() -> None:
    async def main() -> list[Any]:
        async with Watchdog(threshold=0.03, log_reports=False) as watchdog:
            await asyncio.sleep(0.05)
            spin(0.15)
            await asyncio.sleep(0.1)
        return list(watchdog.reports)

    reports = asyncio.run(main())
    assert reports
    assert reports[0].culprit is not None
    assert reports[0].culprit.function == "spin"
    assert reports[0].unit is None
    assert reports[0].decision is not None
    assert reports[0].decision.phase == "spin"


def held_by(traits: dict[str, Any]) -> list[Any]:
    """The reports of a watchdog on a loop that one declared unit holds for 200 ms."""

    async def job() -> None:
        await asyncio.sleep(0.02)
        spin(0.2)
        await asyncio.sleep(0.05)

    async def main() -> list[Any]:
        target = Target("job", job, traits_from_kwargs("job", traits))
        async with Watchdog(threshold=0.05, log_reports=False, units=[target]) as watchdog:
            await job()
        return [r for r in watchdog.reports if r.unit == "job"]

    reports = asyncio.run(main())
    assert reports, "the watchdog did not attribute 200 ms of spinning to the unit"
    return reports


def test_the_new_decision_is_re_decided_from_the_measurement_for_this_machine() -> None:
    report = held_by({"bound": "io", "concurrency": 300, "est": "40ms"})[0]
    assert report.decision is not None
    assert report.decision.execution == pure_python_compute()
    # decided for the cores this loop runs on, not an assumed 8-core machine ...
    assert not report.decision.load.cores_assumed
    assert report.decision.load.cores == current_host().cores
    # ... and the record says what the measurement contradicted (foundry.decide.reclassify)
    assert any("loop watchdog measured 'cpu'" in note for note in report.decision.notes)


def test_a_new_decision_that_keeps_the_work_on_the_loop_says_so_and_what_to_declare() -> None:
    # Nothing says how many run at once: decide v2 keeps compute in the caller
    # (sequential), which for code awaited on a loop is the loop it just held.
    report = held_by({"durable": True})[0]
    assert report.decision is not None
    assert report.decision.execution == "sequential"
    assert "still runs it in the caller, on this loop" in report.message
    if current_host().cores == 1:
        assert "one core" in report.message
    else:
        assert "declare concurrency=" in report.message
    # A decision that moves it off the loop gets no such line.
    moved = held_by({"bound": "io", "concurrency": 300, "est": "40ms"})[0]
    assert moved.decision is not None
    if moved.decision.execution != "sequential":
        assert "still runs it in the caller" not in moved.message


def test_a_loop_held_past_report_after_is_reported_while_still_blocked() -> None:
    seen: list[Any] = []

    async def main() -> None:
        async with Watchdog(threshold=0.03, report_after=0.1, on_stall=seen.append, log_reports=False):
            await asyncio.sleep(0.05)
            spin(0.4)
            await asyncio.sleep(0.1)

    asyncio.run(main())
    assert seen
    assert seen[0].ongoing
    assert "still blocked" in seen[0].message
    assert len(seen) == 1  # one report per stall


def test_an_idle_or_stopped_loop_is_not_a_stall() -> None:
    async def main() -> Watchdog:
        watchdog = Watchdog(threshold=0.25, log_reports=False).start()
        await asyncio.sleep(0.3)
        return watchdog

    loop = asyncio.new_event_loop()
    try:
        watchdog = loop.run_until_complete(main())
        time.sleep(0.4)  # the loop is not running now: the late tick is not a stall
        assert not watchdog.reports
        watchdog.stop()
        with pytest.raises(ValueError, match="threshold"):
            Watchdog(loop, threshold=0)
    finally:
        loop.close()


def test_many_short_steps_back_to_back_are_reported_as_saturation_not_a_phase() -> None:
    async def step() -> None:
        spin(0.002)

    async def main() -> Watchdog:
        async with Watchdog(threshold=0.05, log_reports=False) as watchdog:
            await asyncio.sleep(0.06)
            await asyncio.gather(*(step() for _ in range(150)))  # 300 ms of 2 ms steps, all ready
            await asyncio.sleep(0.1)
        return watchdog

    watchdog = asyncio.run(main())
    assert watchdog.reports
    report = watchdog.reports[0]
    assert report.saturated
    assert report.decision is None  # no single phase to reclassify
    assert "saturated" in report.message
    cost = watchdog.overhead()
    assert cost["ticks"] >= 1
    assert 0 <= cost["thread_cpu"] < 1.0


def test_a_block_right_after_start_is_seen() -> None:
    async def main() -> Watchdog:
        async with Watchdog(threshold=0.03, log_reports=False) as watchdog:
            spin(0.2)  # no await between starting the watchdog and blocking the loop
            await asyncio.sleep(0.1)
        return watchdog

    watchdog = asyncio.run(main())
    assert [r.culprit.function for r in watchdog.reports if r.culprit] == ["spin"]


def test_a_starved_stall_with_two_looks_is_not_called_saturation() -> None:
    """A process the machine starves gets two or three looks in a long stall: two tasks
    seen once each in the same function say nothing about how long either held the loop,
    so the report names that function (as for one task), not saturation; four looks that
    each find another task are saturation."""
    from foundry.observe._samples import Sample
    from foundry.observe.stall import FrameInfo
    from foundry.observe.watchdog import _Stall

    frame = FrameInfo("sign_body", "/srv/payments.py", 80, "payments")

    def look(i: int, task: str) -> Sample:
        return Sample(i * 0.01, task, "handler", frame, None, False, None, ())

    loop = asyncio.new_event_loop()
    try:
        watchdog = Watchdog(loop, threshold=0.05, log_reports=False)
        two = watchdog._report(_Stall(0.0, [look(0, "Task-1"), look(1, "Task-2")]), 0.525, ongoing=False)
        assert two is not None
        assert not two.saturated
        assert "sign_body" in two.message
        assert "back to back" not in two.message
        four = [look(i, f"Task-{i % 2}") for i in range(4)]
        many = watchdog._report(_Stall(0.0, four), 0.525, ongoing=False)
        assert many is not None
        assert many.saturated
    finally:
        loop.close()
