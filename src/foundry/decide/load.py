"""The offered load (Little's law) and what the chosen model serves, with the arithmetic.

Two steps, both pure:

- :func:`demand` — what the work asks for, before any model is chosen: units in flight
  ``L = λ × W`` (arrival rate × time per unit), the declared ``concurrency``, and the
  *slots* that carry ``L`` with each busy at most :data:`TARGET_UTILISATION` of the
  time. For computing work each unit in flight holds a core, so ``L`` is also the
  cores it needs, set against the host's.
- :func:`sized` — what the chosen model runs at once (pool threads, process workers,
  event-loop permits, stream partitions), how many units per second that serves, and
  the utilisation ``ρ = λ / capacity``. Above 1 no queue saves it: the backlog grows
  without end (``saturation`` warns with these numbers).

Why half: one worker busy a fraction ``ρ`` of the time makes an arrival wait on average
``ρ / (1 - ρ)`` units' time (M/M/1). At ``ρ ≤ 0.5`` that is at most one unit's time, so
one worker is enough; past it the wait climbs steeply (``ρ = 0.9``: nine units' time),
so more slots are added until each is back under half. ``foundry lab`` answers the
same question for a given burstiness and latency target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from foundry.decide.fmt import fmt_count, fmt_rate, fmt_seconds
from foundry.decide.model import Host, Load
from foundry.traits import Traits

__all__ = [
    "ASSUMED_CORES",
    "NEAR_SATURATION",
    "TARGET_UTILISATION",
    "Demand",
    "demand",
    "sized",
]

TARGET_UTILISATION = 0.5  # size so that each slot is busy at most half the time
NEAR_SATURATION = 0.8  # from here waits grow steeply: say so
ASSUMED_CORES = 8  # when the host is unknown (and said so)


@dataclass(frozen=True, slots=True)
class Demand:
    """What the work asks for, before a model is chosen."""

    rate: float | None  # λ
    est: float | None  # W
    in_flight: float | None  # L = λ × W
    declared: int | None  # concurrency=
    slots: int | None  # units to run at once: max(concurrency, ⌈L / 0.5⌉)
    computing: bool  # bound="cpu"
    cores: int
    cores_assumed: bool
    threads_use_cores: bool  # no GIL, or the code releases it

    @property
    def known(self) -> bool:
        return self.slots is not None

    @property
    def single(self) -> bool:
        """One at a time carries it: at most one unit in flight, or one worker busy at
        most half the time."""
        return self.slots is not None and self.slots <= 1

    @property
    def cores_needed(self) -> float | None:
        if not self.computing:
            return None
        if self.in_flight is not None:
            return self.in_flight
        return None if self.declared is None else float(self.declared)

    def describe(self) -> str:
        """``~1.8 in flight (900/s × 2ms)`` or ``16 in flight (concurrency=)``."""
        parts = []
        if self.in_flight is not None and self.rate is not None and self.est is not None:
            parts.append(
                f"~{fmt_count(self.in_flight)} in flight ({fmt_rate(self.rate)} × {fmt_seconds(self.est)})"
            )
        if self.declared is not None:
            parts.append(f"{self.declared} in flight (concurrency=)")
        return "; ".join(parts) if parts else "not declared"


def _slots(in_flight: float) -> int:
    return max(1, math.ceil(in_flight / TARGET_UTILISATION - 1e-9))


def demand(t: Traits, host: Host) -> Demand:
    in_flight = t.rate * t.est if t.rate is not None and t.est is not None else None
    parts = [n for n in (None if in_flight is None else _slots(in_flight), t.concurrency) if n is not None]
    gil = host.gil is not False
    return Demand(
        rate=t.rate,
        est=t.est,
        in_flight=in_flight,
        declared=t.concurrency,
        slots=max(parts) if parts else None,
        computing=t.bound == "cpu",
        cores=host.cores if host.cores is not None else ASSUMED_CORES,
        cores_assumed=host.cores is None,
        threads_use_cores=not gil or t.releases_gil,
    )


def _demand_lines(d: Demand) -> list[str]:
    lines = []
    if d.in_flight is not None and d.rate is not None and d.est is not None:
        lines.append(
            f"in flight: L = λ × W = {fmt_rate(d.rate)} × {fmt_seconds(d.est)} = "
            f"{fmt_count(d.in_flight)} (Little's law)"
        )
        if d.declared is not None and d.declared < d.in_flight:
            lines.append(
                f"concurrency={d.declared} was declared, but λ × W puts {fmt_count(d.in_flight)} in "
                "flight: sized for the load"
            )
    elif d.declared is not None:
        lines.append(f"in flight: concurrency={d.declared} declared (declare rate= and est= to check it)")
    else:
        lines.append("in flight: not declared (declare rate= with est=, or concurrency=)")
    needed = d.cores_needed
    if needed is not None:
        host = f"{d.cores} (assumed: host unknown)" if d.cores_assumed else f"{d.cores} on this host"
        lines.append(
            f"cores: {fmt_count(needed)} needed (computing holds one core per unit in flight) of {host}"
        )
    return lines


def sized(t: Traits, host: Host, d: Demand, delivery: str, execution: str) -> Load:
    """What ``delivery/execution`` runs at once for this demand, and what that serves."""
    workers = t.workers
    concurrency: int | None
    if execution == "sequential" and delivery == "stream":  # a stream has 1 partition by default
        concurrency, runs_on = d.slots or 1, "partitions, one event in flight each"
    elif execution == "sequential":
        concurrency, runs_on = 1, "at a time"
    elif execution == "async":
        concurrency, runs_on = workers or d.slots, "permits on one event loop"
    elif execution == "parallel":
        concurrency, runs_on = workers or d.cores, "process workers over chunks"
    elif execution == "processes":
        concurrency = workers or (None if d.slots is None else min(d.slots, d.cores))
        runs_on = "process workers"
    else:  # threads, bounded_pool, channels: threads
        concurrency = workers or d.slots
        if workers is None and concurrency is not None and d.computing:
            concurrency = min(concurrency, d.cores)
        runs_on = "workers behind the channel" if execution == "channels" else "threads"
    effective = _effective(d, execution, delivery, concurrency)
    # A parallel run is one computation split over the cores, not units arriving at a rate.
    per_unit = execution != "parallel"
    capacity = effective / d.est if effective is not None and d.est and per_unit else None
    utilisation = d.rate / capacity if d.rate is not None and capacity else None
    lines = _demand_lines(d)
    lines.append(_chosen_line(t, d, execution, delivery, concurrency, runs_on))
    if capacity is not None:
        lines.append(_capacity_line(d, effective, capacity, utilisation, execution))
    return Load(
        rate=d.rate,
        est=d.est,
        in_flight=d.in_flight,
        declared=d.declared,
        computing=d.computing,
        cores=d.cores,
        cores_assumed=d.cores_assumed,
        cores_needed=d.cores_needed,
        concurrency=concurrency,
        runs_on=runs_on,
        capacity=capacity,
        utilisation=utilisation,
        lines=tuple(lines),
    )


def _effective(d: Demand, execution: str, delivery: str, concurrency: int | None) -> float | None:
    """Units that truly progress at once: computing is capped by the cores, and by one
    core where one thread (async, sequential) or the GIL (threads) serialises it."""
    if concurrency is None:
        return None
    if not d.computing or (execution == "sequential" and delivery == "stream"):
        return float(concurrency)
    if execution in ("async", "sequential") or (
        execution in ("threads", "bounded_pool", "channels") and not d.threads_use_cores
    ):
        return float(min(concurrency, 1))
    return float(min(concurrency, d.cores))


def _chosen_line(
    t: Traits, d: Demand, execution: str, delivery: str, concurrency: int | None, runs_on: str
) -> str:
    if concurrency is None:
        return f"runs: the runtime's default size ({execution}: too little declared to size it)"
    if t.workers is not None and execution != "sequential":
        how = "workers= declared"
    elif delivery == "stream" and execution == "sequential" and d.slots is None:
        how = "a stream's default: declare rate= and est= to size the partitions"
    elif execution == "sequential" and delivery != "stream":
        how = "sequential"
    elif execution == "parallel":
        how = "one per core"
    elif d.computing and execution != "async" and delivery != "stream" and d.cores_needed is not None:
        needed = fmt_count(d.cores_needed)
        if d.cores_needed > concurrency:
            how = f"one per core: {needed} cores needed, {d.cores} available"
        else:
            how = f"{needed} cores needed, at most one worker per core"
        return f"runs: {concurrency} {runs_on} ({how})"
    elif d.in_flight is not None and d.slots == _slots(d.in_flight) and d.slots != d.declared:
        how = f"⌈L / {TARGET_UTILISATION}⌉: each busy at most half the time"
    else:
        how = "as many as declared in flight"
    slots = d.slots
    if (
        slots is not None
        and concurrency < slots
        and t.workers is None
        and execution in ("processes", "threads", "bounded_pool", "channels")
    ):
        how += f", capped at the {d.cores} cores (the other {slots - concurrency} wait in the bounded intake)"
    return f"runs: {concurrency} {runs_on} ({how})"


def _capacity_line(
    d: Demand, effective: float | None, capacity: float, utilisation: float | None, execution: str
) -> str:
    assert effective is not None
    assert d.est is not None
    gil = ""
    if d.computing and execution in ("threads", "bounded_pool", "channels") and not d.threads_use_cores:
        gil = "; threads under the GIL compute one at a time"
    elif d.computing and execution in ("async", "sequential") and effective <= 1:
        gil = "; one thread computes one unit at a time"
    line = f"serves: {fmt_count(effective)} at a time ÷ {fmt_seconds(d.est)} = {fmt_rate(capacity)}{gil}"
    if utilisation is not None and d.rate is not None:
        line += f"; ρ = λ / capacity = {fmt_rate(d.rate)} / {fmt_rate(capacity)} = {utilisation:.2f}"
        if utilisation > 1:
            line += " — saturated: the backlog grows without end"
        elif utilisation >= NEAR_SATURATION:
            line += " — near saturation: waits grow steeply"
    return line
