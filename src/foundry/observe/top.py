"""Render a metrics snapshot for a terminal (``foundry top``) and fetch one from an
exporter. Pure functions over the snapshot dict, so they are testable without a TTY."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from foundry.config import safe_url
from foundry.errors import BackendUnavailableError
from foundry.observe import names

__all__ = ["fetch_snapshot", "render_snapshot"]

Snapshot = dict[str, list[dict[str, Any]]]


def fetch_snapshot(url: str, timeout: float = 5.0) -> Snapshot:
    """GET ``{url}/metrics.json`` from a Foundry exporter."""
    target = url.rstrip("/") + "/metrics.json"
    shown = safe_url(target)
    try:
        with urllib.request.urlopen(target, timeout=timeout) as response:
            body = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise BackendUnavailableError(
            f"cannot read metrics from {shown}: {exc}. Fix: start the process with an exporter "
            "(`foundry worker ... --metrics-port 9464` or `app.serve_metrics(port=9464)`) and pass its URL"
        ) from exc
    metrics = body.get("metrics") if isinstance(body, dict) else None
    if not isinstance(metrics, dict):
        raise BackendUnavailableError(f"{shown} did not return a Foundry metrics snapshot")
    return metrics


def _rows(snap: Snapshot, name: str) -> list[dict[str, Any]]:
    return list(snap.get(name, []))


def _by(snap: Snapshot, metric_names: list[str], label: str | None) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name in metric_names:
        for row in _rows(snap, name):
            labels: dict[str, str] = row.get("labels", {})
            key = labels.get(label, "") if label else ""
            key = key or "/".join(labels.values()) or "(all)"
            out.setdefault(key, {})[name] = row
    return dict(sorted(out.items()))


def _num(row: dict[str, Any] | None, field: str = "value", digits: int = 0) -> str:
    if row is None or field not in row:
        return "·"
    return f"{float(row[field]):.{digits}f}"


def _ms(row: dict[str, Any] | None, field: str) -> str:
    if row is None or field not in row:
        return "·"
    return f"{float(row[field]) * 1000:.1f} ms"


def _culprits(snap: Snapshot) -> dict[str, str]:
    """Per loop, the unit (and phase) and frame that held it in the most stalls."""
    best: dict[str, tuple[float, str]] = {}
    for row in _rows(snap, names.LOOP_CULPRIT):
        labels: dict[str, str] = row.get("labels", {})
        count = float(row.get("value", 0.0))
        unit, phase, frame = labels.get("unit", ""), labels.get("phase", ""), labels.get("culprit", "")
        subject = unit if phase in ("", "main") else f"{unit}.{phase}" if unit else phase
        text = f"{subject}: {frame}" if subject and frame else subject or frame
        loop = labels.get("loop", "")
        if count > best.get(loop, (0.0, ""))[0]:
            best[loop] = (count, f"{text} ×{count:.0f}")
    return {loop: text for loop, (_, text) in best.items()}


def _table(title: str, caption: str, columns: list[str]) -> Table:
    table = Table(title=title, caption=caption, title_justify="left", caption_justify="left", expand=True)
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    return table


def render_snapshot(snap: Snapshot) -> RenderableType:
    """One table per kind of hand-off that has something to show."""
    parts: list[RenderableType] = []
    units = _by(
        snap, [names.UNIT_IN_FLIGHT, names.UNIT_COMPLETED, names.UNIT_FAILED, names.UNIT_DURATION], "unit"
    )
    if units:
        table = _table(
            "Units", "in flight against throughput", ["unit", "in flight", "done/s", "done", "failed", "p99"]
        )
        for key, r in units.items():
            failed = _num(r.get(names.UNIT_FAILED))
            table.add_row(
                key,
                _num(r.get(names.UNIT_IN_FLIGHT)),
                _num(r.get(names.UNIT_COMPLETED), "rate", 1),
                _num(r.get(names.UNIT_COMPLETED)),
                Text(failed, style="red" if failed not in ("·", "0") else ""),
                _ms(r.get(names.UNIT_DURATION), "p99"),
            )
        parts.append(table)
    queues = _by(snap, [names.QUEUE_DEPTH, names.QUEUE_OLDEST_AGE, names.JOB_RETRIES, names.JOB_DEAD], None)
    if queues:
        table = _table(
            "Hand-offs",
            "depth is a snapshot; age says whether it drains",
            ["queue", "depth", "oldest", "retries", "dead"],
        )
        for key, r in queues.items():
            age = r.get(names.QUEUE_OLDEST_AGE)
            age_s = float(age["value"]) if age else 0.0
            style = "red" if age_s > 60 else "yellow" if age_s > 5 else "green"
            table.add_row(
                key,
                _num(r.get(names.QUEUE_DEPTH)),
                Text(f"{age_s:.1f} s" if age else "·", style=style),
                _num(r.get(names.JOB_RETRIES)),
                _num(r.get(names.JOB_DEAD)),
            )
        parts.append(table)
    loops = _by(snap, [names.LOOP_LAG, names.LOOP_BLOCKED], "loop")
    if loops:
        table = _table(
            "Event loops",
            "a ready task that is not running, and what held the loop most often",
            ["loop", "p50", "p99", "max", "blocked", "held by"],
        )
        held_by = _culprits(snap)
        for key, r in loops.items():
            lag = r.get(names.LOOP_LAG)
            worst = float(lag["max"]) if lag and "max" in lag else 0.0
            style = "red" if worst > 0.1 else "yellow" if worst > 0.02 else "green"
            table.add_row(
                key,
                _ms(lag, "p50"),
                _ms(lag, "p99"),
                Text(_ms(lag, "max"), style=style),
                _num(r.get(names.LOOP_BLOCKED)),
                held_by.get(key, "·"),
            )
        parts.append(table)
    simple = [
        (
            "Process pools",
            "exit codes and restarts: isolation in use",
            [names.CHILD_EXITS, names.CHILD_RESTARTS],
        ),
        (
            "Channels",
            "buffer fill and blocked senders: backpressure",
            [names.CHANNEL_FILL, names.CHANNEL_BLOCKED_SENDERS],
        ),
        (
            "Phases moved",
            "phases taken off an event loop at run time (adaptive=True), and pools measured waiting",
            [names.PHASE_MOVED, names.PHASE_DRIFT],
        ),
        ("Streams", "consumer lag per group and partition", [names.STREAM_CONSUMER_LAG]),
        ("Workflows", "step states and compensations", [names.WORKFLOW_STEPS, names.WORKFLOW_COMPENSATIONS]),
    ]
    for title, caption, metric_names in simple:
        samples = [(n, row) for n in metric_names for row in _rows(snap, n)]
        if not samples:
            continue
        table = _table(title, caption, ["metric", "labels", "value"])
        for name, row in samples:
            labels = ", ".join(f"{k}={v}" for k, v in row.get("labels", {}).items())
            table.add_row(name.removeprefix("foundry_"), labels, _num(row))
        parts.append(table)
    if not parts:
        parts.append(Text("nothing reported yet: no unit has run in this process", style="dim"))
    return Group(*parts)
