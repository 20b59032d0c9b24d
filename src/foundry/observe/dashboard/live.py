"""The live picture: the plan with its watched figures, the fleet, and the chart
history — gathered from the fleet store, the engines and the exporters, never from a
worker's request path.

One :meth:`Live.sample` reads: the fleet's records (one store read), each durable
queue's stats, each stream group's lag, a bounded page of workflows, and each exporter
named on the command line. The server caches a sample for ``ttl`` seconds, so open
tabs share it; the history keeps one point per ``step`` seconds for ``window``
seconds (15 minutes), in memory, and only while someone is looking.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from foundry.errors import FoundryError
from foundry.observe import names
from foundry.observe.dashboard.sources import Sources
from foundry.observe.dashboard.watch import drift, evaluate
from foundry.observe.fleet import Member, liveness

__all__ = ["Live", "plan_units"]

Metrics = dict[str, list[dict[str, Any]]]


def plan_units(app: Any) -> list[dict[str, Any]]:
    """Every unit and phase of ``app`` with its decision, as the page shows it."""
    from foundry.explain import decision_dict, first_failure

    if app is None:
        return []
    units = []
    for kind, group in (("work", app.units), ("workflow", app.workflows), ("stream", app.streams)):
        for name, unit in group.items():
            traits = getattr(unit, "traits", None)
            main = unit.decision
            phases = dict(getattr(unit, "phases", {}) or {})
            queue = None
            if main.delivery == "queue":
                queue = (getattr(traits, "queue", None) if traits is not None else None) or "default"
            rows = []
            for d in (main, *phases.values()):
                data = decision_dict(d)
                data["first_failure"] = first_failure(d)
                answers = {(a.axis, a.id): a.answer for a in d.questions}
                data["delivery_answer"] = answers.get(("delivery", d.delivery_decided_by), "")
                data["execution_answer"] = answers.get(("execution", d.decided_by), "")
                rows.append(data)
            units.append({"name": name, "kind": kind, "queue": queue, "phases": rows})
    return units


def _merge(into: Metrics, rows: dict[str, list[dict[str, Any]]], source: str, instance: str) -> None:
    for name, samples in rows.items():
        for row in samples:
            labels = {**row.get("labels", {}), "source": source, "instance": instance}
            into.setdefault(name, []).append({**row, "labels": labels})


class Live:
    """Samples the sources; keeps the chart history."""

    def __init__(
        self,
        sources: Sources,
        *,
        window: float = 900.0,
        step: float = 2.0,
        clock: Callable[[], float] = time.time,
        fetch: Callable[[str, float], dict[str, Any]] | None = None,
    ) -> None:
        self.sources = sources
        self.window = window
        self.step = step
        self.clock = clock
        self.history: deque[dict[str, Any]] = deque(maxlen=max(2, int(window / step) + 1))
        self._lock = threading.Lock()
        self.host = socket.gethostname()
        self._fetch = fetch
        self.units = plan_units(sources.app)

    def plan(self) -> list[dict[str, Any]]:
        """The app's units and phases as decided now: a phase moved at run time
        (``adaptive=True``) shows its new decision."""
        self.units = plan_units(self.sources.app)
        return self.units

    # -- gathering ---------------------------------------------------------------------

    def _fleet(self, now: float, errors: dict[str, str]) -> list[Member]:
        try:
            with self.sources.using("fleet") as store:
                return list(store.members())
        except (FoundryError, OSError) as exc:
            errors["fleet"] = self.sources.redact(str(exc))
            return []

    def _exporters(self, errors: dict[str, str]) -> list[dict[str, Any]]:
        from foundry.observe.top import fetch_snapshot

        out = []
        for url in self.sources.exporters:
            try:
                fetch = self._fetch or (lambda u, t: fetch_snapshot(u, timeout=t))
                snap = fetch(url, 1.5)
                out.append({"url": url, "up": True, "metrics": snap})
            except (FoundryError, OSError) as exc:
                out.append(
                    {"url": url, "up": False, "metrics": {}, "why": self.sources.redact(str(exc))[:300]}
                )
        return out

    def _queues(self, members: list[dict[str, Any]], errors: dict[str, str]) -> list[dict[str, Any]]:
        from foundry.observe.dashboard.jobs import known_queues, queue_stats

        declared = sorted({u["queue"] for u in self.units if u["queue"]})
        for m in members:
            declared += [q for q in m["details"].get("queues", []) or [] if isinstance(q, str)]
        try:
            with self.sources.using("queue") as backend:
                queues = sorted(set(declared)) if declared else known_queues(backend, [])
                rows = queue_stats(backend, queues[:50])
                for row in rows:  # dead letters per unit: a queue is shared by units
                    by_unit: dict[str, int] = {}
                    if row["dead"]:
                        for s in backend.dead_letters(row["queue"], limit=500):
                            by_unit[s.unit] = by_unit.get(s.unit, 0) + 1
                    row["dead_by_unit"] = by_unit
                return rows
        except (FoundryError, OSError) as exc:
            errors["queue"] = self.sources.redact(str(exc))
            return []

    def _lag(self, errors: dict[str, str]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        try:
            with self.sources.using("stream") as backend:
                for name in backend.streams()[:50]:
                    for group in backend.groups(name)[:50]:
                        for p in backend.lag(name, group):
                            out.append(
                                {"stream": name, "group": group, "partition": p.partition, "lag": p.lag}
                            )
        except (FoundryError, OSError) as exc:
            errors["stream"] = self.sources.redact(str(exc))
        return out

    def _workflows(self, errors: dict[str, str]) -> dict[str, dict[str, int]]:
        counts: dict[str, dict[str, int]] = {}
        try:
            with self.sources.using("journal") as journal:
                for s in journal.workflows(limit=500):
                    by = counts.setdefault(s.name, {})
                    by[s.status.value] = by.get(s.status.value, 0) + 1
        except (FoundryError, OSError) as exc:
            errors["journal"] = self.sources.redact(str(exc))
        return counts

    def sample(self) -> dict[str, Any]:
        """One full picture (what ``/api/live`` returns, before the history slice)."""
        now = self.clock()
        errors: dict[str, str] = {}
        fleet = []
        metrics: Metrics = {}
        reports: list[dict[str, Any]] = []
        for m in self._fleet(now, errors):
            state, why = liveness(m, now, this_host=self.host)
            fleet.append(
                {
                    "id": m.id,
                    "role": m.role,
                    "app": m.app,
                    "host": m.host,
                    "pid": m.pid,
                    "started_at": m.started_at,
                    "beat_at": m.beat_at,
                    "uptime": max(0.0, (m.beat_at if state != "up" else now) - m.started_at),
                    "state": state,
                    "why": why,
                    "details": m.details,
                    "in_flight": sum(r.get("value", 0) for r in m.metrics.get(names.UNIT_IN_FLIGHT, [])),
                    "completed": sum(r.get("value", 0) for r in m.metrics.get(names.UNIT_COMPLETED, [])),
                }
            )
            if state == "up":  # a dead process's last figures are history, not the present
                _merge(metrics, m.metrics, "fleet", m.id)
                reports += [{**r, "member": m.id} for r in m.reports]
        exporters = self._exporters(errors)
        for e in exporters:
            _merge(metrics, e["metrics"], "exporter", e["url"])
            fleet.append(
                {
                    "id": e["url"],
                    "role": "exporter",
                    "app": "",
                    "host": e["url"].split("://", 1)[-1],
                    "pid": None,
                    "started_at": None,
                    "beat_at": now if e["up"] else None,
                    "uptime": None,
                    "state": "up" if e["up"] else "down",
                    "why": "answered /metrics.json" if e["up"] else e.get("why", "unreachable"),
                    "details": {},
                    "in_flight": sum(r.get("value", 0) for r in e["metrics"].get(names.UNIT_IN_FLIGHT, [])),
                    "completed": sum(r.get("value", 0) for r in e["metrics"].get(names.UNIT_COMPLETED, [])),
                }
            )
        queues = self._queues(fleet, errors)
        for q in queues:
            labels = {"queue": q["queue"], "source": "engine"}
            metrics.setdefault(names.QUEUE_DEPTH, []).append({"labels": labels, "value": q["depth"]})
            metrics.setdefault(names.QUEUE_OLDEST_AGE, []).append(
                {"labels": labels, "value": q["oldest_age"]}
            )
        for u in self.units:
            if u["queue"]:
                dead = sum(q["dead_by_unit"].get(u["name"], 0) for q in queues if q["queue"] == u["queue"])
                labels = {"unit": u["name"], "queue": u["queue"], "source": "engine"}
                if queues:
                    metrics.setdefault(names.JOB_DEAD, []).append({"labels": labels, "value": dead})
        lag = self._lag(errors)
        for row in lag:
            labels = {
                "stream": row["stream"],
                "group": row["group"],
                "partition": str(row["partition"]),
                "source": "engine",
            }
            metrics.setdefault(names.STREAM_CONSUMER_LAG, []).append({"labels": labels, "value": row["lag"]})
        workflows = self._workflows(errors)
        plan = self._evaluate(metrics, reports, workflows)
        point = self._point(now, metrics, queues, lag)
        with self._lock:
            if not self.history or now - self.history[-1]["t"] >= self.step * 0.9:
                self.history.append(point)
        return {
            "now": now,
            "plan": plan,
            "fleet": fleet,
            "queues": queues,
            "workflows": workflows,
            "reports": reports[-20:],
            "errors": errors,
            "point": point,
        }

    def _evaluate(
        self, metrics: Metrics, reports: list[dict[str, Any]], workflows: dict[str, dict[str, int]]
    ) -> list[dict[str, Any]]:
        app = self.sources.app
        host = getattr(app, "host", None)
        out = []
        for u in self.units:
            unit = self._unit(u["name"])
            traits = getattr(unit, "traits", None)
            decisions = [unit.decision, *dict(getattr(unit, "phases", {}) or {}).values()]
            phases = []
            for d in decisions:
                figures = evaluate(d, traits, metrics, unit=u["name"], queue=u["queue"])
                warnings = drift(d, traits, metrics, unit=u["name"], host=host)
                phases.append(
                    {"phase": d.phase, "figures": [f.as_dict() for f in figures], "drift": warnings}
                )
            mentioned = [
                r
                for r in reports
                if f"'{u['name']}" in str(r.get("message", ""))
                or f"({u['name']})" in str(r.get("message", ""))
            ]
            out.append(
                {
                    "name": u["name"],
                    "phases": phases,
                    "reports": mentioned[-5:],
                    "runs": workflows.get(u["name"], {}) if u["kind"] == "workflow" else {},
                }
            )
        return out

    def _unit(self, name: str) -> Any:
        app = self.sources.app
        for group in (app.units, app.workflows, app.streams):
            if name in group:
                return group[name]
        raise KeyError(name)

    @staticmethod
    def _point(
        now: float, metrics: Metrics, queues: list[dict[str, Any]], lag: list[dict[str, Any]]
    ) -> dict[str, Any]:
        def total(name: str, field: str) -> float:
            return float(sum(float(r.get(field, 0) or 0) for r in metrics.get(name, [])))

        loops: dict[str, float] = {}
        for r in metrics.get(names.LOOP_LAG, []):
            loop = str(r["labels"].get("loop", "?"))
            loops[loop] = max(loops.get(loop, 0.0), float(r.get("p99", 0) or 0))
        groups: dict[str, float] = {}
        for row in lag:
            key = f"{row['stream']}/{row['group']}"
            groups[key] = groups.get(key, 0.0) + row["lag"]
        return {
            "t": now,
            "throughput": total(names.UNIT_COMPLETED, "rate"),
            "in_flight": total(names.UNIT_IN_FLIGHT, "value"),
            "queue_age": {q["queue"]: q["oldest_age"] for q in queues},
            "queue_depth": {q["queue"]: q["depth"] for q in queues},
            "loop_lag_p99": loops,
            "consumer_lag": groups,
        }

    def since(self, t: float) -> list[dict[str, Any]]:
        with self._lock:
            return [p for p in self.history if p["t"] > t]
