"""The loop watchdog is on by default wherever Foundry runs an event loop: the managed
loop of async units, workflow steps' loops and stream consumers' loops (the queue
worker's is in ``tests/cli/test_worker_metrics.py``); its reports name the unit, the
phase and the frame; ``watchdog=False`` turns it off; ``foundry.loop()`` is the handle.

A blocking call here spins for 250 ms while the watchdog's threshold is 100 ms and its
tick comes every 50 ms: the lateness asserted (≥ 150 ms) is set by the block itself,
not by how busy the machine is. Everything waits for an event with a deadline.
"""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
import textwrap
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import foundry
from foundry import Foundry, PoolDeadlockError
from foundry.execute.asyncio_loop import CallerLoop, LoopThread
from foundry.observe import names
from foundry.observe.metrics import Registry
from foundry.observe.stall import StallReport
from foundry.observe.watchdog import Watchdog, subscribe, watching
from foundry.profile import current_host

BLOCK = 0.25  # seconds a unit holds its loop
LATE = 0.15  # the least lateness that block must cause (block − one tick interval)
ROOT = Path(__file__).resolve().parents[2]


def pure_python_compute() -> str:
    """decide v2 for Python code measured compute-bound, 300 in flight, on this machine."""
    host = current_host()
    if host.cores == 1:
        return "sequential"
    return "bounded_pool" if host.gil is False else "processes"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def spin(seconds: float) -> int:
    """Pure-Python CPU for ``seconds``: the kind of call that must not run on a loop."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x = (x * 31 + 7) % 1_000_003
    return x


class Reports:
    """Every report of every watchdog in this process while the test runs."""

    def __init__(self) -> None:
        self.seen: list[StallReport] = []
        self.lock = threading.Lock()
        self.unsubscribe = subscribe(self.add)

    def add(self, report: StallReport) -> None:
        with self.lock:
            self.seen.append(report)

    def wait_for(self, match: Callable[[StallReport], bool], timeout: float = 10.0) -> StallReport:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                found = [r for r in self.seen if match(r)]
            if found:
                return found[0]
            time.sleep(0.01)
        raise AssertionError(
            f"no matching stall report in {timeout}s; seen: {[r.message for r in self.seen]}"
        )


@pytest.fixture
def reports() -> Iterator[Reports]:
    seen = Reports()
    yield seen
    seen.unsubscribe()


@pytest.fixture
def app(home: Path) -> Iterator[Foundry]:
    app = Foundry(unique("wd"))
    yield app
    app.close()


def lag_of(app: Foundry, loop: str) -> dict[str, float]:
    rows = app.metrics.snapshot().get(names.LOOP_LAG, [])
    return next((r for r in rows if r["labels"] == {"loop": loop}), {"count": 0.0, "sum": 0.0, "max": 0.0})


# -- the managed loop -----------------------------------------------------------------------


def test_an_async_unit_blocking_the_managed_loop_raises_its_lag_and_is_named(
    app: Foundry, reports: Reports
) -> None:
    name = unique("crunch")

    @app.work(name=name, bound="io", concurrency=300, est="40ms")  # the seed's handler: decided async
    async def crunch(n: int) -> int:
        await asyncio.sleep(0)
        return spin(BLOCK) + n

    assert crunch.decision.execution == "async"
    crunch(1)  # from sync code: on the managed loop, watched by default
    before = lag_of(app, "foundry")
    assert crunch(2) >= 2
    report = reports.wait_for(lambda r: r.unit == name)
    # Then the report names the loop, the unit, the function that held it and where
    assert report.loop == "foundry"
    assert report.culprit is not None
    assert report.culprit.function == "spin"
    assert report.culprit.filename == __file__
    assert report.phase == "spin"  # a phase of the unit nobody declared
    assert report.blocked_for >= LATE
    assert report.held_for >= LATE  # one call held it throughout (uvloop's idle tail is no holder)
    # ... and what to do about it, decided by foundry.decide, against what it is now
    assert report.decision is not None
    assert report.decision.execution == pure_python_compute()
    assert report.current is not None
    assert report.current.execution == "async"
    assert f"reclassify '{name}.spin'" in report.message
    assert "'main'" not in report.message
    # And the lag series in the app's own registry rose by at least the block
    after = lag_of(app, "foundry")
    assert after["sum"] - before["sum"] >= LATE
    assert after["max"] >= LATE
    text = app.metrics.prometheus()
    assert 'foundry_loop_lag_seconds_count{loop="foundry"}' in text
    assert f'foundry_loop_culprit_total{{loop="foundry",unit="{name}",phase="spin",culprit="spin (' in text


def test_a_unit_whose_own_body_holds_the_loop_is_named_not_main(app: Foundry, reports: Reports) -> None:
    name = unique("inline")

    @app.work(name=name, bound="io", concurrency=300, est="40ms")
    async def inline() -> int:
        end = time.perf_counter() + BLOCK
        x = 0
        while time.perf_counter() < end:  # the body itself computes on the loop
            x += 1
        return x

    inline.submit().result(30)
    report = reports.wait_for(lambda r: r.unit == name)
    assert report.phase == "main"
    assert report.culprit is not None
    assert report.culprit.function == "inline"
    assert report.subject == name
    assert report.held_for >= LATE
    assert f"The body of unit {name!r} is compute-bound: reclassify {name!r}" in report.message
    assert "reclassify 'main'" not in report.message
    # The structured event carries the same facts, JSON-ready, for a live reclassifier.
    event = json.loads(json.dumps(report.as_dict()))
    assert event["unit"] == name
    assert event["phase"] == "main"
    assert event["frame"]["function"] == "inline"
    assert event["frame"]["file"] == __file__
    assert event["lag"] >= LATE
    assert event["current"] == "direct/async"
    assert event["decision"]["execution"] == pure_python_compute()


def the_stall_of(unit: Any) -> StallReport:
    """The one report of a watchdog on a loop that awaits ``unit(b"x")`` once."""

    async def main() -> list[StallReport]:
        async with Watchdog(threshold=0.1, units=[unit], log_reports=False) as dog:
            await asyncio.sleep(0.06)
            await unit(b"x")
            await asyncio.sleep(0.15)
        return list(dog.reports)

    [report] = [r for r in asyncio.run(main()) if r.unit == unit.name]
    return report


def test_a_declared_phase_on_the_stack_is_the_phase_reported(app: Foundry) -> None:
    def sign(body: bytes) -> int:
        return spin(BLOCK)

    @app.work(bound="io", concurrency=300, est="40ms", phases={"sign": {"est": "35ms", "bound": "cpu"}})
    async def pay(body: bytes) -> int:
        return sign(body)

    report = the_stall_of(pay)
    assert report.phase == "sign"
    assert report.current is pay.phases["sign"]  # the phase's own decision, which it did not get
    assert "reclassify 'pay.sign'" in report.message


def test_a_declared_phase_is_re_decided_from_its_own_traits_not_the_units(app: Foundry) -> None:
    def sign(body: bytes) -> int:
        return spin(BLOCK)

    # The phase declares what the unit does not: its computing releases the GIL.
    @app.work(bound="io", concurrency=300, est="40ms", phases={"sign": {"est": "35ms", "releases_gil": True}})
    async def pay(body: bytes) -> int:
        return sign(body)

    report = the_stall_of(pay)
    assert report.phase == "sign"
    assert report.decision is not None
    host = current_host()
    # Re-decided from the phase's traits (releases_gil=True: a thread pool uses the cores),
    # where the unit's would give process workers under the GIL.
    expected = "sequential" if host.cores == 1 else "bounded_pool"
    assert report.decision.execution == expected
    assert report.measured is not None
    assert report.measured.bound == "cpu"
    assert report.measured.est == pytest.approx(report.held_for, abs=1e-3)
    # Nobody marked sign's call site: the report says how to let Foundry move it.
    assert not report.movable
    assert 'Run it through @pay.phase("sign") (awaited) and declare adaptive=True' in report.message


def test_foundry_loop_is_the_managed_loop_and_runs_coroutines(app: Foundry) -> None:
    handle = foundry.loop(app)
    assert isinstance(handle, LoopThread)
    assert handle is foundry.loop()  # one per process, kept for its life
    assert handle.loop.is_running()
    assert handle.thread.name == "foundry-loop"
    assert handle.watchdog is not None
    assert handle.monitor is handle.watchdog.monitor

    async def where() -> str:
        await asyncio.sleep(0)
        return threading.current_thread().name

    assert handle.run(where(), timeout=10) == "foundry-loop"
    assert handle.submit(where()).result(10) == "foundry-loop"
    with pytest.raises(TimeoutError):
        handle.run(asyncio.sleep(5), timeout=0.01)

    async def nested() -> None:
        coro = where()
        handle.run(coro)  # on the loop's own thread: would wait for itself

    with pytest.raises(PoolDeadlockError, match="await"):
        handle.run(nested(), timeout=10)
    assert handle.lag()["count"] >= 0
    assert "watchdog 100 ms" in repr(handle)
    assert any(r["labels"] == {"loop": "foundry"} for r in app.metrics.snapshot()[names.LOOP_LAG])


# -- the opt-out (a fresh process: the managed loop is one per process) --------------------

OPT_OUT = """
import asyncio, json, sys, threading, time
import foundry
from foundry import Foundry

