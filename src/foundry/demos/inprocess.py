"""`foundry demo` — the in-process models on seed 003's examples.

1. The 40-line CSV import, sequentially (its decision: nothing in flight to overlap).
2. The payments handler on the event loop — its 35 ms signing phase inline (the
   watchdog catches it, names ``sign_body`` and proposes the new decision) and on a
   bounded pool — with a health check arriving as the first signature starts, and
   how long it waited in each case.
3. A pipeline (channels) over the CSV rows, with its buffers and blocked senders.
4. A parallel map with a progress bar, and a small input that falls back to sequential.

Every unit's decision is printed beside its metrics. No servers; a few seconds.
The payments scenario (:func:`payments_scenario`) is also what the watchdog's tests
and benchmark run.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from foundry.examples import seeds
from foundry.observe import names
from foundry.observe.metrics import Registry
from foundry.observe.watchdog import StallReport, UnitLike, Watchdog

if TYPE_CHECKING:
    from rich.console import Console

    from foundry.app import Foundry
    from foundry.execute.channels import Pipeline
    from foundry.units import WorkUnit

__all__ = ["PaymentsRun", "build_units", "checksum", "payments_scenario", "run", "sign_body"]

SIGN_SECONDS = 0.035  # the seed's RSA-4096 signature
LIVENESS = 0.100  # the seed's liveness budget: a ready health check must run within it
THRESHOLD = LIVENESS / 2  # the watchdog reports a loop held for half of that budget
UPSTREAMS = seeds.UPSTREAMS

_signed: list[float] = []
_signed_lock = threading.Lock()
_first_signing: list[Callable[[], None]] = []  # called once, when a signature starts


_BLOCK = bytes(range(256)) * 256  # 64 KiB: hashlib releases the GIL on buffers this large


@functools.cache
def _rounds() -> int:
    """Rounds of 64 KiB hashing that take about 35 ms here (measured once)."""
    probe = 200
    best = min(_time(lambda: sign_body(b"calibrate", probe)) for _ in range(5))  # the unloaded cost
    return max(10, int(probe * SIGN_SECONDS / max(best, 1e-6)))


def _time(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def sign_body(body: bytes, rounds: int | None = None) -> str:
    """The CPU phase: ~35 ms of hashing standing in for the RSA-4096 signature. Like
    RSA in ``cryptography``, it is native code that releases the GIL, so a thread pool
    takes it off the loop for real (pure-Python signing would need processes)."""
    if _first_signing:
        with _signed_lock:
            hooks = list(_first_signing)
            _first_signing.clear()
        for hook in hooks:
            hook()
    digest = hashlib.sha256(body)
    for _ in range(_rounds() if rounds is None else rounds):
        digest.update(_BLOCK)
    with _signed_lock:
        _signed.append(time.perf_counter())
    return digest.hexdigest()


def checksum(n: int) -> str:
    """The parallel map's per-item kernel: ~0.3 ms of hashing."""
    digest = n.to_bytes(8, "little")
    for _ in range(300):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()[:12]


CSV_TEXT = "id,amount,currency\n" + "\n".join(f"{i},{i * 3 % 97}.50,EUR" for i in range(1, 41)) + "\n"


# -- the units ------------------------------------------------------------------------


@dataclass
class Units:
    import_csv: WorkUnit
    sign: WorkUnit
    handle_payment: WorkUnit
    handle_payment_inline: WorkUnit
    import_rows: WorkUnit
    checksum: WorkUnit

    def all(self) -> list[WorkUnit]:
        return [
            self.import_csv,
            self.handle_payment_inline,
            self.handle_payment,
            self.sign,
            self.import_rows,
            self.checksum,
        ]


@dataclass
class _Batch:
    """The scenario's upstream replies: they arrive for every request at once."""

    expected: int
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    all_waiting: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: int = 0


_batch: list[_Batch] = []


