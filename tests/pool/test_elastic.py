"""The elastic controller under a step load: 40/s → 140/s → 40/s of 10 ms requests.

Each request is 2 ms of pure-Python CPU and 8 ms blocked, as on a downstream call
(``work.compute_then_wait``); the unit declares ``latency="300ms"`` (its p99 target),
``est="10ms"``, 1 to 4 workers.

Why not 10 ms of CPU: this machine has 2 cores shared with other engineers' suites
(load average 3-7), and what the cores are free for is theirs to decide. Measured here
at load ≈ 3.4, a fixed pool of 2 workers at 140/s answered with a p99 of 143 ms for
10 ms of spinning, 606 ms for 5 ms CPU + 5 ms waiting, 130 ms for 3 + 7, 44 ms for
2 + 8 and 14 ms for 10 ms of waiting: with CPU-heavy work the test would measure the
neighbours, not the controller. 2 + 8 keeps real CPU in every request (0.28 cores at
the high step) and leaves the queueing — what the controller is about — to decide the
latency. The target is generous for the same reason (the box stalls a process for
100-250 ms now and then), and still meaningful: without the controller the step's p99
is 20-50 times over it.

What M/M/c says, and so what the test expects:

* at 40/s one worker is enough (ρ = 0.4, p99 ≈ 77 ms ≤ 300 ms, and still one
  if the machine stretches the service to 18 ms);
* at 140/s one worker is overloaded (ρ = 1.4: its line grows by 40 requests a second,
  and the step's p99 is seconds) and two hold the target (p99 ≈ 83 ms): **the pool must
  grow**; once the controller's window has seen the new rate, the workers it asked for
  are live and the line the step built up is empty, the p99 of the next 2 s of
  requests **is within the declared 300 ms**;
* back at 40/s it **shrinks** to its low-step size (after 3 s of asking for fewer).

Every resize is a record, a log line and a counter carrying the arrival rate, the
service time and the predicted p99 that justified it, and each agrees with the lab's
M/M/c model (recomputed here independently of the controller's search).

The phases wait for what they test (the controller seeing the step, a drained line, a
shrink) within bounds: ~14 s at this machine's usual load. With the controller pinned
at one worker the high step's p99 was 6.9 s and the test failed on it (checked when it
was written); with two extra CPU hogs on top of that usual load (load average 8) the
machine cannot serve 140/s at all and it fails too.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from foundry import Foundry
from foundry.deliver.pool.controller import Controller, Resize, size_for
from foundry.lab.queueing import mmc_response_quantile
from foundry.units import WorkUnit
from tests.pool import work

pytestmark = pytest.mark.slow

TARGET = 0.3  # the declared p99 latency target, seconds
CPU, WAIT = 0.002, 0.008  # seconds of CPU, then of waiting, per request
SERVICE = CPU + WAIT
LOW, HIGH = 40.0, 140.0  # arrivals per second
MAX_WORKERS = 4
CATCH_UP = 7.0  # seconds the controller may take to see the step, grow, and drain the line
MEASURED = 2.0  # seconds of the high step measured after that


def model_answer(rate: float, service: float, target: float) -> int:
    """The fewest workers whose exact M/M/c p99 is within target (straight from the lab)."""
    c = max(1, math.floor(rate * service) + 1)
    while mmc_response_quantile(0.99, c, service, rate) > target:
        c += 1
    return c


@dataclass
class Step:
    """One phase of the load: when each request was due and how long it took to answer."""

    rate: float
    sent: list[float] = field(default_factory=list)  # due times (monotonic)
    latency: list[float] = field(default_factory=list)  # due to answer, seconds, same order

    def p99(self, since: float) -> tuple[float, int]:
        """The p99 of the requests due from ``since`` on, and how many there were."""
        xs = sorted(lat for due, lat in zip(self.sent, self.latency, strict=True) if due >= since)
        assert xs, f"no request at {self.rate:g}/s was sent after {since}"
        return xs[min(len(xs) - 1, math.ceil(len(xs) * 0.99) - 1)], len(xs)


def timeline(steps: list[Step], resizes: list[Resize], t0: float) -> str:
    """Per half second: the rate, p50 and max latency, for a failure's message."""
    out = []
    for step in steps:
        bins: dict[float, list[float]] = {}
        for due, lat in zip(step.sent, step.latency, strict=True):
            bins.setdefault(int((due - t0) * 2) / 2, []).append(lat)
        for at, xs in sorted(bins.items()):
            xs.sort()
            out.append(
                f"t={at:4.1f}s {step.rate:3g}/s n={len(xs)} p50 {xs[len(xs) // 2] * 1000:.0f} ms "
                f"max {xs[-1] * 1000:.0f} ms"
            )
    return "\n".join(out + [r.line("sign") for r in resizes])


