"""Live reclassification on the seed's incident: the health check before and after
Foundry moves a 35 ms signing step off the event loop, against the hand-written fix.

    python bench/adaptive.py                 # 3 paired rounds at 35 requests/s
    python bench/adaptive.py --rate 45 --rounds 5 --seconds 4
    python bench/adaptive.py --quick --json  # the smoke run (tests/bench): 1 s of 5/s, 150 ms signings

The handler: one 5 ms upstream call (awaited), then signing — 35 ms of SHA-256 rounds in
Python under the GIL (calibrated on this machine, best of five). Requests arrive open-loop
at ``--rate`` (35/s by default: 1.2 cores of signing, past the 28/s one loop can sign, within
the 57/s two cores can, with room for a machine shared with others; scale it to yours). A
health check on the same loop sleeps 10 ms at a time; its latency is how late it ran. A
payment's latency runs from when it was due to arrive (open loop: no coordinated omission)
to its answer.

Per round, in alternating order (so the machine's drift lands on every variant alike):

- **foundry adaptive**: ``@app.work(..., adaptive=True)`` with ``await sign(body)`` through
  ``@pay.phase("sign")``, on Foundry's managed loop. *before*: from the start until the
  move (the watchdog's three reports, the pool's start); *after*: the health check from
  0.2 s after the move, payments due once the backlog built before the move has been
  answered (plus ``--settle``), for ``--seconds``. The time to the move and the time the
  backlog took to drain are reported too.
- **plain inline**: the same handler on a plain loop (the same loop implementation),
  signing inline: the incident itself.
- **plain executor**: the hand-written fix, ``await loop.run_in_executor(ProcessPoolExecutor,
  sign, body)`` with one process per core, started before the load.

Figures: p50/p99 of both latencies per variant, and per round the ratios foundry-after ÷
plain-executor (how close the automatic move gets to the fix written by hand) and
before ÷ after; the median of the per-round ratios with their range.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures as cf
import hashlib
import json
import math
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

PROBE = 0.01  # the health check's period
UPSTREAM = 0.005  # the awaited upstream call
GIVE_UP = 30.0  # seconds to wait for the move, and then for the backlog to drain


# -- the workload (importable by child processes as __mp_main__.sign_body) -------------------------


def sign_body(body: bytes, rounds: int) -> str:
    """Stand-in for the RSA signature: SHA-256 rounds in Python (32-byte inputs: hashlib
    keeps the GIL for them), as the seed's ``sign_body``."""
    digest = body
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()[:16]


def calibrate(target: float) -> int:
    """Rounds that take ``target`` seconds of CPU here (best of five, timed in CPU time of
    this thread: other processes on the machine lengthen the wall time, not this)."""
    probe = 20_000
    best = min(_cpu(lambda: sign_body(b"calibrate", probe)) for _ in range(5))
    return max(1, round(probe * target / best))


def _cpu(fn: Callable[[], Any]) -> float:
    start = time.thread_time()
    fn()
    return time.thread_time() - start


def _warm(_: int) -> int:
    return os.getpid()


# -- one run of load --------------------------------------------------------------------------------


@dataclass
class Run:
    """What one variant measured: (when, latency) per health check and per payment."""

    variant: str
    health: list[tuple[float, float]] = field(default_factory=list)
    payments: list[tuple[float, float]] = field(default_factory=list)  # (due, latency)
    sent: int = 0
    answered: int = 0
    start: float = 0.0  # monotonic, like the rest
    moved_at: float | None = None
    drained_at: float | None = None  # every request due before the move answered
    inflight: dict[int, float] = field(default_factory=dict)  # request -> when it was due

    def window(self, rows: list[tuple[float, float]], since: float, until: float) -> list[float]:
        return [late for at, late in rows if since <= at < until]


async def drive(
    run: Run, call: Callable[[int], Awaitable[str]], rate: float, until: Callable[[float], float | None]
) -> None:
    """Open-loop arrivals at ``rate``, a health check beside them, until the end that
    ``until(now)`` names once it knows it (arrivals due before it are all sent, however
    late the loop gets to them); returns when every request is answered."""
    done = asyncio.Event()

    async def probe() -> None:
        while not done.is_set():
            due = time.perf_counter() + PROBE
            await asyncio.sleep(PROBE)
            run.health.append((time.monotonic(), time.perf_counter() - due))

    async def request(i: int, due: float) -> None:
        run.inflight[i] = due
        await call(i)
        del run.inflight[i]
        run.payments.append((due, time.monotonic() - due))
        run.answered += 1

    prober = asyncio.create_task(probe())
    tasks: list[asyncio.Task[None]] = []
    start = run.start = time.monotonic()
    while True:
        now = time.monotonic()
        end = until(now)
        horizon = now if end is None else min(now, end)
        while start + run.sent / rate <= horizon:  # every arrival due by now, late or not
            tasks.append(asyncio.create_task(request(run.sent, start + run.sent / rate)))
            run.sent += 1
        if end is not None and now >= end:
            break
        await asyncio.sleep(max(0.0, start + run.sent / rate - time.monotonic()))
    await asyncio.wait_for(asyncio.gather(*tasks), 120)
    done.set()
    await prober