async def _upstreams() -> list[str]:
    async def call(upstream: str) -> str:
        await asyncio.sleep(0.005)  # stand-in for an HTTP call
        return f"{upstream}:ok"

    replies = list(await asyncio.gather(*(call(name) for name in UPSTREAMS)))
    if _batch:  # in the scenario: hold until every request's replies are in
        batch = _batch[0]
        batch.waiting += 1
        if batch.waiting == batch.expected:
            batch.all_waiting.set()
        await batch.arrived.wait()
    return replies


def build_units(app: Foundry) -> Units:
    """Declare the demo's units on ``app`` (the seeds' traits and bodies)."""
    import_csv = app.work(est="30ms", items=40, bound="io", name="import_csv")(seeds.import_csv.fn)

    # hashlib over a large block releases the GIL, like RSA in `cryptography`: threads use cores
    sign = app.work(est="35ms", bound="cpu", concurrency=2, releases_gil=True, name="sign")(sign_body)

    @app.work(est="40ms", bound="io", concurrency=300, rate="300/s", latency="50ms", name="handle_payment")
    async def handle_payment(payment: dict[str, Any]) -> dict[str, Any]:
        replies = await _upstreams()
        handle = await sign.asubmit(repr(payment).encode())  # the CPU phase, off the loop
        return {"payment": payment, "upstreams": replies, "signature": await handle}

    @app.work(
        est="40ms", bound="io", concurrency=300, rate="300/s", latency="50ms", name="handle_payment_inline"
    )
    async def handle_payment_inline(payment: dict[str, Any]) -> dict[str, Any]:
        replies = await _upstreams()
        signature = sign_body(repr(payment).encode())  # nobody reclassified: inline, on the loop
        return {"payment": payment, "upstreams": replies, "signature": signature}

    @app.work(stages=3, bound="io", name="import_rows")
    def import_rows(p: Pipeline) -> Pipeline:
        return p.stage(_parse, concurrency=2, buffer=8).stage(_enrich, concurrency=8, buffer=8).stage(_store)

    parallel = app.work(partitionable=True, bound="cpu", name="checksum")(checksum)
    return Units(import_csv, sign, handle_payment, handle_payment_inline, import_rows, parallel)


def _parse(line: str) -> dict[str, str]:
    ident, amount, currency = line.split(",")
    return {"id": ident, "amount": amount, "currency": currency}


async def _enrich(row: dict[str, str]) -> dict[str, str]:
    await asyncio.sleep(0.002)  # an FX lookup
    return {**row, "eur": row["amount"]}


def _store(row: dict[str, str]) -> str:
    time.sleep(0.001)  # an INSERT
    return row["id"]


# -- the payments scenario --------------------------------------------------------------


@dataclass
class PaymentsRun:
    """What one run of the payments scenario measured."""

    variant: str
    health_wait: float
    """Seconds the health check sat ready (from when the first signature started) before it ran."""
    health_ran_at: float
    signed_at: list[float]
    reports: list[StallReport]
    lag: dict[str, float]
    elapsed: float
    results: list[Any] = field(default_factory=list)

    @property
    def health_ran_before_last_signature(self) -> bool:
        return bool(self.signed_at) and self.health_ran_at < max(self.signed_at)

    @property
    def health_ran_after_first_signature(self) -> bool:
        return bool(self.signed_at) and self.health_ran_at > min(self.signed_at)


