"""Reading the workflow journal back, treating the store as hostile input.

Every row an engine reads (a workflow's state, a claim, a journal entry, a signal) is
decoded here through :class:`~foundry.backends._records.Fields`, the readers the queue
engines use too: each field is a value of the right type and range or the row is a
:class:`~foundry.errors.MalformedRecordError` naming the record, the field and the value
— never ``ValueError`` or ``TypeError`` from inside a worker thread, whatever someone
with the database's credentials wrote there (text in a number column of SQLite, a status
Foundry never writes, a counter at the limit of PostgreSQL's integers, text that is not
UTF-8).

What then happens to the workflow (``set_aside_error``): a row the engine cannot decode
when it *claims* the workflow, or that its run meets in the journal (its state, an
entry, a signal of its inbox), ends the workflow ``failed`` with an error record whose
message is ``the stored record is malformed, so the run was set aside: <record>:
<field>=<value> <problem>`` — the journal's dead letter. Its submitter's ``result()``
raises that :class:`MalformedRecordError`; ``foundry workflows list/show`` show it
(such a row is read leniently, :class:`~foundry.backends._records.Salvage`, once it is
set aside). A malformed row in a listing is left out with a warning. No other
workflow is touched: the engines never stop claiming for one row.

A workflow whose worker died while it ran alone in it ``MAX_CRASHES`` times is set aside
the same way by the claim that finds it so (``crash_error``; see
``foundry.backends.journal.base``, "A suspect runs alone").

The counters a claim or a wake-up increments stop short of the limits the engines
refuse to pass (``TOKEN_MAX``, ``CLAIMS_MAX``, ``WAKEUPS_MAX``), so a counter someone
set to PostgreSQL's maximum does not make every claim fail with an overflow: it stays,
the decoder refuses it, and only that workflow is set aside.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from foundry.backends._records import CODECS, LONG_TEXT, Fields, Salvage, is_utf8
from foundry.backends.journal.base import (
    Claim,
    Entry,
    EntryKind,
    EntryStatus,
    NewWorkflow,
    SignalRecord,
    WorkflowState,
    WorkflowStatus,
)
from foundry.errors import FoundryError, MalformedRecordError, SubmitError
from foundry.payload import dumps
from foundry.serialize import encode_error
from foundry.tracecontext import parse_trace

__all__ = [
    "CLAIMS_MAX",
    "CLAIM_FIELDS",
    "ENTRY_FIELDS",
    "ID_LIMIT",
    "MAX_CRASHES",
    "SIGNAL_FIELDS",
    "STATE_FIELDS",
    "TOKEN_MAX",
    "WAKEUPS_MAX",
    "check_new_workflow",
    "crash_error",
    "decode_claim",
    "decode_entry",
    "decode_signal",
    "decode_state",
    "set_aside_error",
    "set_aside_reason",
]

# The columns each decoder reads, in the order the engines select them.
STATE_FIELDS = (
    "id", "name", "status", "codec", "args", "result", "error", "parent_id", "parent_pos", "owner",
    "token", "lease_until", "wake_at", "cancel_requested", "compensation", "claims", "position",
    "current_step", "step_started_at", "wakeups", "created_at", "updated_at", "finished_at",
    "deadline", "published", "origin",
)  # fmt: skip
CLAIM_FIELDS = (
    "id", "name", "token", "lease_until", "status", "args", "codec", "parent_id", "parent_pos",
    "cancel_requested", "wakeups", "claims", "alone", "crashes", "deadline", "trace",
)  # fmt: skip
ENTRY_FIELDS = (
    "pos", "kind", "name", "status", "result", "error", "attempts", "started_at", "finished_at",
    "wake_at", "ref", "detail",
)  # fmt: skip
SIGNAL_FIELDS = ("seq", "workflow_id", "name", "payload", "sent_at", "consumed_pos")

ID_LIMIT = 1024  # a workflow id or name (a child's id is its parent's plus "/<position>")
# A claim adds one to ``token`` and ``claims``, a wake-up to ``wakeups``, only below these
# (the engines' SQL says so); a decoded value is always below them.
TOKEN_MAX = 2**62
CLAIMS_MAX = 2**30
WAKEUPS_MAX = 2**62
COMPENSATIONS = ("", "running", "done", "partial")
# A workflow whose worker died (or hung past its lease) this many times while it ran alone
# in it is set aside (failed) by the next claim: it is what kills its workers.
MAX_CRASHES = 3
SUSPECT = -1  # the ``alone`` column of a claim whose previous one ended without an outcome
_SHOWN = 200  # the longest repr of a bad value kept in a set-aside run's error record


def set_aside_reason(exc: MalformedRecordError) -> str:
    """What a workflow set aside for ``exc`` says (its error record's message)."""
    return f"the stored record is malformed, so the run was set aside: {exc}"


def set_aside_error(exc: MalformedRecordError) -> bytes:
    """The error record (``foundry.serialize.encode_error`` JSON) of a workflow set aside
    because of ``exc``: rebuilt by its handle as that :class:`MalformedRecordError`,
    shown by ``foundry workflows show`` with :func:`set_aside_reason` as its message."""
    value, shown = exc.value, repr(exc.value)
    plain = (
        value is None or type(value) is int or (type(value) is str and value.isprintable() and is_utf8(value))
    )
    if not plain or len(shown) > _SHOWN:  # kept as its repr: JSON, short, printable
        value = shown if len(shown) <= _SHOWN else shown[: _SHOWN - 3] + "..."
    kept = MalformedRecordError(exc.record[:_SHOWN], exc.field[:64], value, exc.problem[:_SHOWN])
    record = encode_error(kept)
    record["message"] = set_aside_reason(kept)
    record["traceback"] = ""
    return dumps(record)


def crash_error(claim: Claim) -> bytes:
    """The error record of a workflow set aside because its worker died while it ran
    alone ``claim.crashes`` times (``MAX_CRASHES``)."""
    error = FoundryError(
        f"workflow {claim.name!r} ({claim.id}): its worker died (or hung past its lease) while this "
        f"workflow ran alone in it, {claim.crashes} times, so it was set aside (failed) rather than "
        "kill more workers; the workflows that shared those workers were not charged. Fix: find what "
        "in it crashes its process (a native crash, running out of memory, os._exit in a step; "
        f"`foundry workflows show {claim.id}` shows how far it got), then start it again"
    )
    record = encode_error(error)
    record["traceback"] = ""
    return dumps(record)


def check_new_workflow(wf: NewWorkflow) -> None:
    """Refuse a workflow the journal's decoder could not read back, naming the field and
    the fix (``start`` calls it first, so bad input never reaches the store)."""

    def bad(field: str, problem: str, fix: str) -> SubmitError:
        return SubmitError(
            f"workflow {wf.name!r} ({wf.id!r}): {field}={getattr(wf, field)!r} {problem}. Fix: {fix}"
        )

    for field in ("id", "name"):
        value = getattr(wf, field)
        if not isinstance(value, str) or not value or len(value) > ID_LIMIT or not value.isprintable():
            raise bad(
                field,
                f"is not a non-empty printable string of at most {ID_LIMIT} characters",
                f"give a shorter printable {field}",
            )
    if wf.codec not in CODECS:
        raise bad("codec", "is not a codec Foundry knows", "use 'json' (the default)")
    if not isinstance(wf.args, bytes | bytearray | memoryview):
        raise bad("args", "is not bytes", "encode the call as JSON bytes")
    if wf.parent_id is not None and (not isinstance(wf.parent_id, str) or not wf.parent_id):
        raise bad("parent_id", "is not a workflow id", "pass the parent's id, or None")
    pos = wf.parent_position
    if pos is not None and (isinstance(pos, bool) or not isinstance(pos, int) or not 0 <= pos < 2**31):
        raise bad("parent_position", "is not a position (0..2**31-1)", "pass the child entry's position")
    timeout = wf.timeout
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < 1e12
    ):
        raise bad("timeout", "is not a positive number of seconds", 'declare timeout= like "10m", or none')
    if wf.origin is not None and (not isinstance(wf.origin, str) or not wf.origin.isprintable()):
        raise bad("origin", "is not printable text", "describe the source run in plain text")
    if wf.trace is not None and parse_trace(wf.trace) != wf.trace:
        raise bad(
            "trace", "is not a W3C trace context", "give foundry.tracecontext.pack(traceparent), or None"
        )


