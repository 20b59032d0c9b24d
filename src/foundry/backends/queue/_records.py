"""Reading a stored job record back, treating the store as hostile input.

Every engine turns what it stored (a SQL row, a Redis hash, a broker message) into a
:class:`~foundry.backends.queue.base.Claimed` or :class:`~foundry.backends.queue.base.JobState`
through :class:`~foundry.backends._records.Fields` (shared with the workflow journal),
which either returns a value of the right type and range or raises
:class:`~foundry.errors.MalformedRecordError` naming the record, the field and the
value — never ``ValueError``, ``TypeError`` or ``KeyError`` from deep inside a worker
thread. SQLite's columns take any type, Redis keeps strings, and anyone who can write
to the store can write anything; the engines' ``claim`` dead-letters such a record with
the error's text as the reason (``dead_reason_for``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from foundry.backends._records import INT32, LONG_TEXT, Fields, Salvage
from foundry.backends.queue.base import Claimed, JobProgress, JobState, JobStatus
from foundry.errors import MalformedRecordError
from foundry.tracecontext import parse_trace

__all__ = [
    "CLAIM_FIELDS",
    "STATE_FIELDS",
    "dead_reason_for",
    "decode_claimed",
    "decode_state",
]


def dead_reason_for(exc: MalformedRecordError) -> str:
    """The dead-letter reason of a record that could not be decoded."""
    return f"the stored record is malformed, so it was not run: {exc}"


# The fields of a leased job and of a job's state, by name (each engine maps its row,
# hash or script reply onto them).
CLAIM_FIELDS = (
    "id", "queue", "unit", "payload", "codec", "token", "lease_until", "deliveries", "attempts",
    "max_retries", "max_deliveries", "timeout", "enqueued_at",
)  # fmt: skip
STATE_FIELDS = (
    "id", "unit", "queue", "status", "deliveries", "attempts", "result", "error", "dead_reason", "codec",
    "enqueued_at", "finished_at", "eta", "priority", "key", "cancel_at", "progress", "payload",
)  # fmt: skip


def decode_claimed(v: Mapping[str, Any]) -> Claimed:
    """A :class:`Claimed` from the ``CLAIM_FIELDS`` of a leased job;
    :class:`MalformedRecordError` (and nothing else) when they are not a job's."""
    f = Fields(v.get("id"))
    return Claimed(
        id=f.name("id", v.get("id")),
        queue=f.name("queue", v.get("queue")),
        unit=f.name("unit", v.get("unit")),
        payload=f.blob("payload", v.get("payload")),
        codec=f.codec(v.get("codec")),
        token=f.name("token", v.get("token")),
        lease_until=f.number("lease_until", v.get("lease_until")),
        deliveries=f.integer("deliveries", v.get("deliveries"), low=1),
        attempts=f.integer("attempts", v.get("attempts")),
        max_retries=f.integer("max_retries", v.get("max_retries")),
        max_deliveries=f.integer("max_deliveries", v.get("max_deliveries"), low=1),
        timeout=f.optional_number("timeout", v.get("timeout"), positive=True),
        enqueued_at=f.number("enqueued_at", v.get("enqueued_at")),
        trace=parse_trace(v.get("trace")),  # advisory: one that does not parse is ignored
    )


def decode_state(v: Mapping[str, Any]) -> JobState:
    """A :class:`JobState` from the ``STATE_FIELDS`` of a job; :class:`MalformedRecordError`
    (and nothing else) when they are not a job's — unless it is already a dead letter,
    which is read leniently (:class:`Salvage`) so that its reason can be seen."""
    try:
        return _state(v, Fields(v.get("id")))
    except MalformedRecordError:
        if v.get("status") not in ("dead", b"dead") or not v.get("dead_reason"):
            raise
        return _state(v, Salvage(v.get("id")))


def _state(v: Mapping[str, Any], f: Fields) -> JobState:
    status = f.member("status", v.get("status"), JobStatus, "a job status")
    return JobState(
        id=f.name("id", v.get("id")),
        unit=f.name("unit", v.get("unit")),
        queue=f.name("queue", v.get("queue")),
        status=status,
        deliveries=f.integer("deliveries", v.get("deliveries")),
        attempts=f.integer("attempts", v.get("attempts")),
        result=f.optional_blob("result", v.get("result")) if status is JobStatus.SUCCEEDED else None,
        error=f.optional_blob("error", v.get("error")) or None,
        dead_reason=f.optional_text("dead_reason", v.get("dead_reason"), limit=LONG_TEXT),
        codec=f.codec(v.get("codec")),
        enqueued_at=f.number("enqueued_at", v.get("enqueued_at")),
        finished_at=f.optional_number("finished_at", v.get("finished_at")),
        eta=f.number("eta", v.get("eta")),
        priority=f.integer("priority", v.get("priority"), low=-INT32),
        key=f.optional_text("key", v.get("key"), limit=LONG_TEXT),
        payload=f.optional_blob("payload", v.get("payload")),
        cancel_requested_at=f.optional_number("cancel_at", v.get("cancel_at")),
        progress=decode_progress(v.get("progress")),
    )


_NOTE_LIMIT = 200  # characters of a progress note kept in the store


def encode_progress(progress: JobProgress) -> str:
    """The stored form of a progress record: a small JSON object."""
    return json.dumps(
        {
            "done": progress.done,
            "total": progress.total,
            "note": progress.note[:_NOTE_LIMIT],
            "at": progress.at,
        },
        separators=(",", ":"),
    )


def decode_progress(value: Any) -> JobProgress | None:
    """A progress record from its stored form, leniently: anything that is not one reads as
    ``None`` (progress is advisory; it never makes a job unreadable)."""
    if value is None or value in ("", b""):
        return None
    try:
        data = json.loads(value)
        done, total, note, at = data["done"], data.get("total"), data.get("note", ""), data.get("at", 0.0)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    numbers = (done, at) if total is None else (done, at, total)
    if not all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in numbers):
        return None
    if not isinstance(note, str):
        return None
    return JobProgress(
        done=float(done), total=None if total is None else float(total), note=note[:_NOTE_LIMIT], at=float(at)
    )