async def payments_scenario(
    handler: Callable[[dict[str, Any]], Awaitable[Any]],
    *,
    variant: str,
    units: Iterable[UnitLike] = (),
    payments: int = 6,
    threshold: float = THRESHOLD,
    registry: Registry | None = None,
) -> PaymentsRun:
    """The seed's schedule: six payments accepted, their upstream replies arrive together
    so all six are ready to sign at once, and a health check arrives (is made ready on the
    loop) the moment the first signature starts; a watchdog with ``threshold`` watches the
    loop. Runs on the caller's loop."""
    _rounds()  # calibrate before measuring
    loop = asyncio.get_running_loop()
    ready_at: list[float] = []
    ran_at: list[float] = []
    checked = loop.create_future()

    def health_check() -> str:  # the probe's handler: trivial, it only needs the loop
        ran_at.append(time.perf_counter())
        if not checked.done():
            checked.set_result(None)
        return "200 OK"

    def arrives() -> None:  # runs where the first signature starts (the loop, or a pool thread)
        ready_at.append(time.perf_counter())
        loop.call_soon_threadsafe(health_check)

    with _signed_lock:
        _signed.clear()
        _first_signing[:] = [arrives]
    watchdog = Watchdog(registry=registry, name=variant, threshold=threshold, units=units, log_reports=False)
    async with watchdog:
        await asyncio.sleep(0.06)  # let the monitor take its first ticks
        started = time.perf_counter()
        batch = _Batch(payments)
        _batch[:] = [batch]
        try:
            work = asyncio.gather(*(handler({"id": i, "amount": 100 + i}) for i in range(payments)))
            gate = asyncio.ensure_future(batch.all_waiting.wait())
            either: set[asyncio.Future[Any]] = {gate, work}
            await asyncio.wait(either, timeout=30, return_when=asyncio.FIRST_COMPLETED)
            gate.cancel()
            batch.arrived.set()  # all six ready at once
            results = await asyncio.wait_for(work, 30)
            await asyncio.wait_for(checked, 30)
        finally:
            _batch.clear()
        elapsed = time.perf_counter() - started
        await asyncio.sleep(max(0.05, threshold))  # let the watchdog see the loop come back
    with _signed_lock:
        signed = list(_signed)
    return PaymentsRun(
        variant=variant,
        health_wait=max(0.0, ran_at[0] - ready_at[0]),
        health_ran_at=ran_at[0],
        signed_at=signed,
        reports=list(watchdog.reports),
        lag=watchdog.monitor.summary(),
        elapsed=elapsed,
        results=list(results),
    )


# -- the demo -----------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds >= 0.001 else f"{seconds * 1e6:.0f} µs"


def _unit_metrics(registry: Registry, unit: str) -> dict[str, float]:
    snapshot = registry.snapshot()
    out: dict[str, float] = {}
    for key, metric in (("completed", names.UNIT_COMPLETED), ("failed", names.UNIT_FAILED)):
        out[key] = sum(r["value"] for r in snapshot.get(metric, []) if r["labels"].get("unit") == unit)
    for row in snapshot.get(names.UNIT_DURATION, []):
        if row["labels"].get("unit") == unit and row["count"]:
            out["p50"], out["p99"] = row["p50"], row["p99"]
    return out