app = Foundry("optout", home=sys.argv[1], **({{"watchdog": False}} if sys.argv[2] == "arg" else {{}}))

@app.work(bound="io", concurrency=300, est="40ms")
async def crunch() -> int:
    end = time.perf_counter() + {block}
    while time.perf_counter() < end:
        pass
    return 1

crunch()
time.sleep(0.2)
handle = foundry.loop(app)
print(json.dumps({{
    "setting": app.settings.watchdog,
    "watchdog": handle.watchdog is not None,
    "lag": handle.lag(),
    "series": [n for n in app.metrics.snapshot() if n.startswith("foundry_loop")],
    "threads": sorted(t.name for t in threading.enumerate()),
}}))
app.close()
"""


@pytest.mark.parametrize("how", ["arg", "env", "toml"])
def test_the_opt_out_runs_no_monitor_and_no_watchdog(tmp_path: Path, how: str) -> None:
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    if how == "env":
        env["FOUNDRY_WATCHDOG"] = "off"
    if how == "toml":
        (tmp_path / "foundry.toml").write_text("[foundry]\nwatchdog = false\n")
    code = textwrap.dedent(OPT_OUT.format(block=BLOCK))
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / ".foundry"), how],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["setting"] is None
    assert out["watchdog"] is False
    assert out["lag"] == {}
    assert out["series"] == []
    assert "foundry-watchdog" not in out["threads"]
    assert "foundry-loop" in out["threads"]  # the loop itself still runs the unit


def test_the_setting_is_checked_and_names_the_fix(tmp_path: Path) -> None:
    assert Foundry("a", home=tmp_path, watchdog="50ms").settings.watchdog == pytest.approx(0.05)
    assert Foundry("b", home=tmp_path, watchdog=True).settings.watchdog == pytest.approx(0.1)
    assert Foundry("c", home=tmp_path).settings.watchdog == pytest.approx(0.1)
    with pytest.raises(foundry.ConfigError, match="watchdog = false"):
        Foundry("d", home=tmp_path, watchdog="sometimes")


# -- loops Foundry makes for one call, and loops run one call at a time -------------------------


def test_a_stall_that_lasts_until_the_watched_work_returns_is_still_reported() -> None:
    registry = Registry()

    async def step() -> int:
        await asyncio.sleep(0.01)
        return spin(BLOCK)  # and returns without yielding again: the tick never runs

    seen: list[StallReport] = []
    unsubscribe = subscribe(seen.append)
    try:
        asyncio.run(watching(step(), threshold=0.1, registry=registry, name="one-call"))
    finally:
        unsubscribe()
    [report] = [r for r in seen if r.loop == "one-call"]
    assert report.blocked_for >= LATE
    assert report.culprit is not None
    assert report.culprit.function == "spin"
    assert registry.snapshot()[names.LOOP_LAG][0]["max"] >= LATE


def test_a_loop_run_one_call_at_a_time_counts_no_lag_while_it_sits_stopped() -> None:
    registry = Registry()
    runner = CallerLoop(label="calls", watchdog=0.1, registry=registry)
    try:
        assert runner.run(asyncio.sleep(0.01, "a")) == "a"
        time.sleep(0.6)  # stopped: not lag, not a stall
        assert runner.run(asyncio.sleep(0.08, "b")) == "b"
        assert runner.watchdog is not None
        assert not runner.watchdog.reports
        # Counted, the stop would show as a tick ≈ 0.55 s late; a busy machine adds far less.
        assert registry.snapshot()[names.LOOP_LAG][0]["max"] < 0.4

        async def blocks() -> int:
            await asyncio.sleep(0.01)
            return spin(BLOCK)

        runner.run(blocks())
        [report] = runner.watchdog.reports
        assert report.blocked_for >= LATE
    finally:
        runner.close()


def test_many_watchdogs_share_one_watching_thread() -> None:
    loops = [CallerLoop(label=f"many-{i}", watchdog=0.1) for i in range(4)]
    try:
        for runner in loops:
            runner.run(asyncio.sleep(0.01))
        watching_threads = [t for t in threading.enumerate() if t.name.startswith("foundry-watchdog")]
        assert len(watching_threads) == 1
    finally:
        for runner in loops:
            runner.close()


def test_an_async_workflow_step_that_blocks_names_the_workflow_and_the_step(
    tmp_path: Path, reports: Reports
) -> None:
    from foundry.deliver.workflow import configure

    app = Foundry(unique("wf"), home=tmp_path / "home")
    rt = configure(app, journal=f"sqlite:///{tmp_path / 'journal.db'}")
    try:

        async def charge(n: int) -> int:
            await asyncio.sleep(0.01)
            return spin(BLOCK) + n

        @app.workflow()
        def order(wf: Any, n: int) -> int:
            return int(wf.step(charge, n))

        assert order.run(1, id=unique("order")) >= 1
        report = reports.wait_for(lambda r: r.loop == "workflow" and r.unit == order.name)
        assert report.phase is not None
        assert report.phase.endswith("charge")  # the step's journal name
        assert report.culprit is not None
        assert report.culprit.function == "spin"
        assert lag_of(app, "workflow")["max"] >= LATE
    finally:
        app.close()
        rt.close(5)


def test_an_async_stream_handler_that_blocks_is_named_with_its_group(
    tmp_path: Path, reports: Reports
) -> None:
    app = Foundry(unique("st"), home=tmp_path / "home", stream=f"sqlite:///{tmp_path / 's.db'}")
    stream = app.stream(unique("ledger"))
    try:

        @stream.consumer(group="books")
        async def book(event: Any) -> None:
            await asyncio.sleep(0)
            spin(BLOCK)

        stream.publish({"n": 1})
        stream.drain(timeout=30)
        label = f"stream:{stream.name}/books"
        report = reports.wait_for(lambda r: r.loop == label)
        assert report.unit is not None
        assert report.unit.endswith("book")
        assert report.culprit is not None
        assert report.culprit.function == "spin"
        assert lag_of(app, label)["max"] >= LATE
    finally:
        app.close()


def test_a_loop_shared_by_apps_shows_in_each_registry_without_keeping_it_alive() -> None:
    own, other = Registry(), Registry()

    async def main(second: Registry) -> Watchdog:
        dog = Watchdog(registry=own, name="shared", threshold=0.1, log_reports=False).start()
        dog.export(second)  # a second app whose work runs on this loop
        await asyncio.sleep(0.06)
        spin(BLOCK)
        await asyncio.sleep(0.15)
        dog.stop()
        return dog

    dog = asyncio.run(main(other))
    assert dog.reports
    for registry in (own, other):
        snap = registry.snapshot()
        [lag] = [r for r in snap[names.LOOP_LAG] if r["labels"] == {"loop": "shared"}]
        assert lag["max"] >= LATE
        culprits = [r["labels"]["culprit"] for r in snap[names.LOOP_CULPRIT] if r["value"] >= 1]
        assert any(c.startswith("spin (") for c in culprits), culprits
    del registry
    gone = weakref.ref(other)
    del other
    gc.collect()
    assert gone() is None  # the loop's watchdog does not keep a closed app's registry alive


def test_a_loop_idle_in_its_own_machinery_is_held_by_nobody() -> None:
    """A late tick with the loop polling — a process short of CPU, or uvloop's stale clock
    after a long callback — is lag (measured) but no stall: nobody held the loop."""
    from foundry.observe.watchdog import _Stall

    thread = LoopThread("foundry-idle-test", watchdog=0.1)
    try:
        time.sleep(0.05)
        dog = thread.watchdog
        assert dog is not None
        sample = dog._sample()
        assert sample is not None
        assert sample.idle
        assert dog._report(_Stall(due=time.monotonic(), idle=3), 0.3, ongoing=False) is None
    finally:
        thread.stop()


def test_a_pipeline_stage_that_blocks_its_loop_is_named_and_the_opt_out_runs_none(
    reports: Reports,
) -> None:
    from foundry.execute.channels import Pipeline

    async def parse(row: int) -> int:
        await asyncio.sleep(0)
        return row

    async def score(row: int) -> int:
        await asyncio.sleep(0)
        spin(BLOCK)
        return row * 2

    registry = Registry()
    name = unique("rows")
    assert Pipeline(name=name, metrics=registry).stage(parse).stage(score).run([1, 2]) == [2, 4]
    report = reports.wait_for(lambda r: r.loop == f"channels:{name}")
    assert report.unit == name
    assert report.phase == "score"  # the stage
    assert report.culprit is not None
    assert report.culprit.function == "spin"
    quiet = Registry()
    unwatched = Pipeline(name=unique("quiet"), metrics=quiet, watchdog=None).stage(score)
    assert unwatched.run([1]) == [2]
    assert names.LOOP_LAG not in quiet.snapshot()
