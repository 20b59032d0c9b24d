"""From measurements to sizes: recommend a pool size, permits and an intake bound for a
latency target, from measured service times and an arrival rate.

Inputs (see :func:`load_csv`, :func:`load_snapshot`):

- a CSV with one column of service times (seconds, or with units: ``35ms``); a header
  row is skipped. The raw sample is kept, so the check simulation resamples it
  (trace-driven) instead of assuming a shape;
- a Foundry metrics snapshot (``foundry metrics --json`` or an exporter's
  ``/metrics.json``): the ``foundry_unit_duration_seconds`` histogram gives the mean
  (sum ÷ count) and p50/p99; the CV is then *estimated* from mean and median assuming a
  log-normal shape (said so in the output). The arrival rate defaults to the rolling
  rate of ``foundry_unit_completed_total``.

The recommendation:

- **pool size**: the smallest ``c`` whose Allen–Cunneen G/G/c mean response time meets
  the target at utilisation ≤ ``max_utilisation`` (exact Erlang C when both CVs are 1),
  then checked by simulation; with ``percentile`` the simulation raises ``c`` until that
  percentile meets the target too;
- **permits** for calls to a downstream: a semaphore with waiters *is* a ``c``-server
  queue, so the same count — capped at the downstream's knee (capacity × mean service)
  when its capacity is given, past which permits only add latency;
- **intake bound**: the most requests that can wait and still meet the target,
  ``(target − S) × c / S``; beyond it, reject or shed rather than queue.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from foundry.errors import LabInputError
from foundry.lab.distributions import Dist
from foundry.lab.queueing import ALLEN_CUNNEEN, allen_cunneen, check_positive, workers_for
from foundry.lab.sim import sim_label, simulate_pool
from foundry.lab.stats import quantile

__all__ = ["Fit", "Measured", "load_csv", "load_snapshot", "recommend"]

DURATION = "foundry_unit_duration_seconds"
COMPLETED = "foundry_unit_completed_total"


@dataclass(frozen=True, slots=True)
class Measured:
    """What was measured: the service-time distribution and, maybe, the arrival rate."""

    service: Dist
    source: str
    p50: float | None
    p99: float | None
    count: int
    rate: float | None = None
    cv_note: str = "sample CV"

    def as_dict(self) -> dict[str, object]:
        return {
            "source": self.source,
            "count": self.count,
            "mean_service_s": self.service.mean,
            "service_cv": self.service.cv,
            "cv_method": self.cv_note,
            "p50_s": self.p50,
            "p99_s": self.p99,
            "rate_per_s": self.rate,
        }


def _parse_value(text: str, where: str) -> float:
    from foundry.errors import DeclarationError
    from foundry.traits import parse_duration

    try:
        return parse_duration(text.strip())
    except DeclarationError as exc:
        raise LabInputError(where, text, "is not a duration", 'give seconds or values like "35ms"') from exc


def load_csv(path: str | Path, column: int = 0) -> Measured:
    """Service times from a CSV column (seconds, or ``"35ms"``-style); a header is skipped."""
    file = Path(path)
    try:
        with file.open(newline="") as handle:
            rows = list(csv.reader(handle))
    except OSError as exc:
        raise LabInputError(
            "csv", str(path), f"cannot be read ({exc.strerror})", "give a readable CSV file"
        ) from exc
    values: list[float] = []
    for n, row in enumerate(rows, start=1):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        if column >= len(row):
            raise LabInputError(f"{file.name}:{n}", row, f"has no column {column}", "pick the right --column")
        cell = row[column].strip()
        if n == 1 and not any(ch.isdigit() for ch in cell):
            continue  # header
        values.append(_parse_value(cell, f"{file.name}:{n}"))
    service = Dist.empirical(values, field=f"csv {file.name}")
    ordered = sorted(values)
    return Measured(
        service,
        f"CSV {file}",
        quantile(ordered, 0.5),
        quantile(ordered, 0.99),
        len(values),
        None,
        "sample CV",
    )


def _rows(snapshot: Mapping[str, Any], name: str, unit: str | None) -> list[Mapping[str, Any]]:
    rows = [r for r in snapshot.get(name, []) if isinstance(r, Mapping)]
    if unit is not None:
        rows = [r for r in rows if r.get("labels", {}).get("unit") == unit]
    return rows


def load_snapshot(source: str | Path | Mapping[str, Any], unit: str | None = None) -> Measured:
    """Service times and rate from a metrics snapshot: a dict, a JSON file or an exporter URL."""
    where = "metrics"
    if isinstance(source, Mapping):
        body: Any = source
    elif str(source).startswith(("http://", "https://")):
        from foundry.observe.top import fetch_snapshot

        body = fetch_snapshot(str(source))
        where = str(source)
    else:
        where = str(source)
        try:
            body = json.loads(Path(source).read_text())
        except OSError as exc:
            raise LabInputError(
                "metrics", where, f"cannot be read ({exc.strerror})", "give a JSON file"
            ) from exc
        except ValueError as exc:
            raise LabInputError(
                "metrics", where, f"is not JSON ({exc})", "use `foundry metrics --json`"
            ) from exc
    snapshot = body.get("metrics", body) if isinstance(body, Mapping) else None
    if not isinstance(snapshot, Mapping):
        raise LabInputError(
            "metrics", where, "is not a metrics snapshot", "use `foundry metrics --json > m.json`"
        )
    hist = _rows(snapshot, DURATION, unit)
    if not hist:
        units = sorted({r.get("labels", {}).get("unit", "?") for r in _rows(snapshot, DURATION, None)})
        raise LabInputError(
            "unit",
            unit,
            f"has no {DURATION} histogram in {where} (units there: {', '.join(units) or 'none'})",
            "pass --unit with one of those, or measure the work first",
        )
    if len(hist) > 1:
        raise LabInputError(
            "unit",
            unit,
            f"matches {len(hist)} duration histograms in {where}",
            "pass --unit (and the snapshot of one process) so exactly one matches",
        )
    row = hist[0]
    count, total = float(row.get("count", 0)), float(row.get("sum", 0.0))
    if count <= 0 or total <= 0:
        raise LabInputError(
            "metrics", where, "has an empty duration histogram", "let the app run some work first"
        )
    mean = total / count
    p50 = float(row["p50"]) if row.get("p50") else None
    p99 = float(row["p99"]) if row.get("p99") else None
    if p50 and mean > p50:
        scv = math.exp(2.0 * math.log(mean / p50)) - 1.0
        note = "estimated from mean and p50 assuming a log-normal shape"
    else:
        scv = 1.0
        note = "assumed 1 (no usable p50 in the snapshot)"
    service = Dist.of(mean, math.sqrt(scv), "lognormal" if scv > 0 else "deterministic")
    unit_name = row.get("labels", {}).get("unit")
    rate = None
    for done in _rows(snapshot, COMPLETED, unit_name):
        if done.get("rate"):
            rate = float(done["rate"])
    return Measured(service, f"metrics {where}", p50, p99, int(count), rate, note)


def _service_quantile(measured: Measured, percentile: float | None) -> float | None:
    """The measured service time's own percentile, where the input tells it."""
    if percentile is None:
        return None
    if measured.service.kind == "empirical":
        return quantile(sorted(measured.service.values), percentile / 100.0)
    return {50: measured.p50, 99: measured.p99}.get(int(percentile))