def _row(row: Sequence[Any], fields: tuple[str, ...], what: str) -> None:
    if len(row) != len(fields):
        raise MalformedRecordError(
            repr(tuple(row[:1])), "row", len(row), f"does not have the {len(fields)} columns of {what}"
        )


def decode_state(row: Sequence[Any]) -> WorkflowState:
    """A :class:`WorkflowState` from a row of ``STATE_FIELDS``; :class:`MalformedRecordError`
    (and nothing else) when it is not a workflow's — unless the workflow was already set
    aside (failed, with its error record), which is read leniently so its reason shows."""
    _row(row, STATE_FIELDS, "a workflow")
    try:
        return _state(row, Fields(row[0]))
    except MalformedRecordError:
        if row[2] != "failed" or not row[6]:
            raise
        return _state(row, Salvage(row[0]))


def _state(row: Sequence[Any], f: Fields) -> WorkflowState:
    return WorkflowState(
        id=f.name("id", row[0], limit=ID_LIMIT),
        name=f.name("name", row[1], limit=ID_LIMIT),
        status=f.member("status", row[2], WorkflowStatus, "a workflow status"),
        codec=f.codec(row[3]),
        args=f.optional_blob("args", row[4]) or b"",
        result=f.optional_blob("result", row[5]),
        error=f.optional_blob("error", row[6]),
        parent_id=f.optional_name("parent_id", row[7], limit=ID_LIMIT),
        parent_position=f.optional_integer("parent_pos", row[8]),
        owner=f.optional_text("owner", row[9]),
        token=f.integer("token", row[10], high=TOKEN_MAX - 1),
        lease_until=f.number("lease_until", row[11]),
        wake_at=f.number("wake_at", row[12], infinite=True),
        cancel_requested=f.flag("cancel_requested", row[13]),
        compensation=f.choice("compensation", row[14], COMPENSATIONS),
        claims=f.integer("claims", row[15], high=CLAIMS_MAX - 1),
        position=f.integer("position", row[16]),
        current_step=f.optional_text("current_step", row[17], limit=LONG_TEXT),
        step_started_at=f.optional_number("step_started_at", row[18]),
        wakeups=f.integer("wakeups", row[19], high=WAKEUPS_MAX - 1),
        created_at=f.number("created_at", row[20]),
        updated_at=f.number("updated_at", row[21]),
        finished_at=f.optional_number("finished_at", row[22]),
        deadline=f.optional_number("deadline", row[23]),
        published=f.optional_blob("published", row[24]),
        origin=f.optional_text("origin", row[25], limit=LONG_TEXT),
    )


