"""Workflows: list and filter, one run's step history with timings, compensation
state, inbox, timers and children; signal and cancel (both through the journal, as
``foundry workflows signal|cancel`` do)."""

from __future__ import annotations

import json
import math
from typing import Any

from foundry.observe.dashboard.jobs import ActionRefused, error_record, preview

__all__ = ["cancel", "list_workflows", "signal", "workflow_detail"]

STATUSES = ("pending", "running", "waiting", "compensating", "succeeded", "failed", "cancelled", "timed_out")
_TREE_LIMIT = 500  # descendants shown in a workflow's tree


def _finite(t: float | None) -> float | None:
    return None if t is None or math.isinf(t) or math.isnan(t) else t


def workflow_row(s: Any) -> dict[str, Any]:
    return {
        "id": s.id,
        "name": s.name,
        "status": s.status.value,
        "compensation": s.compensation,
        "current_step": s.current_step,
        "position": s.position,
        "runs": s.claims,
        "owner": s.owner,
        "cancel_requested": s.cancel_requested,
        "parent_id": s.parent_id,
        "created_at": s.created_at,
        "updated_at": s.updated_at,
        "finished_at": s.finished_at,
        "wake_at": _finite(s.wake_at),
        "deadline": s.deadline,
    }


def list_workflows(
    journal: Any, *, status: str | None = None, name: str | None = None, limit: int = 100
) -> dict[str, Any]:
    if status is not None and status not in STATUSES:
        raise ActionRefused(f"status={status!r} is not a workflow status. Fix: one of {', '.join(STATUSES)}")
    states = journal.workflows(status=status, name=name, limit=max(1, min(int(limit), 500)))
    return {"workflows": [workflow_row(s) for s in states]}


def workflow_detail(journal: Any, workflow_id: str) -> dict[str, Any]:
    from foundry.errors import NotFoundError

    try:
        state, entries = journal.load(workflow_id)
    except NotFoundError as exc:
        raise ActionRefused(f"no workflow {workflow_id!r} in the journal. Fix: check the id") from exc
    inbox = journal.signals(workflow_id)
    children = journal.workflows(parent_id=workflow_id, limit=200)
    out = workflow_row(state)
    out["args"] = preview(state.args, state.codec, 4000)
    out["result"] = preview(state.result, state.codec, 4000)
    out["error"] = error_record(state.error)
    out["lease_until"] = state.lease_until if state.owner else None
    out["step_started_at"] = state.step_started_at
    out["history"] = [
        {
            "position": e.position,
            "kind": e.kind,
            "name": e.name,
            "status": e.status,
            "attempts": e.attempts,
            "started_at": e.started_at,
            "finished_at": e.finished_at,
            "took": None if e.finished_at is None else max(0.0, e.finished_at - e.started_at),
            "wake_at": _finite(e.wake_at),
            "ref": e.ref,
            "detail": e.detail,
            "result": preview(e.result, state.codec, 400),
            "error": error_record(e.error),
        }
        for e in entries
    ]
    out["compensated"] = sorted({e.ref for e in entries if e.kind == "undo" and e.ref is not None})
    out["timers"] = [
        {"position": e.position, "kind": e.kind, "name": e.name, "wake_at": _finite(e.wake_at)}
        for e in entries
        if e.status == "waiting"
    ]
    out["inbox"] = [
        {
            "seq": s.seq,
            "name": s.name,
            "payload": preview(s.payload, "json", 400),
            "sent_at": s.sent_at,
            "consumed_position": s.consumed_position,
        }
        for s in inbox
    ]
    out["children"] = [workflow_row(c) for c in children]
    out["tree"] = _tree(journal, children, _TREE_LIMIT)
    out["published"] = None if not state.published else preview(state.published, "json", 4000)
    out["origin"] = state.origin
    out["can_cancel"] = not state.status.finished and not state.cancel_requested
    out["can_signal"] = not state.status.finished
    return out


def _tree(journal: Any, children: list[Any], budget: int) -> list[dict[str, Any]]:
    """The children as a tree (grandchildren under their parent), at most ``budget`` rows."""
    out: list[dict[str, Any]] = []
    for child in sorted(children, key=lambda c: c.parent_position or 0)[:budget]:
        budget -= 1
        grand = journal.workflows(parent_id=child.id, limit=max(1, budget)) if budget > 0 else []
        node = workflow_row(child)
        node["children"] = _tree(journal, grand, budget)
        budget -= len(grand)
        out.append(node)
    return out


def signal(journal: Any, workflow_id: str, name: Any, payload: Any) -> dict[str, Any]:
    from foundry.errors import NotFoundError, WorkflowFinishedError

    if not isinstance(name, str) or not name or len(name) > 200:
        raise ActionRefused("signal name must be a non-empty string of at most 200 characters")
    data = json.dumps(payload, separators=(",", ":")).encode()
    if len(data) > 64 * 1024:
        raise ActionRefused("signal payload over 64 KiB. Fix: send a reference (an id, a URL) instead")
    try:
        seq = journal.signal(workflow_id, name, data)
    except (NotFoundError, WorkflowFinishedError) as exc:
        raise ActionRefused(str(exc)) from exc
    return {"ok": True, "message": f"signal {name!r} #{seq} is in the inbox of {workflow_id}"}


def cancel(journal: Any, workflow_id: str) -> dict[str, Any]:
    from foundry.errors import NotFoundError

    try:
        accepted = journal.request_cancel(workflow_id)
    except NotFoundError as exc:
        raise ActionRefused(str(exc)) from exc
    if not accepted:
        raise ActionRefused(f"{workflow_id} already finished; nothing to cancel")
    return {
        "ok": True,
        "message": f"cancellation of {workflow_id} requested: it stops at its next durable call and "
        "undoes its completed steps",
    }