def on_plain_loop(work: Callable[[], Coroutine[Any, Any, None]]) -> None:
    from foundry.execute.asyncio_loop import new_event_loop  # the managed loop's implementation

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(work())


def plain_inline(rate: float, seconds: float, rounds: int) -> Run:
    run = Run("plain inline")

    async def handler(i: int) -> str:
        await asyncio.sleep(UPSTREAM)
        return sign_body(f"payment {i}".encode(), rounds)

    end = time.monotonic() + seconds
    on_plain_loop(lambda: drive(run, handler, rate, lambda now: end))
    return run


def plain_executor(rate: float, seconds: float, rounds: int, workers: int) -> Run:
    run = Run("plain executor")
    context = multiprocessing.get_context("forkserver")
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        list(pool.map(_warm, range(workers * 2)))  # started before the load, as a deploy would

        async def handler(i: int) -> str:
            await asyncio.sleep(UPSTREAM)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(pool, sign_body, f"payment {i}".encode(), rounds)

        end = time.monotonic() + seconds
        on_plain_loop(lambda: drive(run, handler, rate, lambda now: end))
    return run


def foundry_adaptive(rate: float, seconds: float, settle: float, rounds: int) -> tuple[Run, dict[str, Any]]:
    import foundry
    from foundry import Foundry

    run = Run("foundry adaptive")
    with tempfile.TemporaryDirectory() as home:
        app = Foundry("bench-adaptive", home=home)

        @app.work(name="pay", est="45ms", bound="io", rate=f"{rate:g}/s", concurrency=300, adaptive=True)
        async def pay(i: int) -> str:
            await asyncio.sleep(UPSTREAM)
            return str(await sign(f"payment {i}".encode(), rounds))

        sign = pay.phase("sign")(sign_body)
        give_up = time.monotonic() + GIVE_UP

        def until(now: float) -> float | None:
            moves = app.phase_mover().moved
            if run.moved_at is None and moves:  # when it moved, not when the driver noticed
                run.moved_at = now - (time.time() - moves[0].at)
            if run.moved_at is None:  # not moved (yet)
                return now if now >= give_up else None
            if run.drained_at is None:
                if all(due >= run.moved_at for due in run.inflight.values()):
                    run.drained_at = now  # the backlog built before the move is answered
                elif now >= run.moved_at + GIVE_UP:
                    return now  # never drained: the pool cannot keep up with the rate here
                else:
                    return None
            return run.drained_at + settle + seconds

        try:
            foundry.loop(app).run(drive(run, pay, rate, until), timeout=300)
            moves = app.phase_mover().moved
            detail = {
                "moved": bool(moves),
                "move_s": None if run.moved_at is None else round(run.moved_at - run.start, 2),
                "drain_s": None
                if run.drained_at is None or run.moved_at is None
                else round(run.drained_at - run.moved_at, 2),
                "to": moves[0].after.model if moves else None,
                "reports": moves[0].reports if moves else 0,
                "held_ms": round(moves[0].held_for * 1e3, 1) if moves else None,
            }
        finally:
            app.close()
    return run, detail


# -- figures ------------------------------------------------------------------------------------------


def quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0, "p50": float("nan"), "p99": float("nan")}
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50": ordered[len(ordered) // 2],
        "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
    }


def figures(run: Run, since: float = 0.0, until: float = float("inf")) -> dict[str, Any]:
    return {
        "health": quantiles(run.window(run.health, since, until)),
        "payment": quantiles(run.window(run.payments, since, until)),
    }


def one_round(index: int, args: argparse.Namespace, rounds: int, workers: int) -> dict[str, Any]:
    order = ["foundry", "inline", "executor"]
    if index % 2:
        order.reverse()
    out: dict[str, Any] = {"order": order, "load": [round(os.getloadavg()[0], 2)]}
    for name in order:
        if name == "foundry":
            run, detail = foundry_adaptive(args.rate, args.seconds, args.settle, rounds)
            moved = run.moved_at if run.moved_at is not None else float("inf")
            drained = run.drained_at if run.drained_at is not None else float("inf")
            out["foundry before"] = figures(run, until=moved)
            out["foundry after"] = {  # the loop is free at once; payments once the backlog is gone
                "health": quantiles(run.window(run.health, moved + 0.2, float("inf"))),
                "payment": quantiles(run.window(run.payments, drained + args.settle, float("inf"))),
            }
            out["foundry"] = {**detail, "sent": run.sent, "answered": run.answered}
        elif name == "inline":
            run = plain_inline(args.rate, args.seconds, rounds)
            out["plain inline"] = {**figures(run), "sent": run.sent, "answered": run.answered}
        else:
            run = plain_executor(args.rate, args.seconds, rounds, workers)
            out["plain executor"] = {**figures(run), "sent": run.sent, "answered": run.answered}
    out["load"].append(round(os.getloadavg()[0], 2))
    return out


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")


