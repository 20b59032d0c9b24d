"""Bounding concurrency with permits: a sweep of permit counts against a downstream with
a capacity and a caller-side timeout.

The model behind seed 003's table (and the defaults here, which reproduce it exactly):

- a backlog of ``requests`` calls (10K) is worked off by callers that hold one of
  ``permits`` while their call is at the downstream; the permit is released when the
  response arrives (or the call times out), then the caller spends ``overhead``
  (3 ms: serialise, parse, log) outside the permit;
- the downstream serves ``capacity`` calls/s (1000/s) with a base latency ``service``
  (40 ms), i.e. it has ``capacity × service`` = 40 slots; calls beyond that queue;
- a call that has been at the downstream for ``timeout`` (500 ms) is abandoned by its
  caller: it counts as failed and its work, if the downstream still does it, is wasted.

Fluid model (deterministic, closed loop — every number in the seed):
    time at downstream ``d = max(service, permits / capacity)``
    (latency grows once permits exceed capacity × service: the excess only queues);
    if ``d ≥ timeout`` every call times out: goodput 0, latency ``timeout + overhead``;
    else goodput ``permits / d`` (Little: concurrency ÷ latency), latency ``d + overhead``.

Simulation mode runs the same system event by event with random service times (CV
``cs``): it shows what the fluid model hides — the partial timeouts near the edge, and
the collapse when abandoned calls keep the downstream busy (``abandoned="wasted"``, the
default, as with a downstream that cannot see the caller give up) or its avoidance when
queued abandoned calls are dropped (``abandoned="dropped"``).
"""

from __future__ import annotations

import functools
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from foundry.errors import LabInputError
from foundry.lab.distributions import Dist
from foundry.lab.queueing import check_positive, check_workers
from foundry.lab.sim import EventLoop, sim_label
from foundry.lab.stats import Estimate, estimate

__all__ = [
    "FLUID",
    "SEED_PERMITS",
    "PermitRow",
    "PermitSettings",
    "knee",
    "simulate_permits",
    "sweep",
]

FLUID = "fluid model (deterministic closed loop)"
SEED_PERMITS: tuple[int, ...] = (1, 5, 10, 25, 50, 100, 200, 350, 500)


@dataclass(frozen=True, slots=True)
class PermitSettings:
    """The downstream and the callers. Defaults are seed 003's."""

    service: float = 0.040
    """Downstream base latency (s) when it is not saturated."""
    overhead: float = 0.003
    """Caller-side time per call outside the permit (s)."""
    capacity: float = 1000.0
    """Calls per second the downstream completes at most."""
    timeout: float = 0.500
    """Caller gives up on a call after this long at the downstream (s)."""
    requests: int = 10_000
    """Calls in the backlog."""

    def checked(self) -> PermitSettings:
        check_positive("service", self.service, 'give the downstream latency, e.g. "40ms"')
        check_positive("overhead", self.overhead, 'give a non-negative overhead, e.g. "3ms"', allow_zero=True)
        check_positive("capacity", self.capacity, 'give the downstream capacity, e.g. "1000/s"')
        check_positive("timeout", self.timeout, 'give the caller timeout, e.g. "500ms"')
        check_workers("requests", self.requests, "give at least 1 request")
        return self

    def as_dict(self) -> dict[str, float | int]:
        return {
            "service_s": self.service,
            "overhead_s": self.overhead,
            "capacity_per_s": self.capacity,
            "timeout_s": self.timeout,
            "requests": self.requests,
        }


@dataclass(frozen=True, slots=True)
class PermitRow:
    """One permit count. ``half_widths`` are set for simulated rows."""

    permits: int
    goodput: float
    """Successful calls per second."""
    latency: float
    """Mean call latency (s): time at the downstream (or until the timeout) + overhead."""
    timeout_rate: float
    """Fraction of calls that timed out."""
    failed: int
    """Calls that failed, of ``requests``."""
    requests: int
    method: str
    half_widths: dict[str, float] | None = None

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "permits": self.permits,
            "goodput_per_s": self.goodput,
            "mean_latency_s": self.latency,
            "timeout_rate": self.timeout_rate,
            "failed": self.failed,
            "requests": self.requests,
            "method": self.method,
        }
        if self.half_widths:
            out["ci_half_widths"] = dict(self.half_widths)
        return out


def knee(settings: PermitSettings) -> float:
    """Permits past which more concurrency only adds latency: capacity × service."""
    return settings.capacity * settings.service


