"""The idempotency-store contract: the cut between a stream handler run once per event id
and the engine that remembers which ids ran.

A record lives under a *scope* (``<stream>/<group>``: groups never share records) and a
*key* (the event id). The runtime runs an idempotent handler as **claim, run, record**:

1. ``claim(scope, key, owner, lease)`` is atomic between every consumer on every host
   using the same store. With no record (or an expired one) it writes a *running* record
   owned by ``owner`` until ``now + lease`` and answers ``claimed``. With a *done* record
   it answers ``done`` (the handler is skipped, the event committed). With another
   owner's running record whose lease has not passed it answers ``busy`` (the runtime
   retries the event later, like a failure). A running record whose lease passed is
   taken over: ``claimed`` with ``took_over=True`` — its first owner may have had its
   effect and died before recording it.
2. The handler runs.
3. ``complete(scope, key, owner)`` turns the owner's running record into a *done* one
   (``False`` when the claim was lost: its lease passed and another owner took it over —
   the effect may then have happened twice). ``release(scope, key, owner)`` drops the
   owner's running record after a handler raised, so a retry can claim it at once.

So the guarantee is **at-least-once delivery, effect at most once per successful run
recorded**: two consumers holding the same event at the same time never both run it;
a consumer that crashes *after* its effect and *before* ``complete`` leaves a running
record that expires after ``lease`` seconds, and the redelivery runs the handler again.
Only an effect written in the same transaction as the record (the SQLite
``Idempotency.once`` helper) is exactly-once.

**Retention.** A done record is kept ``max_age`` seconds (default 7 days), then
forgotten: a replay or a duplicate older than that runs again. The SQL engines also
bound the count per scope (``max_records``, oldest done records first), checked every
``PURGE_EVERY`` claims; Redis and NATS expire records by time alone (a key TTL, the KV
bucket's ``ttl``), so their size is the rate of events times ``max_age``.

**Hostile records.** Anything else may write into the store (another tool, an older
version, a hand edit). A record that does not decode as one of Foundry's (a wrong type, a
missing field, a value that is not JSON, a record for another key) makes ``claim`` and
``lookup`` raise :class:`HostileRecordError` naming the record and why: the runtime
treats it as a failed attempt (retried, then dead-lettered with that reason) and never
overwrites or trusts it. No engine call raises anything else for a record's *content*.

Every method may raise :class:`~foundry.errors.BackendUnavailableError` when the engine
cannot be reached and :class:`~foundry.errors.BackendError` for other engine failures.
Times are unix seconds; leases assume the hosts' clocks agree to well within a lease.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from foundry.errors import BackendError, SubmitError

__all__ = [
    "DEFAULT_MAX_AGE",
    "DEFAULT_MAX_RECORDS",
    "PURGE_EVERY",
    "Claim",
    "HostileRecordError",
    "IdempotencyStore",
    "Record",
    "TransactionalStore",
    "check_claim_args",
    "check_limits",
    "check_scope_key",
    "claim_step",
    "decide",
    "dump_record",
    "finish_step",
    "live",
    "load_record",
    "record_from_fields",
]

DEFAULT_MAX_AGE = 7 * 24 * 3600.0  # seconds a done record is kept
DEFAULT_MAX_RECORDS = 1_000_000  # done records per scope (SQL engines)
PURGE_EVERY = 1000  # claims between two purges of expired records (SQL engines)
MAX_TEXT = 1000  # characters of a scope, a key or an owner

State = Literal["running", "done"]


class HostileRecordError(BackendError):
    """A stored idempotency record is not one Foundry wrote (another tool's, corrupted):
    refused, never trusted nor overwritten. The message names the record and why."""


@dataclass(frozen=True, slots=True)
class Record:
    """One stored record. ``until``: the lease end of a running record (0 for a done one);
    ``at``: when it was claimed (running) or completed (done)."""

    key: str
    state: State
    owner: str
    until: float
    at: float


@dataclass(frozen=True, slots=True)
class Claim:
    """The answer of :meth:`IdempotencyStore.claim`."""

    status: Literal["claimed", "done", "busy"]
    owner: str = ""  # the holder of a busy claim
    until: float = 0.0  # when a busy claim's lease ends
    took_over: bool = False  # claimed over an expired claim: its owner's effect may have happened


class IdempotencyStore(Protocol):
    """What the stream runtime needs of an idempotency engine (see the module docstring)."""

    url: str  # masked (no password): for messages
    max_age: float
    transactional: ClassVar[bool]  # True: Idempotency.once can write the effect in its transaction

    def claim(self, scope: str, key: str, owner: str, lease: float) -> Claim:
        """Atomically claim ``key`` for ``owner`` for ``lease`` seconds (see the contract)."""
        ...

    def complete(self, scope: str, key: str, owner: str) -> bool:
        """Mark ``owner``'s claim done; ``False`` when it no longer holds it."""
        ...

    def release(self, scope: str, key: str, owner: str) -> bool:
        """Drop ``owner``'s running claim (its handler failed); ``False`` when it held none."""
        ...

    def lookup(self, scope: str, key: str) -> Record | None:
        """The live record of ``key`` (expired ones are ``None``)."""
        ...

    def forget(self, scope: str) -> int:
        """Drop every record of ``scope`` (before a replay whose effects you want again)."""
        ...

    def close(self) -> None: ...


def _bad(what: str, value: Any, fix: str) -> SubmitError:
    return SubmitError(f"idempotency store: {what} {value!r} is not usable. Fix: {fix}")


def check_scope_key(scope: Any, key: Any) -> None:
    """Refuse an empty or non-string scope or key: an empty id would make every other
    id-less event look applied already."""
    if not isinstance(scope, str) or not scope or len(scope) > MAX_TEXT:
        raise _bad("scope", scope, "pass '<stream>/<group>' (a non-empty string)")
    if not isinstance(key, str) or not key or len(key) > MAX_TEXT:
        raise _bad(
            "event id",
            key,
            "pass the id of the StreamEvent your handler received (Foundry gives every event one, "
            "derived from its stream, partition and offset when its producer set none)",
        )


def check_claim_args(scope: Any, key: Any, owner: Any, lease: Any) -> None:
    check_scope_key(scope, key)
    if not isinstance(owner, str) or not owner or len(owner) > MAX_TEXT:
        raise _bad("owner", owner, "pass the consumer's name (a non-empty string)")
    if (
        isinstance(lease, bool)
        or not isinstance(lease, int | float)
        or not math.isfinite(lease)
        or lease <= 0
    ):
        raise _bad("lease", lease, "pass a positive number of seconds (the consumer's ack deadline)")


def check_limits(what: str, max_age: Any, max_records: Any) -> None:
    if isinstance(max_age, bool) or not isinstance(max_age, int | float) or not math.isfinite(max_age):
        raise _bad(f"{what} max_age", max_age, "give a positive number of seconds (default 7 days)")
    if max_age <= 0:
        raise _bad(f"{what} max_age", max_age, "give a positive number of seconds (default 7 days)")
    if isinstance(max_records, bool) or not isinstance(max_records, int) or max_records < 1:
        raise _bad(f"{what} max_records", max_records, "give a positive integer")


def decide(record: Record | None, owner: str, now: float, max_age: float) -> Claim | None:
    """What ``claim`` answers given the stored ``record``; ``None``: write a running record
    for ``owner`` (the engine then does so atomically, compare-and-set on what it read)."""
    if record is None:
        return None
    if record.state == "done":
        if record.at + max_age <= now:  # expired, not purged yet
            return None
        return Claim("done")
    if record.owner == owner or record.until <= now:
        return None
    return Claim("busy", record.owner, record.until)


def claim_step(
    record: Record | None, key: str, owner: str, lease: float, now: float, max_age: float
) -> tuple[Claim, Record | None]:
    """A claim over the stored ``record``: the answer, and the running record the engine
    must write (compare-and-set on what it read) for it to hold — ``None``: write nothing."""
    found = decide(record, owner, now, max_age)
    if found is not None:
        return found, None
    took_over = record is not None and record.state == "running" and record.owner != owner
    return Claim("claimed", took_over=took_over), Record(key, "running", owner, now + lease, now)


def finish_step(
    record: Record | None, key: str, owner: str, done: bool, now: float
) -> tuple[bool, Record | None]:
    """``complete`` (``done``) or ``release`` over the stored ``record``: whether ``owner``
    holds the claim, and what replaces it — the done record, or ``None`` (delete it)."""
    if record is None or record.state != "running" or record.owner != owner:
        return False, None
    return True, Record(key, "done", "", 0.0, now) if done else None


def live(record: Record | None, now: float, max_age: float) -> Record | None:
    """``record`` unless it expired (a done record past ``max_age``, a lapsed claim)."""
    if record is None or decide(record, "\0", now, max_age) is None:  # no owner is "\0"
        return None
    return record


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def record_from_fields(
    where: str, key: str, stored_key: Any, state: Any, owner: Any, until: Any, at: Any
) -> Record:
    """A :class:`Record` from stored fields, or :class:`HostileRecordError` saying which
    field is wrong. ``where`` names the record for the message (engine, scope, key)."""
    problem = None
    if stored_key != key:
        problem = f"it is for key {stored_key!r}, not {key!r}"
    elif state not in ("running", "done"):
        problem = f"state {state!r} is not 'running' or 'done'"
    elif not isinstance(owner, str):
        problem = f"owner {owner!r} is not a string"
    elif _number(until) is None:
        problem = f"until {until!r} is not a finite number"
    elif _number(at) is None:
        problem = f"at {at!r} is not a finite number"
    elif state == "running" and not owner:
        problem = "a running record without an owner"
    if problem is not None:
        raise HostileRecordError(
            f"idempotency record {where} was not written by Foundry: {problem}. It is neither trusted "
            "nor overwritten; the event is retried, then dead-lettered. Fix: delete the record (or the "
            "tool writing into Foundry's keys), then replay the dead letter"
        )
    return Record(key, state, owner, float(until), float(at))


def dump_record(record: Record) -> bytes:
    """The JSON of a record, for the key/value engines (Redis, NATS)."""
    return json.dumps(
        {
            "v": 1,
            "key": record.key,
            "state": record.state,
            "owner": record.owner,
            "until": record.until,
            "at": record.at,
        },
        separators=(",", ":"),
    ).encode()


def load_record(where: str, key: str, raw: Any) -> Record:
    """Decode :func:`dump_record`'s bytes, or :class:`HostileRecordError` saying why not."""
    try:
        data = json.loads(raw)
    except (TypeError, ValueError, UnicodeDecodeError) as exc:
        raise HostileRecordError(
            f"idempotency record {where} was not written by Foundry: not JSON ({exc}). It is neither "
            "trusted nor overwritten. Fix: delete the record (or the tool writing into Foundry's keys)"
        ) from exc
    if not isinstance(data, dict) or data.get("v") != 1:
        raise HostileRecordError(
            f"idempotency record {where} was not written by Foundry: {str(data)[:100]!r} is not a "
            "version-1 record object. It is neither trusted nor overwritten. Fix: delete the record"
        )
    return record_from_fields(
        where, key, data.get("key"), data.get("state"), data.get("owner"), data.get("until"), data.get("at")
    )


class TransactionalStore(IdempotencyStore, Protocol):
    """An engine whose record can share a transaction with the caller's writes (SQLite):
    the effect and the record commit together or not at all."""

    def transaction(self) -> contextlib.AbstractContextManager[Any]:
        """A plain write transaction on the store's database (its connection)."""
        ...

    def once_in_transaction(self, scope: str, key: str) -> contextlib.AbstractContextManager[Any]:
        """Record ``key`` as done and yield the transaction's connection, or ``None`` when a
        live record was there already."""
        ...