async def drive(unit: WorkUnit, step: Step, until: Any, limit: float) -> None:
    """An open loop at ``step.rate`` (each request due at a fixed time, whatever the
    answers do) until ``until()`` holds or ``limit`` seconds passed; waits for every answer."""
    loop = asyncio.get_running_loop()
    pending: list[asyncio.Task[None]] = []

    async def answer(handle: Any, i: int, due: float) -> None:
        assert isinstance(await handle.aresult(timeout=30), int)
        step.latency[i] = time.monotonic() - due

    start = due = time.monotonic()
    while due - start < limit and not until():
        pause = due - time.monotonic()
        if pause > 0:
            await asyncio.sleep(pause)
        handle = await unit.asubmit(CPU, WAIT)
        step.sent.append(due)
        step.latency.append(math.nan)
        pending.append(loop.create_task(answer(handle, len(step.sent) - 1, due)))
        due += 1.0 / step.rate
    await asyncio.gather(*pending)


def test_step_load_grows_the_pool_holds_its_p99_target_and_shrinks_it(
    home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="foundry.pool")
    app = Foundry("elastic", pool="local://")
    try:
        sign = app.work(
            model="pool",
            idempotent=True,
            latency=f"{TARGET * 1000:g}ms",
            est=f"{SERVICE * 1000:g}ms",
            min_workers=1,
            max_workers=MAX_WORKERS,
            name="sign",
        )(work.compute_then_wait)
        assert isinstance(sign(0.0, 0.0), int)  # start the pool at min_workers
        controller = sign.runner.controller
        assert isinstance(controller, Controller)
        engine = controller.engine

        low1, high, low2 = Step(LOW), Step(HIGH), Step(LOW)

        async def main() -> tuple[float | None, float, int]:
            # Given: the low step long enough for the controller's 2 s window
            await drive(sign, low1, lambda: False, 2.0)
            low_size = engine.size()
            # When: the load steps up — until the pool has caught up (the controller's
            # window sees the new rate, the workers it asked for are live, and the line the
            # step built up is empty) and then for MEASURED seconds
            stepped = time.time()
            caught_up: list[tuple[float, int]] = []  # (when, resizes by then)

            def measured_after_catching_up() -> bool:
                resizes = len(controller.resizes)
                if caught_up and caught_up[0][1] != resizes:
                    caught_up.clear()  # it resized again: catch up again
                seen = app.metrics.value("foundry_pool_arrival_rate", unit="sign")
                stats = engine.stats()
                if not caught_up and seen > 0.9 * HIGH and stats.live >= engine.size() and not stats.waiting:
                    caught_up.append((time.monotonic(), resizes))
                return bool(caught_up) and time.monotonic() - caught_up[0][0] >= MEASURED

            await drive(sign, high, measured_after_catching_up, CATCH_UP + MEASURED)
            # ... and back down, until the pool has shrunk to its low-step size
            await drive(sign, low2, lambda: engine.size() <= low_size, 9.0)
            return (caught_up[0][0] if caught_up else None), stepped, low_size

        settled, stepped, low_size = asyncio.run(main())

        # Then: once the pool has caught up, the p99 of the high step is within the target ...
        story = timeline([low1, high, low2], list(controller.resizes), low1.sent[0])
        since = settled if settled is not None else high.sent[-1] - MEASURED  # (pinned: the last 2 s)
        p99, measured = high.p99(since)
        assert p99 <= TARGET, f"p99 {p99 * 1000:.0f} ms over {measured} requests at {HIGH:g}/s\n{story}"
        assert measured >= MEASURED * HIGH * 0.9, measured
        assert settled is not None, f"the pool never caught up with {HIGH:g}/s\n{story}"
        # ... because it grew when the load rose, and shrank back when it fell
        ups = [r for r in controller.resizes if r.after > r.before and r.at >= stepped]
        assert ups, list(controller.resizes)
        peak = max(r.after for r in ups)
        assert peak > low_size
        assert peak >= 2  # one worker cannot carry 1.4 workers' worth of work
        assert engine.size() == low_size < peak, list(controller.resizes)
        downs = [r for r in controller.resizes if r.after < r.before]
        assert downs
        assert downs[-1].after == low_size

        # Every resize: the numbers that justified it, the model's answer, a log line, a counter
        resizes: list[Resize] = list(controller.resizes)
        logged = [r.getMessage() for r in caplog.records if "workers: arrivals" in r.getMessage()]
        assert logged == [r.line("sign") for r in resizes]
        for r, line in zip(resizes, logged, strict=True):
            assert f"arrivals {r.rate:.1f}/s" in line
            assert f"service {r.service * 1000:.2f} ms" in line
            assert "p99 target 300 ms" in line
            assert f"predicts p99 {r.predicted_p99 * 1000:.1f} ms at {r.after}" in line
            assert r.target == TARGET
            assert r.rate > 0
            assert SERVICE * 0.9 < r.service < SERVICE * 5, r
            assert r.model_workers == size_for(r.rate, r.service, TARGET)[0]
            if r.service * math.log(100) < TARGET:
                assert r.model_workers == model_answer(r.rate, r.service, TARGET), r
            clamped = min(MAX_WORKERS, max(1, r.model_workers))
            if r.after > r.before:
                assert r.after == clamped, r
                assert r.predicted_p99 == pytest.approx(
                    mmc_response_quantile(0.99, r.after, r.service, r.rate)
                )
                if r.model_workers <= MAX_WORKERS:
                    assert r.predicted_p99 <= TARGET, r
            else:
                assert clamped <= r.after < r.before, r
        grew = [r for r in ups if r.before == low_size]
        assert grew
        assert grew[0].rate > LOW * 1.2, grew  # it grew because it saw the rate rise
        metrics = app.metrics
        up = sum(1 for r in resizes if r.after > r.before)
        assert metrics.value("foundry_pool_resizes_total", unit="sign", direction="up") == up
        assert metrics.value("foundry_pool_resizes_total", unit="sign", direction="down") == len(resizes) - up
        assert metrics.value("foundry_pool_latency_target_seconds", unit="sign") == TARGET
        for name in ("arrival_rate", "service_seconds", "predicted_p99_seconds", "target_workers"):
            assert metrics.value(f"foundry_pool_{name}", unit="sign") > 0, name
    finally:
        app.close()


def test_size_for_follows_the_model_at_its_edges() -> None:
    assert size_for(0.0, 0.01, 0.1) == (0, "no arrivals")
    workers, reason = size_for(100.0, 0.01, None)  # λS = 1: ρ ≤ 0.75 needs 2
    assert workers == 2
    assert "ρ" in reason
    workers, reason = size_for(100.0, 0.05, 0.1)  # p99 of service alone ≈ 230 ms > 100 ms
    assert "P(wait)" in reason
    assert workers > 5
    assert size_for(LOW, SERVICE, TARGET)[0] == 1  # what the test's low step expects
    assert size_for(HIGH, SERVICE, TARGET)[0] == model_answer(HIGH, SERVICE, TARGET) == 2
