"""Jobs: list and filter, one job's arguments, attempts, traceback and timeline, and
the actions every queue engine offers (retry a dead or failed job, cancel a queued or
running one, purge a queue's waiting jobs or the expired records).

Cancelling a *running* job records a request that its worker acts on (the queue
contract, ``foundry.backends.queue.base``): the page says so, and shows the request
until the job ends ``cancelled``. What an engine does not offer is said, not faked:
engines without ``jobs()`` cannot be listed, only their dead letters. Payloads are
previewed as text, truncated, and never decoded with pickle: a pickled payload shows
as its size.
"""

from __future__ import annotations

import json
import time
from typing import Any

from foundry.errors import FoundryError

__all__ = [
    "ActionRefused",
    "cancel",
    "error_record",
    "job_detail",
    "job_row",
    "list_jobs",
    "purge",
    "queue_stats",
    "retry",
]

PREVIEW = 120  # characters of arguments in a list row
DETAIL = 4000  # characters of arguments / result in a job's page
TRACEBACK = 20_000
SCAN = 500  # jobs one list request reads from the engine at most
STATES = ("queued", "running", "succeeded", "failed", "dead", "cancelled")


class ActionRefused(FoundryError):
    """The engine refused an action (the job is in a state that does not allow it)."""


def preview(data: bytes | None, codec: str, limit: int) -> str | None:
    """Arguments or a result as text, at most ``limit`` characters (never unpickled)."""
    if data is None:
        return None
    if codec != "json":
        return f"<{codec} payload, {len(data)} bytes: not decoded>"
    text = data.decode("utf-8", errors="replace")
    try:
        text = json.dumps(json.loads(text), ensure_ascii=False, indent=1 if limit > PREVIEW else None)
    except ValueError:
        pass
    if len(text) > limit:
        return text[: limit - 1] + f"… ({len(data)} bytes)"
    return text


def error_record(data: bytes | str | None) -> dict[str, Any] | None:
    """An error stored as the JSON of ``foundry.serialize.encode_error`` (or anything
    else: shown as text), bounded: type, message and the end of the traceback."""
    if not data:
        return None
    raw = data if isinstance(data, bytes) else data.encode()
    try:
        record = json.loads(raw)
    except ValueError:
        return {"type": "", "message": raw[:2000].decode(errors="replace"), "traceback": ""}
    if not isinstance(record, dict):
        return {"type": "", "message": str(record)[:2000], "traceback": ""}
    tb = str(record.get("traceback") or "")
    return {
        "type": str(record.get("type", ""))[:300],
        "message": str(record.get("message", ""))[:4000],
        "traceback": tb if len(tb) <= TRACEBACK else "…" + tb[-TRACEBACK:],
    }


def job_row(state: Any) -> dict[str, Any]:
    err = error_record(state.error)
    return {
        "id": state.id,
        "unit": state.unit,
        "queue": state.queue,
        "status": state.status.value,
        "deliveries": state.deliveries,
        "attempts": state.attempts,
        "priority": state.priority,
        "enqueued_at": state.enqueued_at,
        "eta": state.eta,
        "finished_at": state.finished_at,
        "dead_reason": state.dead_reason,
        "cancel_requested_at": state.cancel_requested_at,
        "error": None if err is None else f"{err['type'].rsplit('.', 1)[-1]}: {err['message']}"[:300],
        "args": preview(state.payload, state.codec, PREVIEW),
        "progress": _progress(state.progress),
    }


def _progress(record: Any) -> dict[str, Any] | None:
    """A job's last ``foundry.progress()`` record, with its fraction and the text to show."""
    if record is None:
        return None
    return {
        "done": record.done,
        "total": record.total,
        "note": record.note,
        "at": record.at,
        "fraction": record.fraction,
        "text": record.describe(),
    }


def _timeline(state: Any, now: float) -> list[dict[str, Any]]:
    """What the store's record says happened, in order (the store keeps counters and
    times, not a per-delivery log)."""
    events: list[dict[str, Any]] = [
        {"at": state.enqueued_at, "what": "enqueued", "detail": f"queue {state.queue}"}
    ]
    if state.eta and state.eta > state.enqueued_at + 0.001 and state.status.value == "queued":
        events.append(
            {"at": state.eta, "what": "due", "detail": "claimable from then (delay or retry back-off)"}
        )
    if state.deliveries:
        lost = max(
            0,
            state.deliveries - state.attempts - (1 if state.status.value in ("running", "succeeded") else 0),
        )
        detail = f"{state.deliveries} deliveries, {state.attempts} failed attempts recorded"
        if lost > 0:
            detail += f", {lost} ended without an outcome (worker died or hung: lease lapsed)"
        events.append({"at": None, "what": "delivered", "detail": detail})
    if state.status.value == "running":
        events.append({"at": None, "what": "running", "detail": "leased to a worker now"})
    if state.cancel_requested_at is not None:
        detail = "its worker was asked to stop it" if state.status.value == "running" else "it was stopped"
        events.append({"at": state.cancel_requested_at, "what": "cancel requested", "detail": detail})
    if state.finished_at is not None:
        what = state.status.value
        detail = state.dead_reason or ""
        events.append({"at": state.finished_at, "what": what, "detail": detail})
    return events


