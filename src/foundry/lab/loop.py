"""Loop starvation: a CPU phase of ``cpu`` on a shared event loop, step by step.

Seed 003's payments handler signs each request body (RSA-4096, ~35 ms of pure
computation) inline on the event loop, at 300 requests/s. The loop runs one ready
callback at a time; it only looks at its sockets *between* callbacks, so a health
check that arrives at t = 10 ms is not even noticed until the callback running then
ends, and is then queued behind every request already ready. Nothing is corrupted;
a liveness invariant — "a ready task runs within ``budget``" — is broken, and the
orchestrator kills a process that is doing exactly what it was asked to do.

The schedule is deterministic (FIFO ready queue, poll between callbacks):

- step 1 accepts ``ready`` payment requests (default: the arrivals of one 20 ms accept
  batch at ``rate`` — 6 at 300/s);
- each run of a request takes ``cpu`` of loop time; after each run the loop polls and
  marks newly arrived work ready (the health check; with ``arrivals="steady"`` also the
  payment requests that kept arriving at ``rate``);
- ``healthWaitMs`` counts from when the loop marked the check ready, as in the seed
  (``since_arrival`` counts from when it reached the socket, which is what the prober
  sees);
- the budget is broken on the first step whose state shows the check ready for longer
  than ``budget``; the orchestrator's probe times out ``probe_timeout`` after it was
  sent (150 ms by default, which puts it where the seed puts it; Kubernetes' own
  default ``timeoutSeconds`` is 1 s).

The seed's rows 1–8 are reproduced exactly with the defaults. Its row 9 runs the health
check *before* request 6, which a FIFO loop does not do; here request 6 runs first and
the check, ready for 175 ms, runs and replies at 213 ms of loop time (203 ms after it
reached the socket). The seed's prose says "ready for 180 ms".
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from foundry.errors import LabInputError
from foundry.lab.queueing import allen_cunneen, check_positive, check_workers, workers_for

__all__ = ["LoopRow", "LoopSchedule", "LoopSettings", "schedule"]

FIFO = "deterministic schedule (FIFO ready queue, poll between callbacks)"


@dataclass(frozen=True, slots=True)
class LoopSettings:
    cpu: float = 0.035
    """CPU time of the phase that runs on the loop, per request (s)."""
    rate: float = 300.0
    """Payment requests per second."""
    budget: float = 0.100
    """Liveness budget: a ready health check must run within this (s)."""
    health_at: float = 0.010
    """When the health check reaches the socket (s)."""
    health_cost: float = 0.003
    """Loop time the health check itself takes (s)."""
    ready: int | None = None
    """Payment requests ready at step 1; default ``round(rate × accept_window)``."""
    accept_window: float = 0.020
    probe_timeout: float | None = 0.150
    """The orchestrator gives up on the probe this long after sending it (s); ``None``: never."""
    arrivals: str = "burst"
    """``burst``: only the first batch; ``steady``: payment requests keep arriving at ``rate``."""
    max_steps: int = 60

    def checked(self) -> LoopSettings:
        check_positive("cpu", self.cpu, 'give the CPU phase per request, e.g. "35ms"')
        check_positive("rate", self.rate, 'give a non-negative request rate, e.g. "300/s"', allow_zero=True)
        check_positive("budget", self.budget, 'give the liveness budget, e.g. "100ms"')
        check_positive(
            "health_at", self.health_at, 'give when the check arrives, e.g. "10ms"', allow_zero=True
        )
        check_positive(
            "health_cost", self.health_cost, 'give the check\'s own cost, e.g. "3ms"', allow_zero=True
        )
        check_positive("accept_window", self.accept_window, 'give a window, e.g. "20ms"', allow_zero=True)
        if self.ready is not None:
            check_positive("ready", self.ready, "give how many requests are ready at step 1", allow_zero=True)
        if self.probe_timeout is not None:
            check_positive("probe_timeout", self.probe_timeout, 'give the probe timeout, e.g. "1s"')
        if self.arrivals not in ("burst", "steady"):
            raise LabInputError("arrivals", self.arrivals, "is not a mode", 'use "burst" or "steady"')
        check_workers("max_steps", self.max_steps, "give at least 1 step")
        return self

    @property
    def initial_ready(self) -> int:
        return self.ready if self.ready is not None else round(self.rate * self.accept_window)

    def as_dict(self) -> dict[str, object]:
        return {
            "cpu_s": self.cpu,
            "rate_per_s": self.rate,
            "budget_s": self.budget,
            "health_at_s": self.health_at,
            "health_cost_s": self.health_cost,
            "ready": self.initial_ready,
            "probe_timeout_s": self.probe_timeout,
            "arrivals": self.arrivals,
        }


@dataclass(frozen=True, slots=True)
class LoopRow:
    step: int
    loop: str
    """What the event loop did (empty when the row is another actor's event)."""
    payments: str
    health: str
    ready: int
    loop_busy: float
    """Cumulative loop time spent running callbacks (s)."""
    health_wait: float | None
    """How long the health check has been ready without running (s); None before it is."""
    note: str = ""

    @property
    def state(self) -> str:
        text = f"ready={self.ready} loopBusyMs={_ms(self.loop_busy)}"
        if self.health_wait is not None:
            text += f" healthWaitMs={_ms(self.health_wait)}"
        return text

    def as_dict(self) -> dict[str, object]:
        return {
            "step": self.step,
            "event_loop": self.loop,
            "payment_requests": self.payments,
            "health_check": self.health,
            "ready": self.ready,
            "loop_busy_ms": self.loop_busy * 1000,
            "health_wait_ms": None if self.health_wait is None else self.health_wait * 1000,
            "state": self.state,
            "note": self.note,
        }


@dataclass(frozen=True, slots=True)
class LoopSchedule:
    settings: LoopSettings
    rows: tuple[LoopRow, ...]
    budget_broken_step: int | None
    budget_broken_at: float | None
    """Loop time at which the check had been ready for exactly ``budget`` (s)."""
    health_replied_at: float | None
    """Loop time at which the health check finished running (s)."""
    health_ready_at: float | None
    """Loop time at which the loop marked the check ready (s)."""
    health_waited: float | None
    """How long the check was ready before it ran (s)."""
    sigterm_step: int | None
    utilisation: float
    """Loop demand: rate × cpu (seconds of loop CPU per second)."""
    summary: tuple[str, ...] = field(default=())
    method: str = FIFO

    def as_dict(self) -> dict[str, object]:
        return {
            "method": self.method,
            "inputs": self.settings.as_dict(),
            "rows": [r.as_dict() for r in self.rows],
            "budget_broken_step": self.budget_broken_step,
            "budget_broken_at_ms": None if self.budget_broken_at is None else self.budget_broken_at * 1000,
            "health_ready_at_ms": None if self.health_ready_at is None else self.health_ready_at * 1000,
            "health_replied_at_ms": None if self.health_replied_at is None else self.health_replied_at * 1000,
            "health_waited_ms": None if self.health_waited is None else self.health_waited * 1000,
            "sigterm_step": self.sigterm_step,
            "loop_utilisation": self.utilisation,
            "summary": list(self.summary),
        }


def _ms(seconds: float) -> str:
    return (
        f"{seconds * 1000:.0f}"
        if abs(seconds * 1000 - round(seconds * 1000)) < 1e-6
        else f"{seconds * 1000:.1f}"
    )


def schedule(settings: LoopSettings | None = None) -> LoopSchedule:
    """Run the loop until the health check has run (or ``max_steps`` rows)."""
    s = (settings or LoopSettings()).checked()
    n0 = s.initial_ready
    ready: deque[str] = deque(f"request {i}" for i in range(1, n0 + 1))
    rows: list[LoopRow] = []
    t = 0.0
    busy = 0.0
    next_payment = n0 + 1
    steady_gap = 1.0 / s.rate if s.rate > 0 else math.inf
    next_payment_at = steady_gap if s.arrivals == "steady" else math.inf
    health_ready_at: float | None = None
    health_ran_at: float | None = None
    health_started_at: float | None = None
    broken_step: int | None = None
    sigterm_step: int | None = None
    probe_deadline = s.health_at + s.probe_timeout if s.probe_timeout is not None else math.inf

    def wait() -> float | None:
        if health_ready_at is None or health_ran_at is not None:
            return None if health_ran_at is None else 0.0
        return t - health_ready_at

    def add(loop: str = "", payments: str = "", health: str = "", note: str = "") -> None:
        rows.append(LoopRow(len(rows) + 1, loop, payments, health, len(ready), busy, wait(), note))

    add(loop=f"accept {n0} payment request{'' if n0 == 1 else 's'}; all {n0} ready")

    def poll() -> None:
        nonlocal health_ready_at, next_payment, next_payment_at
        arrived = 0
        while next_payment_at <= t:
            # payments that reached the socket before the check are queued ahead of it
            if health_ready_at is None and s.health_at <= t and s.health_at < next_payment_at:
                break
            ready.append(f"request {next_payment}")
            next_payment += 1
            next_payment_at += steady_gap
            arrived += 1
        if arrived:
            add(payments=f"{arrived} more payment request{'s' if arrived > 1 else ''} arrive; queued")
        if health_ready_at is None and s.health_at <= t:
            ready.append("health")
            health_ready_at = t
            add(health="health check arrives, marked ready")
            if next_payment_at <= t:
                poll()

    while len(rows) < s.max_steps:
        if not ready:
            # idle loop: jump to the next arrival
            upcoming = min(next_payment_at, s.health_at if health_ready_at is None else math.inf)
            if not math.isfinite(upcoming):
                break
            t = max(t, upcoming)
            poll()
            continue
        item = ready.popleft()
        if item == "health":
            health_started_at = t
            t += s.health_cost
            busy += s.health_cost
            health_ran_at = t
            late = sigterm_step is not None
            add(
                loop="run health check — replies 200 OK"
                + (" (too late: SIGTERM already sent)" if late else "")
            )
            break
        t += s.cpu
        busy += s.cpu
        current = wait()
        note = ""
        if broken_step is None and current is not None and current > s.budget:
            broken_step = len(rows) + 1
            note = (
                f"✕ The health check has been ready for {_ms(current)} ms without running. The liveness "
                f"budget of {_ms(s.budget)} ms is blown while the process is entirely healthy and doing "
                "useful work."
            )
        add(loop=f"run {item}: sign body", note=note)
        if sigterm_step is None and t >= probe_deadline and health_ran_at is None:
            add(health="orchestrator liveness probe times out; SIGTERM sent")
            sigterm_step = len(rows)
        poll()

    waited = (
        health_started_at - health_ready_at
        if health_started_at is not None and health_ready_at is not None
        else None
    )
    broken_at = (
        health_ready_at + s.budget if broken_step is not None and health_ready_at is not None else None
    )
    return LoopSchedule(
        s,
        tuple(rows),
        broken_step,
        broken_at,
        health_ran_at,
        health_ready_at,
        waited,
        sigterm_step,
        s.rate * s.cpu,
        tuple(_summary(s, broken_step, broken_at, health_ready_at, waited, health_ran_at)),
    )


def _summary(
    s: LoopSettings,
    broken_step: int | None,
    broken_at: float | None,
    ready_at: float | None,
    waited: float | None,
    replied_at: float | None,
) -> list[str]:
    lines: list[str] = []
    if broken_step is not None and broken_at is not None:
        lines.append(
            f"Budget broken at step {broken_step}: the health check was marked ready at "
            f"{_ms(ready_at or 0)} ms and had waited {_ms(s.budget)} ms by loop time {_ms(broken_at)} ms "
            f"({FIFO})."
        )
    elif waited is not None:
        lines.append(f"Budget kept: the health check ran {_ms(waited)} ms after it was marked ready.")
    else:
        lines.append(f"The health check did not run within {s.max_steps} steps.")
    if replied_at is not None:
        lines.append(
            f"The health check ran after {_ms(waited or 0)} ms ready and replied at loop time "
            f"{_ms(replied_at)} ms: {_ms(replied_at - s.health_at)} ms after it reached the socket, "
            "which is what the prober measures."
        )
    ahead = math.floor(s.budget / s.cpu) + 1
    lines.append(
        f"Worst case, any time: a check queued behind {ahead} ready requests ({ahead} × {_ms(s.cpu)} ms > "
        f"{_ms(s.budget)} ms) misses the budget, whatever the average load."
    )
    rho = s.rate * s.cpu
    if rho >= 1:
        lines.append(
            f"Loop demand ρ = {s.rate:g}/s × {_ms(s.cpu)} ms = {rho:.2f} s of CPU per second ≥ 1: one loop "
            "cannot keep up at all; the ready queue and the lag grow without bound."
        )
    elif rho > 0:
        lag = rho * s.cpu / (2 * (1 - rho))
        lines.append(
            f"Loop demand ρ = {rho:.2f}: mean loop lag {_ms(lag)} ms "
            "(Pollaczek–Khinchine M/D/1, Poisson arrivals, exact)."
        )
    if s.rate > 0 and (broken_step is not None or rho >= 1):
        target = s.cpu + s.budget
        workers = workers_for(s.cpu, s.rate, target=target, ca=1.0, cs=0.0, max_utilisation=0.8)
        pool = allen_cunneen(workers, s.cpu, s.rate, 1.0, 0.0)
        wait_ms = _ms(pool.wq) if pool is not None else "?"
        lines.append(
            f"Fix: move the {_ms(s.cpu)} ms phase off the loop to a bounded pool of {workers} worker"
            f"{'' if workers == 1 else 's'} (ρ ≤ 0.8; mean queue wait {wait_ms} ms by Allen–Cunneen "
            "G/G/c approx., cs=0) — threads if the "
            "signing library releases the GIL, else processes; the loop keeps only the socket work."
        )
    return lines