def _check_permits(permits: Sequence[int]) -> list[int]:
    if not permits:
        raise LabInputError("permits", [], "is empty", "give permit counts, e.g. 1,5,10,25,50")
    for p in permits:
        check_workers("permits", p, "give permit counts of at least 1")
    return list(permits)


def sweep(permits: Sequence[int] = SEED_PERMITS, settings: PermitSettings | None = None) -> list[PermitRow]:
    """The fluid model at each permit count (seed 003's table with the defaults)."""
    s = (settings or PermitSettings()).checked()
    rows: list[PermitRow] = []
    for p in _check_permits(permits):
        at_downstream = max(s.service, p / s.capacity)
        if at_downstream >= s.timeout:
            rows.append(PermitRow(p, 0.0, s.timeout + s.overhead, 1.0, s.requests, s.requests, FLUID))
        else:
            rows.append(
                PermitRow(p, p / at_downstream, at_downstream + s.overhead, 0.0, 0, s.requests, FLUID)
            )
    return rows


@dataclass(slots=True)
class _Call:
    sent: float
    done: bool = False
    abandoned: bool = False


def _run_once(p: int, s: PermitSettings, service: Dist, rng: random.Random, drop: bool) -> tuple[float, ...]:
    """One replication: (goodput, mean latency, timeout fraction, failed)."""
    loop = EventLoop()
    draw = service.sampler(rng)
    slots = max(1, round(s.capacity * s.service))
    queue: deque[_Call] = deque()
    busy = [0]
    issued = [0]
    ok = [0]
    failed = [0]
    latency_sum = [0.0]
    last = [0.0]

    def finish(call: _Call) -> None:
        busy[0] -= 1
        if not call.done:
            call.done = True
            ok[0] += 1
            latency_sum[0] += loop.now - call.sent + s.overhead
            last[0] = loop.now + s.overhead
            issue()
        serve_next()

    def serve_next() -> None:
        while queue and busy[0] < slots:
            call = queue.popleft()
            if drop and call.abandoned:
                continue
            busy[0] += 1
            loop.after(draw(), functools.partial(finish, call))

    def expire(call: _Call) -> None:
        if call.done:
            return
        call.done = call.abandoned = True
        failed[0] += 1
        latency_sum[0] += s.timeout + s.overhead
        last[0] = loop.now + s.overhead
        issue()

    def issue() -> None:
        if issued[0] >= s.requests:
            return
        issued[0] += 1
        call = _Call(loop.now)
        queue.append(call)
        loop.after(s.timeout, lambda: expire(call))
        serve_next()

    for _ in range(min(p, s.requests)):
        issue()
    loop.run(max_events=40 * s.requests + 1000)
    total = ok[0] + failed[0]
    makespan = last[0] if last[0] > 0 else math.inf
    return (ok[0] / makespan, latency_sum[0] / total, failed[0] / total, float(failed[0]))


def simulate_permits(
    permits: Sequence[int] = SEED_PERMITS,
    settings: PermitSettings | None = None,
    *,
    cs: float = 1.0,
    abandoned: str = "wasted",
    replications: int = 5,
    seed: int = 0,
    confidence: float = 0.95,
) -> list[PermitRow]:
    """The same sweep, event by event, with service-time CV ``cs`` at the downstream."""
    s = (settings or PermitSettings()).checked()
    if abandoned not in ("wasted", "dropped"):
        raise LabInputError(
            "abandoned", abandoned, "is not a policy", 'use "wasted" (downstream still serves) or "dropped"'
        )
    if not isinstance(replications, int) or replications < 2:
        raise LabInputError("replications", replications, "is fewer than 2", "run at least 2 replications")
    service = Dist.of(s.service, cs, field="cs")
    rows: list[PermitRow] = []
    for p in _check_permits(permits):
        reps = [
            _run_once(p, s, service, random.Random(f"{seed}/{p}/{r}"), abandoned == "dropped")
            for r in range(replications)
        ]
        est: list[Estimate] = [estimate([rep[i] for rep in reps], confidence) for i in range(4)]
        rows.append(
            PermitRow(
                p,
                est[0].mean,
                est[1].mean,
                est[2].mean,
                round(est[3].mean),
                s.requests,
                f"{sim_label(confidence)} (service CV {cs:g}, abandoned calls {abandoned})",
                {
                    "goodput": est[0].half_width,
                    "latency": est[1].half_width,
                    "timeout_rate": est[2].half_width,
                    "failed": est[3].half_width,
                },
            )
        )
    return rows