def decode_claim(row: Sequence[Any], *, fresh: bool = False) -> Claim:
    """A :class:`Claim` from a row of ``CLAIM_FIELDS`` (what a claim returns);
    :class:`MalformedRecordError` (and nothing else) when it is not a workflow's."""
    _row(row, CLAIM_FIELDS, "a claim")
    f = Fields(row[0])
    return Claim(
        id=f.name("id", row[0], limit=ID_LIMIT),
        name=f.name("name", row[1], limit=ID_LIMIT),
        token=f.integer("token", row[2], low=1, high=TOKEN_MAX - 1),
        lease_until=f.number("lease_until", row[3]),
        status=f.member("status", row[4], WorkflowStatus, "a workflow status"),
        args=f.optional_blob("args", row[5]) or b"",
        codec=f.codec(row[6]),
        parent_id=f.optional_name("parent_id", row[7], limit=ID_LIMIT),
        parent_position=f.optional_integer("parent_pos", row[8]),
        cancel_requested=f.flag("cancel_requested", row[9]),
        wakeups=f.integer("wakeups", row[10], high=WAKEUPS_MAX - 1),
        claims=f.integer("claims", row[11], low=1, high=CLAIMS_MAX - 1),
        fresh=fresh,
        suspect=f.integer("alone", row[12], low=SUSPECT, high=TOKEN_MAX - 1) == SUSPECT,
        crashes=f.integer("crashes", row[13], high=CLAIMS_MAX),
        deadline=f.optional_number("deadline", row[14]),
        trace=parse_trace(row[15]),  # advisory: one that does not parse is ignored
    )


def decode_entry(workflow_id: str, row: Sequence[Any]) -> Entry:
    """An :class:`Entry` of workflow ``workflow_id`` from a row of ``ENTRY_FIELDS``;
    :class:`MalformedRecordError` (and nothing else) when it is not an entry Foundry wrote."""
    _row(row, ENTRY_FIELDS, "a journal entry")
    f = Fields(f"{workflow_id} entry {row[0]!r}")
    return Entry(
        position=f.integer("pos", row[0]),
        kind=f.member("kind", row[1], EntryKind, "an entry kind"),
        name=f.text("name", row[2], limit=LONG_TEXT),
        status=f.member("status", row[3], EntryStatus, "an entry status"),
        result=f.optional_blob("result", row[4]),
        error=f.optional_blob("error", row[5]),
        attempts=f.integer("attempts", row[6]),
        started_at=f.number("started_at", row[7]),
        finished_at=f.optional_number("finished_at", row[8]),
        wake_at=f.optional_number("wake_at", row[9], infinite=True),
        ref=f.optional_integer("ref", row[10]),
        detail=f.optional_text("detail", row[11], limit=LONG_TEXT),
    )


def decode_signal(row: Sequence[Any]) -> SignalRecord:
    """A :class:`SignalRecord` from a row of ``SIGNAL_FIELDS``; :class:`MalformedRecordError`
    (and nothing else) when it is not a signal Foundry wrote."""
    _row(row, SIGNAL_FIELDS, "a signal")
    f = Fields(f"signal #{row[0]!r}")
    return SignalRecord(
        seq=f.integer("seq", row[0], low=1, high=2**63 - 1),
        workflow_id=f.name("workflow_id", row[1], limit=ID_LIMIT),
        name=f.text("name", row[2], limit=LONG_TEXT),
        payload=f.blob("payload", row[3]),
        sent_at=f.number("sent_at", row[4]),
        consumed_position=f.optional_integer("consumed_pos", row[5]),
    )
