"""Live reclassification: a phase that holds the event loop moves to a pool at run time.

The seed's incident, scaled to this machine: an async payments handler gains a 35 ms
pure-Python CPU step (``spin_sign``, computing for 35 ms of wall time). Arrivals are
open-loop at 45/s: 1.6 cores of signing, past the 28/s one loop can sign inline, within
the 57/s two process workers can. The health check is a probe on the same loop that
sleeps 10 ms at a time and records how late it woke.

Assertions are about behaviour with wide margins: the probe starved before the move
(it missed a 100 ms budget and ran a fraction of its ticks), exactly one move happened,
the probe met the budget after it, every request was answered once with the right
signature, and a unit that did not opt in stayed inline and was only told. The mover's
rules are checked with reports built by hand (their clock is the report's ``at``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from rich.console import Console

import foundry
from foundry import DeclarationError, Foundry
from foundry.decide import Measured, reclassify
from foundry.execute.adaptive import MOVE_WITHIN, PhaseMover
from foundry.execute.phase import Phase
from foundry.observe import names
from foundry.observe.dashboard.live import Live, plan_units
from foundry.observe.dashboard.sources import Sources
from foundry.observe.stall import FrameInfo, StallReport
from foundry.observe.top import render_snapshot
from foundry.observe.watchdog import subscribe
from foundry.profile import current_host
from tests.execute.workloads import sleep_then, spin_sign
from tests.observe.test_default_watchdog import pure_python_compute

RATE = 45.0  # requests per second
STEP = 0.035  # seconds of CPU per request: the signing step
PROBE = 0.01  # the health check's period
BUDGET = 0.1  # the health check's liveness budget
AFTER = 1.5  # seconds the load goes on once the phase has moved


def signature(i: int) -> str:
    return hashlib.sha256(f"payment {i}".encode()).hexdigest()[:16]


def declare(app: Foundry, name: str, *, adaptive: bool) -> tuple[Any, Phase]:
    """The seed's handler: one upstream call (waiting), then the new signing step."""

    @app.work(name=name, est="45ms", bound="io", rate=f"{RATE:g}/s", concurrency=300, adaptive=adaptive)
    async def pay(i: int) -> tuple[int, str]:
        await asyncio.sleep(0.005)  # the upstream call
        return i, await sign(f"payment {i}", STEP)  # the step nobody reclassified

    sign = pay.phase("sign")(spin_sign)
    return pay, sign


class Load:
    """Open-loop arrivals on the loop that runs them, and a health-check probe beside them."""

    def __init__(self, unit: Any) -> None:
        self.unit = unit
        self.probes: list[tuple[float, float]] = []  # (time.time() at wake-up, lateness)
        self.answers: dict[int, list[tuple[int, str]]] = {}
        self.sent = 0

    async def run(self, until: Callable[[], bool], deadline: float) -> None:
        done = asyncio.Event()

        async def probe() -> None:
            while not done.is_set():
                due = time.perf_counter() + PROBE
                await asyncio.sleep(PROBE)
                self.probes.append((time.time(), time.perf_counter() - due))

        async def request(i: int) -> None:
            answer = await self.unit(i)
            self.answers.setdefault(i, []).append(answer)

        prober = asyncio.create_task(probe())
        requests: list[asyncio.Task[None]] = []
        start = time.monotonic()
        while True:
            now = time.monotonic()
            stop = until() or now >= deadline
            while start + self.sent / RATE <= now:  # every arrival due by now, late or not: open loop
                requests.append(asyncio.create_task(request(self.sent)))
                self.sent += 1
            if stop:
                break
            await asyncio.sleep(max(0.0, start + self.sent / RATE - time.monotonic()))
        await asyncio.wait_for(asyncio.gather(*requests), 60)
        done.set()
        await asyncio.wait_for(prober, 5)

    def lateness(self, since: float = 0.0, before: float = float("inf")) -> list[float]:
        return [late for at, late in self.probes if since <= at < before]


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


@pytest.fixture
def stalls() -> Iterator[list[StallReport]]:
    seen: list[StallReport] = []
    lock = threading.Lock()

    def add(report: StallReport) -> None:
        with lock:
            seen.append(report)

    unsubscribe = subscribe(add)
    yield seen
    unsubscribe()


