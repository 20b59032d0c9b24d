"""Each decision's watch list, turned into live figures with thresholds, and drift.

A :class:`~foundry.decide.Decision` names the metrics that would show its model
failing (``decision.watch``). This module says, for each of those names, which samples
belong to the unit, how to reduce them to one figure, and past which value the figure
contradicts the decision — derived from what the author declared (a 50 ms latency
budget makes a 12.5 ms p99 loop lag the limit; a declared concurrency of 300 makes 300
in flight the limit). The table (:data:`RULES`) is data; :func:`evaluate` is pure.

:func:`drift` re-asks the decision engine with what was *measured*
(:func:`foundry.decide.reclassify`, with the engine's own drift rule): a unit declared
``est="2ms"`` whose measured median is 500 ms over enough runs may now belong on
another model — the warning says which. Watchdog stall reports that name a unit
("reclassify ...") are attached to it as they arrive.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from foundry.decide import Decision, Host, Measured, reclassify
from foundry.decide import drift as engine_drift
from foundry.observe import names

__all__ = ["RULES", "Figure", "Rule", "drift", "evaluate", "select"]

Rows = Sequence[Mapping[str, Any]]
Metrics = Mapping[str, Rows]


@dataclass(frozen=True, slots=True)
class Rule:
    """How one watched metric becomes one figure, and its limit for a unit."""

    metric: str
    label: str  # short name on the page
    field: str  # "value", "rate", "p50", "p99"
    combine: str  # "sum" or "max"
    unit: str  # "s", "/s", "", "ratio", "events"
    limit: Callable[[Any], tuple[float | None, str]]  # traits -> (limit, why)
    at_least: bool = False  # over when figure >= limit (a pool with every worker busy)


@dataclass(frozen=True, slots=True)
class Figure:
    metric: str
    label: str
    value: float | None  # None: nothing reports it yet
    unit: str
    limit: float | None
    why: str
    state: str  # "nodata" | "ok" | "near" | "over"
    source: str  # "engine", "fleet", "exporter" or "-"

    def as_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "label": self.label,
            "value": self.value,
            "unit": self.unit,
            "limit": self.limit,
            "why": self.why,
            "state": self.state,
            "source": self.source,
        }


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:g} s"


def _none(_: Any) -> tuple[float | None, str]:
    return None, "no limit follows from the declaration; watch the trend"


def _zero(why: str) -> Callable[[Any], tuple[float | None, str]]:
    return lambda _: (0.0, why)


def _loop_lag(t: Any) -> tuple[float | None, str]:
    if t is not None and t.latency:
        return t.latency / 4, f"a quarter of the {_ms(t.latency)} latency budget"
    return 0.1, "the watchdog's stall threshold (100 ms); declare latency= for a tighter one"


def _in_flight(t: Any) -> tuple[float | None, str]:
    if t is not None and t.concurrency:
        return float(t.concurrency), f"declared concurrency={t.concurrency}: the decision assumed no more"
    if t is not None and t.workers:
        return float(t.workers), f"declared workers={t.workers}"
    return _none(t)


def _duration(t: Any) -> tuple[float | None, str]:
    if t is not None and t.timeout:
        return 0.8 * t.timeout, f"80 % of the declared timeout ({_ms(t.timeout)})"
    if t is not None and t.est:
        return 4 * t.est, f"4x the declared est ({_ms(t.est)}): the decision was made for that size"
    return _none(t)


def _depth(t: Any) -> tuple[float | None, str]:
    if t is not None and t.max_pending:
        return 0.8 * t.max_pending, f"80 % of the bounded intake (max_pending={t.max_pending})"
    if t is not None and t.rate:
        horizon = t.latency or 60.0
        return max(1.0, t.rate * horizon), f"{_ms(horizon)} of declared arrivals ({t.rate:g}/s)"
    return _none(t)


def _age(t: Any) -> tuple[float | None, str]:
    if t is not None and t.latency:
        return t.latency, f"the declared latency budget ({_ms(t.latency)})"
    if t is not None and t.est:
        limit = max(1.0, 10 * t.est)
        return limit, f"10x the declared est ({_ms(t.est)}): work waits far longer than it runs"
    return 60.0, "a minute: nothing declared says how long work may wait"


def _busy(t: Any) -> tuple[float | None, str]:
    if t is not None and t.workers:
        return float(t.workers), f"every one of the {t.workers} declared workers busy: saturated"
    return _none(t)


def _wait(t: Any) -> tuple[float | None, str]:
    if t is not None and t.latency:
        return t.latency / 2, f"half the {_ms(t.latency)} latency budget: the other half is the work"
    if t is not None and t.est:
        return 2 * t.est, f"2x the declared est ({_ms(t.est)}): requests wait longer than they run"
    return _none(t)


def _lag(t: Any) -> tuple[float | None, str]:
    if t is not None and t.rate:
        horizon = max(t.latency or 0.0, 10.0)
        return t.rate * horizon, f"{_ms(horizon)} behind at the declared {t.rate:g}/s"
    return 1000.0, "1000 events; declare rate= to express it as time behind"


RULES: dict[str, Rule] = {
    r.metric: r
    for r in (
        Rule(names.LOOP_LAG, "loop lag p99", "p99", "max", "s", _loop_lag),
        Rule(
            names.LOOP_BLOCKED, "loop stalls", "rate", "sum", "/s", _zero("any stall: a phase holds the loop")
        ),
        Rule(names.UNIT_IN_FLIGHT, "in flight", "value", "sum", "", _in_flight),
        Rule(names.UNIT_COMPLETED, "throughput", "rate", "sum", "/s", _none),
        Rule(names.UNIT_FAILED, "failures", "rate", "sum", "/s", _zero("units raising now")),
        Rule(names.UNIT_DURATION, "duration p99", "p99", "max", "s", _duration),
        Rule(names.QUEUE_DEPTH, "queue depth", "value", "sum", "", _depth),
        Rule(names.QUEUE_OLDEST_AGE, "oldest age", "value", "max", "s", _age),
        Rule(names.POOL_BUSY, "busy workers", "value", "sum", "", _busy, at_least=True),
        Rule(names.POOL_REJECTED, "rejected", "rate", "sum", "/s", _zero("a full intake refusing work")),
        Rule(names.POOL_QUEUE_WAIT, "wait for a worker p99", "p99", "max", "s", _wait),
        Rule(names.POOL_LOST, "lost requests", "rate", "sum", "/s", _zero("workers dying with requests")),
        Rule(
            names.CPU_UTILISATION,
            "cpu",
            "value",
            "max",
            "ratio",
            lambda _: (0.9, "90 % of the workers' cores: no headroom"),
        ),
        Rule(names.CHILD_EXITS, "child crashes", "value", "sum", "", _zero("a child exited abnormally")),
        Rule(names.CHILD_RESTARTS, "child restarts", "rate", "sum", "/s", _zero("children being replaced")),
        Rule(
            names.CHANNEL_FILL,
            "channel fill",
            "value",
            "max",
            "ratio",
            lambda _: (0.9, "a stage's input 90 % full: it is the bottleneck"),
        ),
        Rule(
            names.CHANNEL_BLOCKED_SENDERS,
            "blocked senders",
            "value",
            "sum",
            "",
            _zero("backpressure reaching the previous stage"),
        ),
        Rule(names.JOB_RETRIES, "retries", "rate", "sum", "/s", _zero("jobs failing and being retried")),
        Rule(
            names.JOB_DEAD, "dead letters", "value", "sum", "", _zero("jobs given up on: read and retry them")
        ),
        Rule(
            names.JOB_REDELIVERIES,
            "redeliveries",
            "rate",
            "sum",
            "/s",
            _zero("leases lapsing: workers dying or hanging"),
        ),
        Rule(names.STREAM_CONSUMER_LAG, "consumer lag", "value", "sum", "events", _lag),
        Rule(names.WORKFLOW_STEPS, "failed steps", "value", "sum", "", _zero("steps failing")),
        Rule(
            names.WORKFLOW_COMPENSATIONS,
            "compensations",
            "value",
            "sum",
            "",
            _zero("sagas being undone"),
        ),
    )
}


def select(metric: str, rows: Rows, unit: str, phase: str, queue: str | None) -> list[Mapping[str, Any]]:
    """The samples of ``metric`` that belong to ``unit`` (or its ``phase``)."""
    subject = unit if phase == "main" else f"{unit}.{phase}"

    def mine(labels: Mapping[str, Any]) -> bool:
        if metric in (names.LOOP_LAG, names.LOOP_BLOCKED):
            return True  # loops are per process, not per unit: every loop the fleet runs
        if metric in (names.QUEUE_DEPTH, names.QUEUE_OLDEST_AGE):
            return labels.get("unit") == subject or (queue is not None and labels.get("queue") == queue)
        if metric in (names.CHANNEL_FILL, names.CHANNEL_BLOCKED_SENDERS):
            stage = str(labels.get("stage", labels.get("queue", "")))
            return stage == subject or stage.startswith(subject + ".")
        if metric == names.STREAM_CONSUMER_LAG:
            return labels.get("stream") == unit
        if metric in (names.WORKFLOW_STEPS, names.WORKFLOW_COMPENSATIONS):
            if labels.get("workflow") != unit:
                return False
            return metric != names.WORKFLOW_STEPS or labels.get("state") in ("error", "failed")
        if metric == names.CHILD_EXITS and str(labels.get("code", "0")) == "0":
            return False
        return labels.get("unit") == subject

    picked = [r for r in rows if isinstance(r.get("labels"), Mapping) and mine(r["labels"])]
    # The engine's own figure (a durable queue's depth) wins over what processes report.
    engine = [r for r in picked if r["labels"].get("source") == "engine"]
    return engine or picked


def _reduce(rule: Rule, rows: Sequence[Mapping[str, Any]]) -> float | None:
    values = [float(r[rule.field]) for r in rows if isinstance(r.get(rule.field), int | float)]
    if not values and rule.field == "rate":  # a gauge-like counter (engine dead count)
        values = [float(r["value"]) for r in rows if isinstance(r.get("value"), int | float)]
    if not values:
        return None
    return max(values) if rule.combine == "max" else sum(values)


def _source(rows: Sequence[Mapping[str, Any]]) -> str:
    sources = {str(r["labels"].get("source", "fleet")) for r in rows}
    return ",".join(sorted(sources)) if sources else "-"


def evaluate(
    decision: Decision, traits: Any, metrics: Metrics, *, unit: str, queue: str | None = None
) -> list[Figure]:
    """One :class:`Figure` per metric the decision says to watch (in its order)."""
    out: list[Figure] = []
    for metric in decision.watch:
        rule = RULES.get(metric)
        if rule is None:
            out.append(Figure(metric, metric, None, "", None, "no rule for this metric", "nodata", "-"))
            continue
        rows = select(metric, metrics.get(metric, ()), unit, decision.phase, queue)
        value = _reduce(rule, rows)
        limit, why = rule.limit(traits)
        if value is None:
            state = "nodata"
        elif limit is None:
            state = "ok"
        elif value > limit or (rule.at_least and value >= limit > 0):
            state = "over"
        elif limit > 0 and value >= 0.8 * limit:
            state = "near"
        else:
            state = "ok"
        out.append(
            Figure(metric, rule.label, value, rule.unit, limit, why, state, _source(rows) if rows else "-")
        )
    return out


def drift(
    decision: Decision,
    traits: Any,
    metrics: Metrics,
    *,
    unit: str,
    host: Host | None = None,
    min_runs: int = 20,
) -> list[str]:
    """Reclassification warnings for ``unit`` from what was measured.

    The measured median duration (the largest over the processes reporting it, after at
    least ``min_runs`` runs) is what :class:`~foundry.decide.Measured` says the unit's
    ``est`` is. The decision engine's own rule (:func:`foundry.decide.drift`) says whether
    that contradicts the declaration, and :func:`foundry.decide.reclassify` gives the
    decision it calls for: one rule for the page, ``foundry profile`` and the engine."""
    if traits is None:
        return []
    subject = unit if decision.phase == "main" else f"{unit}.{decision.phase}"
    rows = [
        r
        for r in metrics.get(names.UNIT_DURATION, ())
        if isinstance(r.get("labels"), Mapping) and r["labels"].get("unit") == subject
    ]
    runs = sum(int(r.get("count", 0) or 0) for r in rows)
    medians = [float(r["p50"]) for r in rows if isinstance(r.get("p50"), int | float) and r.get("count")]
    if runs < min_runs or not medians:
        return []
    measured = Measured(est=max(medians), source=f"the median of {runs} runs")
    found = engine_drift(traits, measured)
    if not found:
        return []
    again = reclassify(traits, measured, phase=decision.phase, host=host)
    verdict = (
        f"reclassify this phase: {again.model} (decided by {again.decided_by}), not {decision.model}"
        if again.model != decision.model
        else f"the decision ({decision.model}) still holds at the measured size"
    )
    return [f"{line}; {verdict}" for line in found]