@dataclass(frozen=True, slots=True)
class Fit:
    measured: Measured
    rate: float
    ca: float
    target: float
    percentile: float | None
    workers: int
    """Recommended pool size."""
    analytic_w: float
    """Allen–Cunneen mean response time at ``workers`` (s)."""
    utilisation: float
    sim_w: float
    sim_w_hw: float
    sim_p: float | None
    """Simulated ``percentile`` of the response time at ``workers`` (s)."""
    sim_p_hw: float | None
    permits: int
    knee: float | None
    intake_bound: int
    notes: tuple[str, ...]
    sim_method: str

    def as_dict(self) -> dict[str, object]:
        return {
            "measured": self.measured.as_dict(),
            "rate_per_s": self.rate,
            "ca": self.ca,
            "target_s": self.target,
            "percentile": self.percentile,
            "workers": self.workers,
            "utilisation": self.utilisation,
            "analytic_w_s": self.analytic_w,
            "analytic_method": ALLEN_CUNNEEN,
            "simulated_w_s": self.sim_w,
            "simulated_w_ci_half_width": self.sim_w_hw,
            "simulated_percentile_s": self.sim_p,
            "simulated_percentile_ci_half_width": self.sim_p_hw,
            "simulation_method": self.sim_method,
            "permits": self.permits,
            "downstream_knee_permits": self.knee,
            "intake_bound": self.intake_bound,
            "notes": list(self.notes),
        }