def answered_once(load: Load) -> None:
    assert sorted(load.answers) == list(range(load.sent))
    assert all(len(answers) == 1 for answers in load.answers.values())
    assert all(answers == [(i, signature(i))] for i, answers in load.answers.items())


# -- the incident -----------------------------------------------------------------------------


def test_the_seeds_incident_moves_signing_off_the_loop_once_and_the_health_check_recovers(
    app: Foundry, caplog: pytest.LogCaptureFixture
) -> None:
    # Given: an adaptive handler whose signing runs inline on Foundry's managed loop
    pay, sign = declare(app, "pay", adaptive=True)
    assert sign.inline
    assert pay.phases["sign"].model == "direct/async"
    mover = app.phase_mover()
    moved_at: list[float] = []

    def moved() -> bool:
        if not sign.inline and not moved_at:
            moved_at.append(time.time())
        return bool(moved_at) and time.time() > moved_at[0] + AFTER

    # When: requests arrive at 45/s until the phase has moved and 1.5 s more
    load = Load(pay)
    caplog.set_level(logging.WARNING, logger="foundry.adaptive")
    foundry.loop(app).run(load.run(moved, deadline=time.monotonic() + 30), timeout=90)

    # Then: it moved exactly once, to the model the measurement decides on this machine
    assert moved_at, f"the phase never moved; probes: {len(load.probes)}, sent {load.sent}"
    [move] = mover.moved
    assert move.subject == "pay.sign"
    assert move.before.model == "direct/async"
    assert move.after.execution == pure_python_compute()
    assert move.reports == 3
    assert sign.decision is move.after
    assert pay.phases["sign"] is move.after  # app.plan(), explain and the dashboard read this
    assert dict(app.plan()[0][2])["sign"] is move.after
    [row] = [u for u in plan_units(app) if u["name"] == "pay"]
    assert row["phases"][1]["execution"] == move.after.execution
    labels = {"unit": "pay", "phase": "sign", "from": "direct/async", "to": move.after.model}
    assert app.metrics.value(names.PHASE_MOVED, **labels) == 1
    assert app.metrics.value(names.UNIT_COMPLETED, unit="pay.sign", model=move.after.execution) > 0
    [logged] = [r for r in caplog.records if r.name == "foundry.adaptive"]
    assert logged.getMessage().startswith(
        f"reclassified 'pay.sign': direct/async → {move.after.model} (loop watchdog, held ≈ "
    )
    assert logged.getMessage().endswith("×3): moved off the loop")
    # ... before the move the health check starved: past its budget, a fraction of its ticks
    before = load.lateness(before=move.at)
    ticks = (move.at - load.probes[0][0]) / PROBE if load.probes else 0.0
    assert before
    assert max(before) > BUDGET
    assert len(before) < 0.25 * ticks, (len(before), ticks)
    # ... after it, the health check met its budget (the loop only awaits the pool now)
    after = load.lateness(since=moved_at[0] + 0.2)
    assert len(after) > 0.5 * (AFTER - 0.2) / PROBE, len(after)
    assert p99(after) < BUDGET, (p99(after), statistics.median(after))
    # ... and every request was answered exactly once, with its own signature
    answered_once(load)


def test_a_unit_that_did_not_opt_in_keeps_its_phase_inline_and_is_told_how(
    app: Foundry, stalls: list[StallReport]
) -> None:
    pay, sign = declare(app, "pay_fixed", adaptive=False)

    def reported(count: int) -> Callable[[], bool]:
        return lambda: sum(r.unit == "pay_fixed" and r.phase == "sign" for r in list(stalls)) >= count

    load = Load(pay)
    foundry.loop(app).run(load.run(reported(3), deadline=time.monotonic() + 30), timeout=90)

    mine = [r for r in stalls if r.unit == "pay_fixed" and r.phase == "sign"]
    assert len(mine) >= 3  # what moves an adaptive phase (three within ten seconds)
    assert app.phase_mover().sync()
    assert sign.inline
    assert sign.runner is None
    assert not app.phase_mover().moved
    assert pay.phases["sign"].model == "direct/async"
    assert names.PHASE_MOVED not in app.metrics.snapshot() or not app.metrics.snapshot()[names.PHASE_MOVED]
    report = next(r for r in mine if not r.saturated)
    assert report.movable
    assert not report.adaptive
    assert report.current is not None
    assert report.current.model == "direct/async"
    assert report.decision is not None
    assert report.decision.execution == pure_python_compute()
    assert report.message.endswith("Declare adaptive=True to move it automatically")
    answered_once(load)


