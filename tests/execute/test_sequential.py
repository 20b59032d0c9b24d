"""``sequential``: runs in the caller and touches no pool, loop, thread or backend."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from foundry import Foundry
from foundry.errors import WorkTimeoutError
from foundry.observe import names
from tests.execute import workloads

ROOT = Path(__file__).resolve().parents[2]

TRIPWIRE = r"""
import asyncio, concurrent.futures, multiprocessing, queue, socket, sqlite3, sys, threading

def tripwire(what):
    def trip(*args, **kwargs):
        raise AssertionError(f"the sequential model touched {what}")
    return trip

# Given: everything a model could coordinate through raises when touched
loop = asyncio.new_event_loop()          # made before the wires: the async caller's own loop
threading.Thread.start = tripwire("a thread")
asyncio.new_event_loop = tripwire("a new event loop")
asyncio.BaseEventLoop.__init__ = tripwire("an event loop")
concurrent.futures.ThreadPoolExecutor.__init__ = tripwire("a ThreadPoolExecutor")
concurrent.futures.ProcessPoolExecutor.__init__ = tripwire("a ProcessPoolExecutor")
multiprocessing.Process.start = tripwire("a child process")
queue.SimpleQueue = tripwire("a queue")
queue.Queue.put = tripwire("a queue")
sqlite3.connect = tripwire("the embedded backend (sqlite)")
socket.socket.connect = tripwire("a broker connection")

from foundry import Foundry

app = Foundry("tripwire")

@app.work(est="1ms")
def add(a, b):
    return a + b

@app.work(est="1ms")
async def aadd(a, b):
    return a + b

# When: it is called, submitted, mapped and awaited
assert add.decision.execution == "sequential", add.decision.model
assert add(1, 2) == 3
assert add.submit(2, 3).result(0) == 5
@app.work(est="1ms")
def double(x):
    return 2 * x

assert list(double.map([1, 2, 3])) == [2, 4, 6]
assert [add.submit(i, i).result() for i in range(3)] == [0, 2, 4]
async def from_a_coroutine():
    return await aadd(3, 4), (await add.asubmit(1, 1)).result(), await (await aadd.asubmit(2, 2))

assert loop.run_until_complete(from_a_coroutine()) == (7, 2, 4)
app.metrics.prometheus()
app.close()

# Then: no model but sequential was even imported
heavy = {"foundry.execute.threads", "foundry.execute.asyncio_loop", "foundry.execute.processes",
         "foundry.execute.channels", "foundry.execute.parallel"} & set(sys.modules)
assert not heavy, heavy
print("untouched")
"""


def test_tripwire_sequential_touches_no_pool_loop_thread_or_backend(home: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", TRIPWIRE], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "untouched"


def test_calls_are_counted_and_timed(app: Foundry) -> None:
    square = app.work(model="sequential", name="square")(workloads.square)
    fail = app.work(model="sequential", name="fail")(workloads.fail_on)
    assert [square(i) for i in range(300)] == [i * i for i in range(300)]
    with pytest.raises(workloads.Boom):
        fail(3)
    labels = {"unit": "square", "model": "sequential"}
    assert app.metrics.value(names.UNIT_COMPLETED, **labels) == 300  # every call is counted
    timed = app.metrics.value(names.UNIT_DURATION, **labels)  # a histogram's count
    assert 300 // 64 <= timed < 300  # a microsecond function: one call in 64 is timed
    assert app.metrics.value(names.UNIT_IN_FLIGHT, **labels) == 0
    assert app.metrics.value(names.UNIT_FAILED, unit="fail") == 1
    slow = app.work(model="sequential", name="slow")(workloads.sleep_then)
    for _ in range(20):
        slow(0.0002)
    assert app.metrics.value(names.UNIT_DURATION, unit="slow") == 20  # slower work: every call


def test_timeout_interrupts_on_the_main_thread_and_keeps_the_outer_timer(app: Foundry) -> None:
    slow = app.work(model="sequential", timeout="100ms", name="slow")(workloads.sleep_then)
    # pytest-timeout (signal method) may have its own interval timer armed: arm one to be sure
    outer = signal.getitimer(signal.ITIMER_REAL)[0] or None
    if outer is None:
        signal.setitimer(signal.ITIMER_REAL, 60.0)
    try:
        with pytest.raises(WorkTimeoutError, match=r"timeout of 0\.1s"):
            slow(5.0)
        assert slow(0.0, "quick") == "quick"
        handle = slow.submit(5.0)
        assert isinstance(handle.exception(0), WorkTimeoutError)
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 1.0  # the outer timer is re-armed
    finally:
        if outer is None:
            signal.setitimer(signal.ITIMER_REAL, 0)


def test_timeout_off_the_main_thread_runs_to_completion_and_says_so(
    app: Foundry, caplog: pytest.LogCaptureFixture
) -> None:
    slow = app.work(model="sequential", timeout="10ms", name="slow_thread")(workloads.sleep_then)
    result: list[object] = []
    with caplog.at_level(logging.WARNING, logger="foundry.execute"):
        thread = threading.Thread(target=lambda: result.append(slow(0.05, "finished")))
        thread.start()
        thread.join(10)
    assert result == ["finished"]  # accepted work is never thrown away
    assert "cannot be interrupted" in caplog.text


def test_map_is_lazy(app: Foundry) -> None:
    seen: list[int] = []

    def record(x: int) -> int:
        seen.append(x)
        return x

    unit = app.work(model="sequential", name="record")(record)
    results = unit.map(range(100))
    assert next(results) == 0
    assert seen == [0]