def summary(per_round: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Median and range of per-round ratios."""
    pairs = {
        "health p99: foundry after ÷ plain executor": ("foundry after", "plain executor", "health"),
        "payment p99: foundry after ÷ plain executor": ("foundry after", "plain executor", "payment"),
        "health p99: foundry before ÷ after": ("foundry before", "foundry after", "health"),
        "health p99: plain inline ÷ plain executor": ("plain inline", "plain executor", "health"),
    }
    out: dict[str, dict[str, float]] = {}
    for label, (a, b, what) in pairs.items():
        values = [ratio(r[a][what]["p99"], r[b][what]["p99"]) for r in per_round]
        values = [v for v in values if math.isfinite(v)]  # a round with nothing measured drops out
        if not values:
            out[label] = {"median": float("nan"), "min": float("nan"), "max": float("nan"), "rounds": 0}
            continue
        out[label] = {
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
            "rounds": len(values),
        }
    return out


def _ms(value: float) -> str:
    return "-" if value != value else f"{value * 1e3:.1f} ms"


def show(console: Console, report: dict[str, Any]) -> None:
    table = Table(
        title=f"health check and payments at {report['rate']:g}/s, signing {report['step_ms']} ms "
        f"({report['sign_rounds']:,} SHA-256 rounds), {report['workers']} cores"
    )
    for column in ("round", "variant", "health p50", "health p99", "payment p50", "payment p99", "n"):
        table.add_column(column, justify="right" if column not in ("variant",) else "left")
    for i, r in enumerate(report["rounds"], 1):
        for variant in ("foundry before", "foundry after", "plain inline", "plain executor"):
            f = r[variant]
            table.add_row(
                str(i),
                variant,
                _ms(f["health"]["p50"]),
                _ms(f["health"]["p99"]),
                _ms(f["payment"]["p50"]),
                _ms(f["payment"]["p99"]),
                str(f["payment"]["n"]),
            )
        table.add_section()
    console.print(table)
    ratios = Table(title=f"per-round ratios: median (range) over {len(report['rounds'])} rounds")
    ratios.add_column("ratio")
    ratios.add_column("median (min – max)", justify="right")
    for label, s in report["summary"].items():
        ratios.add_row(label, f"{s['median']:.2f} ({s['min']:.2f} – {s['max']:.2f})")
    console.print(ratios)
    for i, r in enumerate(report["rounds"], 1):
        f = r["foundry"]
        console.print(
            f"round {i} (load {r['load'][0]} → {r['load'][1]}; {', '.join(r['order'])}): moved to {f['to']} "
            f"{f['move_s']} s in, after {f['reports']} reports (held ≈ {f['held_ms']} ms); backlog drained "
            f"{f['drain_s']} s later; answered {f['answered']}/{f['sent']}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, help="requests per second (35; --quick: 5)")
    parser.add_argument("--step", type=float, help="seconds of signing per request (0.035; --quick: 0.15)")
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds measured per variant (4)")
    parser.add_argument(
        "--settle", type=float, default=0.5, help="seconds not measured after the backlog drained (0.5)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds (3)")
    parser.add_argument("--quick", action="store_true", help="one short round: the smoke run")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    if args.quick:
        # Few long signings instead of many short ones: each still holds the loop past the
        # watchdog's threshold (so the move happens as in the full run), but a third of the
        # CPU and no backlog, so the smoke run takes seconds on a machine busy with tests.
        args.rounds, args.seconds, args.settle = 1, 1.0, 0.2
    args.rate = args.rate if args.rate is not None else (5.0 if args.quick else 35.0)
    args.step = args.step if args.step is not None else (0.15 if args.quick else 0.035)
    workers = os.cpu_count() or 1
    rounds = calibrate(args.step)
    per_round = [one_round(i, args, rounds, workers) for i in range(args.rounds)]
    report = {
        "rate": args.rate,
        "step_ms": round(args.step * 1e3, 1),
        "sign_rounds": rounds,
        "workers": workers,
        "seconds": args.seconds,
        "settle": args.settle,
        "rounds": per_round,
        "summary": summary(per_round),
    }
    if args.json:
        print(json.dumps(report))
    else:
        show(Console(), report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