def recommend(
    measured: Measured,
    *,
    target: float,
    rate: float | None = None,
    ca: float = 1.0,
    percentile: float | None = None,
    max_utilisation: float = 0.85,
    downstream_capacity: float | None = None,
    customers: int = 5_000,
    replications: int = 5,
    seed: int = 0,
    confidence: float = 0.95,
) -> Fit:
    """Pool size, permits and intake bound for ``target`` (mean, or ``percentile``)."""
    lam = rate if rate is not None else measured.rate
    if lam is None:
        raise LabInputError(
            "rate", None, "is unknown: the input has no arrival rate", 'pass --rate, e.g. "120/s"'
        )
    lam = check_positive("rate", lam, 'give a positive arrival rate, e.g. "120/s"')
    target = check_positive("target", target, 'give a latency target, e.g. "100ms"')
    if not 0.0 < max_utilisation <= 0.99:
        raise LabInputError("max_utilisation", max_utilisation, "is not in (0, 0.99]", "use e.g. 0.85")
    if percentile is not None and not 0.0 < percentile < 100.0:
        raise LabInputError("percentile", percentile, "is not between 0 and 100", "use e.g. 99")
    s = measured.service
    cs = s.cv
    workers = workers_for(s.mean, lam, target=target, ca=ca, cs=cs, max_utilisation=max_utilisation)
    arrivals = Dist.of(1.0 / lam, ca)
    notes: list[str] = []

    if percentile is not None and percentile not in (50, 95, 99):
        raise LabInputError("percentile", percentile, "is not one the simulation reports", "use 50, 95 or 99")

    def check(c: int) -> tuple[float, float, float | None, float | None, float]:
        sim = simulate_pool(
            c,
            s,
            lam,
            arrivals=arrivals,
            customers=customers,
            replications=replications,
            seed=seed,
            confidence=confidence,
        )
        est = {50: sim.p50, 95: sim.p95, 99: sim.p99}.get(int(percentile)) if percentile is not None else None
        return (
            sim.w.mean,
            sim.w.half_width,
            None if est is None else est.mean,
            None if est is None else est.half_width,
            sim.p_wait.mean,
        )

    sim_w, sim_hw, sim_p, sim_p_hw, p_wait = check(workers)
    floor = _service_quantile(measured, percentile)
    if percentile is not None and floor is not None and floor > target:
        notes.append(
            f"the service time alone has p{percentile:g} {floor * 1000:.3g} ms > target: no pool size meets "
            "it; make the work faster or relax the target"
        )
    elif percentile is not None:
        start = workers
        # more workers only help while requests still queue (P(wait) not ~0)
        while sim_p is not None and sim_p > target and p_wait > 0.005:
            workers += 1
            sim_w, sim_hw, sim_p, sim_p_hw, p_wait = check(workers)
        if sim_p is not None and sim_p > target:
            notes.append(
                f"p{percentile:g} stays above the target at {workers} workers although requests barely "
                "queue: the service time itself is too slow; make the work faster"
            )
        elif workers > start:
            notes.append(f"raised from {start} to {workers} workers so that p{percentile:g} meets the target")
    model = allen_cunneen(workers, s.mean, lam, ca, cs)
    assert model is not None  # workers_for guarantees ρ < 1
    knee = downstream_capacity * s.mean if downstream_capacity is not None else None
    permits = workers
    if knee is not None and workers > knee:
        permits = max(1, math.floor(knee))
        notes.append(
            f"the downstream saturates at ~{knee:.0f} concurrent calls (capacity × mean service): "
            "permits are capped there — more only add latency — and the target needs a downstream of ≥ "
            f"{lam / max_utilisation:.0f}/s"
        )
    intake = max(0, math.floor((target - s.mean) * workers / s.mean))
    if measured.cv_note != "sample CV":
        notes.append(f"service CV {cs:.2f} {measured.cv_note}")
    return Fit(
        measured,
        lam,
        ca,
        target,
        percentile,
        workers,
        model.w,
        lam * s.mean / workers,
        sim_w,
        sim_hw,
        sim_p,
        sim_p_hw,
        permits,
        knee,
        intake,
        tuple(notes),
        f"{sim_label(confidence)} ({'trace-driven resampling' if s.kind == 'empirical' else s.describe()}, "
        f"{replications} × {customers} customers)",
    )