# -- the mover's rules, with reports built by hand ---------------------------------------------


def report_about(
    phase: Phase,
    *,
    at: float,
    saturated: bool = False,
    caller: bool = False,
    function: Callable[..., Any] | None = None,
) -> StallReport:
    measured = Measured(est=STEP, bound="cpu", source="loop watchdog")
    traits = phase.traits.merged(concurrency=None, rate=None) if caller else phase.traits
    decision = reclassify(traits, measured, phase=phase.name, host=current_host())
    code = (function or phase.fn).__code__
    frame = FrameInfo(code.co_name, code.co_filename, code.co_firstlineno, "tests.execute.workloads")
    return StallReport(
        loop="test",
        blocked_for=0.2,
        held_for=STEP,
        culprit=frame,
        task="Task-1",
        coroutine="pay",
        unit=phase.unit,
        phase=phase.name,
        decision=None if saturated else decision,
        stack=(frame,),
        samples=8,
        saturated=saturated,
        current=phase.decision,
        measured=measured,
        movable=True,
        adaptive=phase.adaptive,
        at=at,
    )


def not_spin_sign(body: str, seconds: float) -> str:
    return body


@pytest.mark.parametrize(
    ("case", "adaptive", "times", "options"),
    [
        ("two reports are not yet the phase", True, (0.0, 1.0), {}),
        ("three, but not within ten seconds", True, (0.0, 0.6 * MOVE_WITHIN, 1.2 * MOVE_WITHIN), {}),
        ("a saturated loop is no phase's fault", True, (0.0, 1.0, 2.0), {"saturated": True}),
        ("re-decided to its caller, which is the loop", True, (0.0, 1.0, 2.0), {"caller": True}),
        ("another function of the same names", True, (0.0, 1.0, 2.0), {"function": not_spin_sign}),
        ("the unit did not opt in", False, (0.0, 1.0, 2.0), {}),
    ],
)
def test_the_mover_leaves_a_phase_inline_unless_the_evidence_says_move_it(
    app: Foundry, case: str, adaptive: bool, times: tuple[float, ...], options: dict[str, Any]
) -> None:
    _, sign = declare(app, "pay", adaptive=adaptive)
    mover = app.phase_mover()
    now = time.time()
    for offset in times:
        mover.receive(report_about(sign, at=now + offset, **options))
    assert mover.sync(), case
    assert sign.inline, case
    assert not mover.moved, case


def test_three_reports_within_ten_seconds_move_it_and_later_ones_change_nothing(app: Foundry) -> None:
    _, sign = declare(app, "pay", adaptive=True)
    mover = app.phase_mover()
    now = time.time()
    for offset in (0.0, 4.0, 8.0, 9.0, 9.5):
        mover.receive(report_about(sign, at=now + offset))
    assert mover.sync(30)
    [move] = mover.moved
    assert move.reports == 3
    assert sign.decision.execution == pure_python_compute()

    async def call() -> str:
        return str(await sign("x", 0.0))

    digest = asyncio.run(call())
    assert digest == hashlib.sha256(b"x").hexdigest()[:16]
    if sign.decision.execution == "processes":
        assert app.metrics.value(names.UNIT_COMPLETED, unit="pay.sign", model="processes") == 1
    # `foundry top` shows the move; the dashboard's plan shows the new decision
    console = Console(record=True, width=200)
    console.print(render_snapshot(app.metrics.snapshot()))
    shown = console.export_text()
    assert "Phases moved" in shown
    [line] = [line for line in shown.splitlines() if "phase_moved_total" in line]
    assert f"unit=pay, phase=sign, from=direct/async, to={move.after.model}" in line
    assert line.rstrip(" │").endswith(" 1")
    live = Live(Sources(app=app))
    [row] = [u for u in live.plan() if u["name"] == "pay"]
    assert [p["execution"] for p in row["phases"]] == ["async", move.after.execution]