def job_detail(state: Any, now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    out = job_row(state)
    out.update(
        {
            "key": state.key,
            "codec": state.codec,
            "args": preview(state.payload, state.codec, DETAIL),
            "result": preview(state.result, state.codec, DETAIL),
            "error": error_record(state.error),
            "timeline": _timeline(state, now),
            "can_retry": state.status.value in ("dead", "failed"),
            "can_cancel": state.status.value in ("queued", "running"),
            "cancel_note": _cancel_note(state),
        }
    )
    return out


STOPS = (
    "its worker stops it (an isolate=True job's child is killed, an async job's task is cancelled, "
    "a job on a thread stops at its next checkpoint()) and it ends cancelled, never retried"
)


def _cancel_note(state: Any) -> str:
    if state.status.value != "running":
        return ""
    if state.cancel_requested_at is not None:
        return f"cancel requested: waiting for its worker to stop it; {STOPS}"
    return f"running: a cancel asks its worker to stop it; {STOPS}"


def list_jobs(
    backend: Any,
    *,
    queue: str | None = None,
    status: str | None = None,
    unit: str | None = None,
    since: float | None = None,
    until: float | None = None,
    limit: int = 100,
) -> dict[str, Any]:
    """Jobs newest first, filtered by queue and state in the engine and by unit and
    enqueue time here (over the most recent ``SCAN`` matching jobs)."""
    limit = max(1, min(int(limit), SCAN))
    lister = getattr(backend, "jobs", None)
    listed = True
    if status == "dead" or lister is None:
        states = backend.dead_letters(queue, limit=SCAN)
        listed = lister is not None
    else:
        states = lister(queue=queue, status=status, limit=SCAN)
    scanned = len(states)
    picked = [
        s
        for s in states
        if (unit is None or s.unit == unit)
        and (since is None or s.enqueued_at >= since)
        and (until is None or s.enqueued_at <= until)
        and (status is None or s.status.value == status)
    ]
    return {
        "jobs": [job_row(s) for s in picked[:limit]],
        "scanned": scanned,
        "capped": scanned >= SCAN,
        "can_list": listed,
    }


def queue_stats(backend: Any, queues: list[str]) -> list[dict[str, Any]]:
    out = []
    for q in queues:
        s = backend.stats(q)
        out.append(
            {
                "queue": q,
                "depth": s.depth,
                "scheduled": s.scheduled,
                "running": s.running,
                "dead": s.dead,
                "oldest_age": s.oldest_age,
            }
        )
    return out


def known_queues(backend: Any, declared: list[str]) -> list[str]:
    """The app's queues plus those seen in the most recent jobs."""
    seen = set(declared)
    lister = getattr(backend, "jobs", None)
    recent = lister(limit=200) if lister is not None else backend.dead_letters(limit=200)
    seen.update(s.queue for s in recent)
    return sorted(seen) or ["default"]


def _missing(job_id: str) -> ActionRefused:
    return ActionRefused(f"no job {job_id!r} in this queue store. Fix: check the id (it may have expired)")


def retry(backend: Any, job_id: str) -> dict[str, Any]:
    if backend.requeue(job_id):
        return {"ok": True, "message": f"job {job_id} is back in its queue with fresh counters"}
    state = backend.get(job_id)
    if state is None:
        raise _missing(job_id)
    raise ActionRefused(f"job {job_id} is {state.status.value}: only dead or failed jobs can be retried")


def cancel(backend: Any, job_id: str) -> dict[str, Any]:
    from foundry.backends.queue import CancelResult

    done = backend.cancel(job_id)
    if done is CancelResult.UNKNOWN:
        raise _missing(job_id)
    if done is CancelResult.CANCELLED:
        return {"ok": True, "message": f"job {job_id} cancelled: it will not run"}
    if done is CancelResult.REQUESTED:
        return {"ok": True, "message": f"job {job_id} is running: cancel requested; {STOPS}"}
    state = backend.get(job_id)
    now = "gone" if state is None else state.status.value
    raise ActionRefused(f"job {job_id} had already finished ({now}): nothing to cancel")


def purge(backend: Any, queue: str, what: str) -> dict[str, Any]:
    """``what="queued"``: cancel every job waiting in ``queue`` (in passes of ``SCAN``);
    ``what="expired"``: delete finished records past their result TTL (every queue)."""
    if what == "expired":
        n = int(backend.purge())
        return {"ok": True, "message": f"deleted {n} finished job record(s) past their result TTL"}
    if what != "queued":
        raise ActionRefused(f"purge what={what!r}? Fix: 'queued' or 'expired'")
    lister = getattr(backend, "jobs", None)
    if lister is None:
        raise ActionRefused(
            f"the {type(backend).__name__} engine cannot list jobs, so it cannot purge a queue"
        )
    cancelled = 0
    for _ in range(200):  # bounded: 100k jobs per click
        batch = lister(queue=queue, status="queued", limit=SCAN)
        done = sum(1 for s in batch if backend.cancel(s.id, running=False).value == "cancelled")
        cancelled += done
        if len(batch) < SCAN or done == 0:
            break
    return {"ok": True, "message": f"cancelled {cancelled} queued job(s) of queue {queue!r}"}