def run(console: Console) -> None:
    from rich.table import Table

    from foundry.app import Foundry
    from foundry.execute.parallel import ParallelRunner

    app = Foundry("inprocess-demo")
    units = build_units(app)
    extra: dict[str, str] = {}
    try:
        # 1. the CSV import, sequentially
        console.print("[bold]1. CSV import[/bold] — 40 lines, run where it is called")
        rows = units.import_csv(CSV_TEXT)
        for _ in range(9):
            units.import_csv(CSV_TEXT)
        console.print(f"   imported {rows} rows ×10 → {units.import_csv.decision.model}\n")

        # 2. payments: inline signing vs signing on a pool, a watchdog on the loop
        console.print(
            "[bold]2. Payments handler[/bold] — 6 payments (4 upstream awaits + a 35 ms signature "
            "each), a health check arriving as the first signature starts, liveness budget "
            f"{_ms(LIVENESS)}, watchdog threshold {_ms(THRESHOLD)}"
        )

        async def both() -> tuple[PaymentsRun, PaymentsRun]:
            watched = [units.handle_payment_inline, units.handle_payment]
            for unit in watched:  # make their runners here, not while the loop is watched
                assert unit.runner is not None
            await (await units.sign.asubmit(b"warm-up"))  # start the pool's threads first
            # `await unit(...)` runs in the caller's task: on this loop, the one watched.
            inline = await payments_scenario(
                units.handle_payment_inline, variant="inline", units=watched, registry=app.metrics
            )
            pooled = await payments_scenario(
                units.handle_payment, variant="pooled", units=watched, registry=app.metrics
            )
            return inline, pooled

        inline, pooled = asyncio.run(both())
        table = Table(title="the health check, and the loop, in both layouts", title_justify="left")
        for column in ("signing", "health-check wait", "loop lag p99", "loop lag max", "watchdog"):
            table.add_column(column)
        for result, where in ((inline, "inline on the loop"), (pooled, "on sign's bounded pool")):
            fired = f"[red]{len(result.reports)} stall(s)[/red]" if result.reports else "[green]quiet[/green]"
            wait = _ms(result.health_wait)
            style = "red" if result.health_wait > LIVENESS else "green"
            table.add_row(
                where, f"[{style}]{wait}[/{style}]", _ms(result.lag["p99"]), _ms(result.lag["max"]), fired
            )
        console.print(table)
        for report in inline.reports[:1]:
            console.print(f"   [yellow]watchdog:[/yellow] {report.message}")
            if report.decision is not None:
                extra["handle_payment_inline"] = f"watchdog → {report.phase}: {report.decision.model}"
        if inline.health_wait > LIVENESS:
            console.print(
                f"   inline, the health check was ready for {_ms(inline.health_wait)} without running: "
                f"past the {_ms(LIVENESS)} liveness budget while the process was healthy.\n"
            )

        # 3. a pipeline over the CSV rows
        console.print("[bold]3. Pipeline[/bold] — parse (2) → enrich, async (8) → store (1), buffers of 8")
        lines = CSV_TEXT.splitlines()[1:] * 5
        stored = list(units.import_rows.map(lines))
        stages = ", ".join(
            f"{stage}: {_unit_metrics(app.metrics, f'import_rows.{stage}').get('completed', 0):.0f}"
            for stage in ("_parse", "_enrich", "_store")
        )
        console.print(f"   {len(stored)} rows through 3 stages, in input order ({stages})\n")
        extra["import_rows"] = f"per stage: {stages}"

        # 4. a parallel map
        console.print("[bold]4. Parallel map[/bold] — checksum over 6000 items on processes")
        sums = units.checksum(list(range(6000)))
        runner = units.checksum.runner
        assert isinstance(runner, ParallelRunner)
        plan = runner.last_plan
        console.print(f"   {len(sums)} checksums, order restored; plan: {plan.note if plan else '?'}")
        units.checksum(list(range(12)))
        small = runner.last_plan
        console.print(f"   12 items: [yellow]{small.note if small else '?'}[/yellow]\n")
        utilisation = app.metrics.value(names.CPU_UTILISATION, unit="checksum")
        extra["checksum"] = f"cpu utilisation {utilisation:.0%}; last run: {small.note if small else ''}"
    finally:
        app.close()

    summary = Table(title="each unit's decision beside its metrics", title_justify="left")
    for column in ("unit", "decision", "decided by", "done", "failed", "p50", "p99"):
        summary.add_column(column, no_wrap=True)
    for unit in units.all():
        m = _unit_metrics(app.metrics, unit.name)
        summary.add_row(
            unit.name,
            unit.decision.model,
            unit.decision.decided_by,
            f"{m.get('completed', 0):.0f}",
            f"{m.get('failed', 0):.0f}",
            _ms(m["p50"]) if "p50" in m else "-",
            _ms(m["p99"]) if "p99" in m else "-",
        )
    console.print(summary)
    for name, note in extra.items():
        console.print(f"   [dim]{name}:[/dim] {note}")
    lag = app.metrics.snapshot().get(names.LOOP_LAG, [])
    lag_text = ", ".join(
        f"{row['labels']['loop']}: p99 {_ms(row['p99'])} max {_ms(row['max'])}" for row in lag
    )
    console.print(f"   [dim]loop lag ({names.LOOP_LAG}):[/dim] {lag_text}")