def test_a_phase_a_child_cannot_import_moves_to_a_thread_pool_and_says_what_that_costs(
    app: Foundry, caplog: pytest.LogCaptureFixture
) -> None:
    if current_host().cores == 1 or current_host().gil is False:
        pytest.skip("only pure Python under the GIL on several cores is decided onto processes")

    def local_sign(body: str, seconds: float) -> tuple[str, int]:  # a closure: no child can import it
        return body, threading.get_ident()

    @app.work(name="pay", est="45ms", bound="io", rate="45/s", concurrency=300, adaptive=True)
    async def pay(body: str) -> tuple[str, int]:
        return await sign(body, 0.0)

    sign = pay.phase("sign")(local_sign)
    mover = app.phase_mover()
    caplog.set_level(logging.WARNING, logger="foundry.adaptive")
    now = time.time()
    for offset in (0.0, 1.0, 2.0):
        mover.receive(report_about(sign, at=now + offset))
    assert mover.sync(30)
    [move] = mover.moved
    assert move.after.execution == "bounded_pool"
    assert "cpu-threads-under-gil" in {w.code for w in move.after.warnings}
    message = caplog.records[-1].getMessage()
    assert "on a bounded thread pool, not processes: a child process cannot import its function" in message
    assert "Fix: define the function at the top level of an importable module" in message

    async def call() -> tuple[tuple[str, int], int]:
        return await pay("x"), threading.get_ident()

    (body, worker), loop_thread = asyncio.run(call())
    assert body == "x"
    assert worker != loop_thread  # on a pool thread, off the loop


# -- the hook itself ---------------------------------------------------------------------------


def test_an_inline_phase_runs_in_the_callers_task_and_raises_there(app: Foundry) -> None:
    def check(x: int) -> int:
        if x < 0:
            raise ValueError(f"negative: {x}")
        return threading.get_ident()

    @app.work(est="40ms", bound="io", concurrency=100)
    async def handler(x: int) -> int:
        return await hooked(x)

    hooked = handler.phase("check")(check)
    assert hooked.inline
    assert hooked.__name__ == "check"
    assert hooked.fn(1) == threading.get_ident()

    async def main() -> tuple[int, int]:
        return await handler(1), threading.get_ident()

    ran_on, loop_thread = asyncio.run(main())
    assert ran_on == loop_thread
    with pytest.raises(ValueError, match="negative: -1"):
        asyncio.run(handler(-1))
    assert "check" in handler.phases
    assert handler.phases["check"].model == "direct/async"


def test_a_phase_declared_compute_bound_runs_on_process_workers_from_its_first_call() -> None:
    from tests.execute.declared import app as declared_app
    from tests.execute.declared import checkout, seal

    try:
        assert seal.decision.execution == "processes"
        body, child = checkout("paid")  # from sync code: on the managed loop
        assert body == "PAID"
        assert child != os.getpid()  # the child imported the module and ran the function
        assert declared_app.metrics.value(names.UNIT_COMPLETED, unit="checkout.seal", model="processes") == 1
    finally:
        declared_app.close()


def test_a_process_pool_phase_that_waits_is_reported_as_drift_with_its_new_decision(
    app: Foundry, caplog: pytest.LogCaptureFixture
) -> None:
    @app.work(est="40ms", bound="io", concurrency=20, phases={"lookup": {"bound": "cpu", "est": "10ms"}})
    async def handler(x: int) -> Any:
        return await lookup(0.01, x)

    lookup = handler.phase("lookup")(sleep_then)  # declared computing, but it sleeps
    assert lookup.decision.execution in ("processes", "sequential")
    if lookup.decision.execution != "processes":
        pytest.skip("one core: the phase is decided into its caller, no process pool to measure")
    caplog.set_level(logging.WARNING, logger="foundry.adaptive")

    async def main() -> list[Any]:
        return await asyncio.gather(*(handler(i) for i in range(60)))

    assert asyncio.run(main()) == list(range(60))
    deadline = time.monotonic() + 15
    while lookup.drift is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lookup.drift is not None, "no drift reported for a phase that waited on process workers"
    assert lookup.drift.execution != "processes"  # waiting: tens in flight are threads' work, not cores'
    assert lookup.drift.load.computing is False
    assert any(
        n.startswith("reclassified: declared bound='cpu' but process pool measured 'io'")
        for n in lookup.drift.notes
    )
    assert lookup.decision.execution == "processes"  # reported, not moved back
    [logged] = [r for r in caplog.records if r.name == "foundry.adaptive"]
    assert logged.getMessage().startswith("drift 'handler.lookup': it runs on direct/processes, but its last")
    assert "(waiting-bound)" in logged.getMessage()
    labels = {"unit": "handler", "phase": "lookup", "to": lookup.drift.model}
    assert app.metrics.value(names.PHASE_DRIFT, **labels) == 1


def test_closing_the_app_stops_the_mover_and_the_phases_pools(home: Any) -> None:
    app = Foundry("adaptive-close")
    _, sign = declare(app, "pay", adaptive=True)
    mover = app.phase_mover()
    now = time.time()
    for offset in (0.0, 1.0, 2.0):
        mover.receive(report_about(sign, at=now + offset))
    assert mover.sync(30)
    runner = sign.runner
    assert runner is not None
    pids = list(getattr(getattr(runner, "pool", None), "pids", list)())
    assert mover.running
    movers = {t for t in threading.enumerate() if t.name == "foundry-phase-mover"}
    app.close(timeout=5)
    assert not mover.running
    assert not {t for t in threading.enumerate() if t.name == "foundry-phase-mover"} & movers
    assert sign.runner is None
    for pid in pids:
        deadline = time.monotonic() + 5
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not os.path.exists(f"/proc/{pid}"), f"child {pid} outlived app.close()"
    assert not mover.sync(0.5)  # closed: nothing acts any more


# -- declarations that cannot work -------------------------------------------------------------


def _plain(x: int) -> int:
    return x


async def _coro(x: int) -> int:
    return x


@pytest.mark.parametrize(
    ("declare_it", "field", "says"),
    [
        (lambda app: app.work(adaptive=True)(_plain), "adaptive", "is a plain function"),
        (
            lambda app: app.work(adaptive=True, durable=True, est="2s")(_coro),
            "adaptive",
            "delivered by queue",
        ),
        (lambda app: app.work(adaptive=True, model="processes")(_coro), "adaptive", "not on a loop"),
        (lambda app: app.work(phases={"s": {"adaptive": True}})(_plain), "adaptive", "is a plain function"),
        (lambda app: app.workflow(adaptive=True)(lambda wf: None), "adaptive", "a workflow"),
        (lambda app: app.stream("s", adaptive=True), "adaptive", "a stream"),
        (lambda app: app.work()(_plain).phase("s")(_plain), "phase", "is a plain function"),
        (lambda app: app.work(bound="io")(_coro).phase("main")(_plain), "phase", "not a usable phase name"),
        (lambda app: app.work(bound="io")(_coro).phase("s")(_coro), "fn", "is an async function"),
        (
            lambda app: app.work(bound="io", phases={"s": {"bound": "cpu"}})(_coro).phase("s", est="1s")(
                _plain
            ),
            "traits",
            "in the unit's phases=",
        ),
        (lambda app: app.work(bound="io")(_coro).phase("s", stages=3)(_plain), "model", "a phase hook runs"),
        (
            lambda app: app.work(bound="io")(_coro).phase("s", durable=True)(_plain),
            "model",
            "a phase hook runs",
        ),
    ],
)
def test_a_declaration_that_cannot_work_names_the_unit_the_field_and_the_fix(
    home: Any, declare_it: Callable[[Foundry], Any], field: str, says: str
) -> None:
    app = Foundry("adaptive-errors")
    try:
        with pytest.raises(DeclarationError) as caught:
            declare_it(app)
        assert caught.value.field == field
        assert says in str(caught.value)
        assert caught.value.unit
        assert caught.value.fix
    finally:
        app.close()


def test_one_function_per_phase(app: Foundry) -> None:
    @app.work(bound="io", est="40ms", concurrency=10)
    async def handler(x: int) -> int:
        return x

    handler.phase("check")(_plain)
    with pytest.raises(DeclarationError, match="already has its function"):
        handler.phase("check")(spin_sign)


def test_the_mover_is_the_apps_and_starts_no_thread_until_it_has_work(home: Any) -> None:
    app = Foundry("adaptive-lazy")
    try:
        declare(app, "pay", adaptive=True)
        assert isinstance(app.phase_mover(), PhaseMover)
        assert app.phase_mover() is app.phase_mover()
        assert not app.phase_mover().running  # declaring (in a child process, say) starts nothing
    finally:
        app.close()
