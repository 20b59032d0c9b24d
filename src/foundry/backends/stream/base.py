"""The stream backend contract: the cut between Foundry's event streams and an engine.

Every engine (the embedded SQLite log, NATS JetStream, Redis Streams) implements
:class:`StreamBackend` and passes the one conformance suite (``tests/streams``). A
stream is ``partitions`` append-only logs; an event lives in exactly one partition,
chosen by :func:`partition_for` from its key, and gets an **offset**: 1, 2, 3 … dense
and strictly increasing within its partition. A *consumer group* has, per partition, a
**committed** offset (everything at or below it is done for that group) and a set of
**pending** deliveries above it. The contract, which the suite checks:

* **Append is idempotent on the event id within the dedup window.** Appending an event
  whose id was appended to the same stream less than ``dedup_window`` seconds ago
  stores nothing and returns ``duplicate=True`` (with the original's partition and,
  where the engine reports it, offset). A batch is appended in order; engines that can
  commit a batch at once do (one SQLite transaction, one Lua call, pipelined
  ``publish_async``). An append that returned has been stored durably by the engine.
* **Groups are explicit.** ``create_group`` starts a group at the beginning, the end,
  an offset or a time; reading, committing, seeking or asking the lag of a group that
  does not exist raises :class:`~foundry.errors.NotFoundError` naming the group and the
  groups that do exist. Groups are independent: each sees every event.
* **Read is in order and never skips an unacknowledged event.** ``read`` hands out the
  entries of one partition for one group in offset order: first the pending entries
  whose ack deadline has passed (redeliveries, ``deliveries`` incremented, oldest
  first, stopping at the first pending entry that has not expired), and only when
  nothing of that partition is pending any more, new entries after the group's
  position. While an earlier entry of the partition is pending and not expired, read
  returns nothing for it. This is what keeps per-key order under redelivery. Engines
  whose read is not atomic across readers (``capabilities.atomic_read = False``:
  NATS) rely on the runtime holding the partition's lease (``acquire``) while it
  reads; SQLite and Redis enforce the rule even between competing readers.
* **Commit is cumulative.** ``commit(partition, offset)`` acknowledges every delivered
  entry of the partition up to and including ``offset`` (Kafka's commit, JetStream's
  AckAll). It is idempotent; committing below the committed offset does nothing.
* **The ack deadline is a group setting.** Every read of a group passes the same
  ``ack_deadline`` (the runtime does); engines may apply the latest value to entries
  already delivered (Redis measures idle time against it, JetStream's ``ack_wait`` is a
  consumer setting).
* **Deadlines are extended, not guessed.** ``extend`` pushes back the deadline of the
  entries a live consumer still holds (``in_progress`` in JetStream, ``XCLAIM``
  resetting idle time in Redis); a consumer that dies stops extending and its entries
  are redelivered once their deadline passes.
* **Every stored entry comes out, decoded or marked.** An entry that is not an event
  Foundry could have written (a foreign producer's, a corrupted row) is still handed
  out in its place, as an :class:`Event` whose ``malformed`` says why (its offset and
  whatever of its id, key and bytes could be read): the runtime dead-letters it with that
  reason and the partition goes on. A read never raises for the *content* of an entry.
  Each engine decodes a stored entry with one function that returns an :class:`Event` or
  raises :class:`MalformedEntryError`, nothing else (fuzzed in ``tests/adversarial``).
* **Every event has an id.** An entry stored without one (a foreign producer that set no
  ``Nats-Msg-Id``, an empty id field) gets :func:`derived_id`: stream, partition and
  offset, stable across redeliveries and replays and unique within the stream.
* **The trace context travels with the event.** ``NewEvent.trace`` (a W3C trace context,
  ``foundry.tracecontext``) is stored with the event and handed out on every delivery
  and replay of it; an entry without one (an older Foundry's, a foreign producer's) or
  with a value that is not a trace context has ``trace=None``: never ``malformed``.
* **Dead letters are records.** ``dead_letter`` stores the event with the reason and
  the delivery count, then commits past it, in that order: a crash in between leaves
  the event pending (redelivered), never dropped without its record.
* **Seek is replay.** ``seek`` moves a group to an offset or a time (pending entries
  are dropped, the next read starts there). Asking for an offset or a time older than
  what retention kept raises :class:`~foundry.errors.NotFoundError` naming the retained
  range and the fix; nothing changes.
* **Retention is by age and size.** ``max_age`` (seconds), ``max_events`` and
  ``max_bytes`` (per partition) bound the log; the oldest events go first. A group
  that falls behind retention has the lost range recorded as one dead letter
  (``reason`` says which offsets and why) and continues from the first retained event.
* **Lag is measured, per partition.** ``lag`` reports for each partition the last
  offset, the committed offset, the first retained offset and the pending count.
* **Leases and membership are small records with expiry.** ``acquire`` takes or renews
  the lease of one (group, partition) for one consumer; ``join`` renews a consumer's
  membership and returns the live members, from which the runtime assigns partitions.

Every method may raise :class:`~foundry.errors.BackendUnavailableError` when the engine
cannot be reached (callers retry with back-off: the log, not the consumer, is the source
of truth) and :class:`~foundry.errors.BackendError` for other engine failures. Every
blocking call takes a ``timeout`` in seconds. Times are unix seconds; leases and
deadlines assume the hosts' clocks agree to well within a deadline.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

from foundry.errors import BackendError, ConfigError, NotFoundError

__all__ = [
    "Appended",
    "Capabilities",
    "DeadLetter",
    "Event",
    "MalformedEntryError",
    "NewEvent",
    "PartitionLag",
    "Start",
    "StreamBackend",
    "StreamConfig",
    "StreamInfo",
    "check_name",
    "check_partition",
    "derived_id",
    "gap_reason",
    "malformed_event",
    "partition_for",
    "partitions_changed",
    "resolve_start",
    "unknown_group",
]

StartKind = Literal["beginning", "end", "offset", "time"]


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """How a stream is laid out and how long it keeps events."""

    name: str
    partitions: int = 1
    max_age: float | None = None  # seconds an event is kept; None = forever
    max_events: int | None = None  # per partition
    max_bytes: int | None = None  # payload bytes per partition
    dedup_window: float = 120.0  # seconds an event id is remembered for publish dedup

    def __post_init__(self) -> None:
        check_name("stream", self.name)
        if isinstance(self.partitions, bool) or not isinstance(self.partitions, int) or self.partitions < 1:
            raise ConfigError(
                f"stream {self.name!r}: partitions={self.partitions!r} is not a positive integer. "
                "Fix: give partitions=N with N ≥ 1"
            )
        for name in ("max_age", "max_events", "max_bytes"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(float(value)) or value <= 0):
                raise ConfigError(
                    f"stream {self.name!r}: {name}={value!r} must be positive. "
                    f"Fix: give a positive {name}, or None to keep events forever"
                )
        if not math.isfinite(self.dedup_window) or self.dedup_window < 0:
            raise ConfigError(
                f"stream {self.name!r}: dedup_window={self.dedup_window!r} must be ≥ 0 seconds. "
                'Fix: give dedup_window="2m" (the default), or 0 to turn publish dedup off'
            )


# The three records below are made once per event on the hot paths (publish, read): not
# frozen=True, whose __init__ sets each field through object.__setattr__ (4x the time of
# a plain slots class). Treat them as immutable all the same (dataclasses.replace for a
# changed copy); unsafe_hash keeps them hashable by value, as the frozen ones were.
@dataclass(slots=True, unsafe_hash=True)
class NewEvent:
    """An event to append. ``payload`` is already encoded (JSON by default)."""

    id: str
    payload: bytes
    key: str | None = None
    trace: str | None = None  # the W3C trace context it was published in (foundry.tracecontext.pack)


@dataclass(slots=True, unsafe_hash=True)
class Appended:
    partition: int
    offset: int | None  # None only for a duplicate whose original offset the engine did not say
    duplicate: bool = False


@dataclass(slots=True, unsafe_hash=True)
class Event:
    """One delivery of one stored event to one group."""

    stream: str
    partition: int
    offset: int
    id: str
    key: str | None
    payload: bytes
    timestamp: float  # unix seconds when it was appended
    deliveries: int = 1  # including this one
    # Set when the stored entry is not a Foundry event (foreign or corrupted): why. The
    # runtime dead-letters it with this reason; id/key/payload are what could be read.
    malformed: str | None = None
    trace: str | None = None  # as published; None when absent or not a valid trace context


class MalformedEntryError(BackendError):
    """A stored entry is not an event Foundry could have written: a foreign producer's, or
    corrupted. Raised only by the engines' entry decoders; ``read`` turns it into an
    :class:`Event` with ``malformed`` set, which the runtime dead-letters."""


def derived_id(stream: str, partition: int, offset: int) -> str:
    """The id of an event stored without one: ``<stream>/<partition>@<offset>`` — the same
    on every redelivery and replay, unique within the stream."""
    return f"{stream}/{partition}@{offset}"


def malformed_event(
    stream: str,
    partition: int,
    offset: int,
    reason: str,
    *,
    deliveries: int = 1,
    id: str | None = None,
    key: str | None = None,
    payload: bytes = b"",
    timestamp: float = 0.0,
) -> Event:
    """The stand-in for an entry that is not a Foundry event, handed out at its offset so
    the group can dead-letter it (with ``reason``) and go on."""
    return Event(
        stream,
        partition,
        offset,
        id or derived_id(stream, partition, offset),
        key,
        payload,
        timestamp,
        deliveries,
        malformed=reason,
    )


@dataclass(frozen=True, slots=True)
class Start:
    """Where a new group starts, or where ``seek`` moves one.

    ``Start.beginning()`` (the first retained event), ``Start.end()`` (only events
    appended from now on), ``Start.at(offset)`` (the next event delivered is the
    first with offset ≥ ``offset``; an int for every partition or a mapping
    ``{partition: offset}``), ``Start.since(unix_time)`` (the first event appended at
    or after that time).
    """

    kind: StartKind
    offset: int | Mapping[int, int] | None = None
    time: float | None = None

    @classmethod
    def beginning(cls) -> Start:
        return cls("beginning")

    @classmethod
    def end(cls) -> Start:
        return cls("end")

    @classmethod
    def at(cls, offset: int | Mapping[int, int]) -> Start:
        values = offset.values() if isinstance(offset, Mapping) else [offset]
        for value in values:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"offset {value!r} is not an offset. Fix: offsets are integers ≥ 1 "
                    "(the first event of a partition is offset 1)"
                )
        return cls("offset", offset=offset)

    @classmethod
    def since(cls, when: float) -> Start:
        if isinstance(when, bool) or not isinstance(when, int | float) or not math.isfinite(when):
            raise ConfigError(f"time {when!r} is not a unix time. Fix: pass time.time()-style seconds")
        return cls("time", time=float(when))

    def offset_for(self, partition: int) -> int | None:
        if isinstance(self.offset, Mapping):
            value = self.offset.get(partition)
            return None if value is None else int(value)
        return self.offset

    def describe(self) -> str:
        if self.kind == "offset":
            return f"offset {self.offset}"
        if self.kind == "time":
            return f"time {self.time}"
        return self.kind


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An event a group gave up on, with the reason (or a range lost to retention)."""

    stream: str
    group: str
    partition: int
    offset: int
    id: str
    key: str | None
    payload: bytes | None  # None for a retention gap record
    reason: str
    deliveries: int
    dead_at: float
    error: str | None = None  # JSON of foundry.serialize.encode_error when a handler raised
    last_offset: int | None = None  # set for a gap record: offsets offset..last_offset were lost


@dataclass(frozen=True, slots=True)
class PartitionLag:
    partition: int
    committed: int  # everything ≤ committed is done for the group
    end: int  # last offset appended (0 when empty)
    first: int  # first retained offset (end + 1 when the partition is empty)
    pending: int  # delivered, not yet committed

    @property
    def lag(self) -> int:
        """Events appended after the committed position (pending included)."""
        return max(0, self.end - max(self.committed, self.first - 1))


@dataclass(frozen=True, slots=True)
class StreamInfo:
    config: StreamConfig
    first: tuple[int, ...]  # per partition
    last: tuple[int, ...]
    groups: tuple[str, ...]

    @property
    def events(self) -> int:
        return sum(max(0, last - first + 1) for first, last in zip(self.first, self.last, strict=True))


@dataclass(frozen=True, slots=True)
class Capabilities:
    atomic_read: bool = True  # read enforces order between competing readers by itself
    dense_offsets: bool = True
    extras: tuple[str, ...] = field(default=())
    # Events the runtime hands to one ``append``: one transaction / one script where the
    # engine commits a batch at once; an engine that pipelines within a call (JetStream's
    # publish_async) takes more, since each call ends by waiting for the last acks.
    append_batch: int = 1000


class StreamBackend(Protocol):
    """A stream engine. See the module docstring for the contract."""

    capabilities: ClassVar[Capabilities]

    @property
    def url(self) -> str:
        """The log's URL with its secrets masked (``foundry.config.safe_url``): what
        messages, logs and tools show; the password itself stays with the driver."""
        ...

    # -- streams ---------------------------------------------------------------

    def ensure_stream(self, config: StreamConfig) -> StreamConfig:
        """Create the stream, or open it. An existing stream keeps its partition count
        (a different one raises :class:`~foundry.errors.ConfigError`: repartitioning
        would break per-key order); retention and the dedup window are updated."""
        ...

    def streams(self) -> list[str]: ...

    def info(self, stream: str) -> StreamInfo:
        """First/last offsets per partition and the groups; unknown → NotFoundError."""
        ...

    def delete_stream(self, stream: str) -> bool:
        """Drop the stream, its events, groups and dead letters; ``False`` if absent."""
        ...

    # -- producing -------------------------------------------------------------

    def append(self, stream: str, events: Sequence[NewEvent]) -> list[Appended]:
        """Append in order (partition by key); dedup by id within the window."""
        ...

    async def aappend(self, stream: str, events: Sequence[NewEvent]) -> list[Appended]:
        """:meth:`append` awaited on the caller's event loop, with the same contract (in
        order, dedup by id, stored durably when it returns), for any loop in any thread.
        NATS publishes through a connection of the caller's loop (one per loop, made at
        its first call, a bounded number of loops); SQLite and Redis run ``append`` in a
        worker thread. A cancelled call may or may not have stored its events: retrying
        with the same ids is safe (dedup)."""
        ...

    # -- groups ----------------------------------------------------------------

    def create_group(self, stream: str, group: str, start: Start) -> bool:
        """Create ``group`` at ``start``; ``False`` (and nothing changes) if it exists."""
        ...

    def groups(self, stream: str) -> list[str]: ...

    def delete_group(self, stream: str, group: str) -> bool: ...

    def read(
        self,
        stream: str,
        group: str,
        partition: int,
        consumer: str,
        *,
        max: int,
        ack_deadline: float,
        timeout: float,
    ) -> list[Event]:
        """Up to ``max`` entries of ``partition`` in offset order (see the contract),
        waiting up to ``timeout`` s for some; each must be committed within
        ``ack_deadline`` s (or extended) or it is redelivered."""
        ...

    def commit(self, stream: str, group: str, partition: int, offset: int) -> None:
        """Acknowledge every delivered entry of ``partition`` up to ``offset``."""
        ...

    def extend(self, stream: str, group: str, partition: int, consumer: str, ack_deadline: float) -> None:
        """Push the deadline of ``consumer``'s pending entries of ``partition`` to now +
        ``ack_deadline``."""
        ...

    def dead_letter(
        self, stream: str, group: str, event: Event, reason: str, error: str | None = None
    ) -> None:
        """Record ``event`` as dead for ``group`` with ``reason``, then commit past it."""
        ...

    def dead_letters(self, stream: str, group: str | None = None, limit: int = 100) -> list[DeadLetter]: ...

    def seek(self, stream: str, group: str, start: Start, partitions: Sequence[int] | None = None) -> None:
        """Replay: move the group (all partitions, or ``partitions``) to ``start``."""
        ...

    def lag(self, stream: str, group: str) -> list[PartitionLag]: ...

    def enforce_retention(self, stream: str) -> int:
        """Drop events past ``max_age``/``max_events``/``max_bytes`` now; how many went
        (engines that trim on their own may report 0)."""
        ...

    # -- coordination ----------------------------------------------------------

    def join(self, stream: str, group: str, consumer: str, ttl: float) -> list[str]:
        """Renew ``consumer``'s membership for ``ttl`` s; the live members, sorted."""
        ...

    def leave(self, stream: str, group: str, consumer: str) -> None: ...

    def acquire(self, stream: str, group: str, partition: int, consumer: str, ttl: float) -> bool:
        """Take (if free or expired) or renew the lease on one partition of a group."""
        ...

    def release(self, stream: str, group: str, partition: int, consumer: str) -> None: ...

    def close(self) -> None: ...


_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def check_name(what: str, name: Any) -> str:
    """Stream and group names: letters, digits, ``_`` and ``-`` (they become NATS
    subjects and consumer names and Redis keys), 1–100 characters."""
    if not isinstance(name, str) or not name or len(name) > 100 or not set(name) <= _NAME_CHARS:
        raise ConfigError(
            f"{what} name {name!r} is not usable. Fix: use 1-100 letters, digits, '_' or '-' "
            f"(it becomes a NATS subject and a Redis key), e.g. 'signaling' or 'billing'"
        )
    return name


def partition_for(key: str | None, event_id: str, partitions: int) -> int:
    """The partition of an event: a stable hash of its key (of its id when it has no
    key, so a retried publish lands where the first one did). Same on every engine and
    every Python process (not ``hash()``, which is salted per process)."""
    if partitions == 1:
        return 0
    text = key if key is not None else event_id
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def unknown_group(stream: str, group: str, known: Sequence[str]) -> NotFoundError:
    names = ", ".join(sorted(known)) or "none"
    return NotFoundError(
        f"stream {stream!r} has no consumer group {group!r} (groups: {names}). Fix: create it "
        f"with create_group / a @stream.consumer(group={group!r}) declaration, or check the spelling"
    )


def unknown_stream(stream: str, known: Sequence[str]) -> NotFoundError:
    names = ", ".join(sorted(known)) or "none"
    return NotFoundError(
        f"no stream named {stream!r} (streams: {names}). Fix: declare it with "
        f"app.stream({stream!r}, ...) and publish to it, or check the spelling"
    )


def partitions_changed(config: StreamConfig, existing: int) -> ConfigError:
    return ConfigError(
        f"stream {config.name!r} exists with {existing} partitions, not {config.partitions}. "
        "Fix: keep partitions as they were (changing them would move keys between "
        "partitions and break per-key order), or use a new stream name"
    )


def out_of_range(stream: str, group: str, partition: int, asked: str, first: int, last: int) -> NotFoundError:
    return NotFoundError(
        f"stream {stream!r} group {group!r} partition {partition}: cannot replay from {asked}; "
        f"retention kept only offsets {first}..{last}. Fix: replay from offset {first} or later "
        "(or Start.beginning()), or raise the stream's retention (max_age / max_events / max_bytes)"
    )


def check_partition(config: StreamConfig, partition: int) -> None:
    if not 0 <= partition < config.partitions:
        raise NotFoundError(
            f"stream {config.name!r} has partitions 0..{config.partitions - 1}, not {partition}. "
            "Fix: pass a partition in that range"
        )


def gap_reason(config: StreamConfig, group: str, lo: int, hi: int) -> str:
    """The reason of the dead-letter record for offsets lost to retention."""
    limits = ", ".join(
        f"{name}={getattr(config, name)}"
        for name in ("max_age", "max_events", "max_bytes")
        if getattr(config, name) is not None
    )
    return (
        f"offsets {lo}..{hi} were removed by retention ({limits or 'trimmed'}) before group "
        f"{group!r} processed them"
    )


def resolve_start(
    config: StreamConfig,
    group: str,
    start: Start,
    partition: int,
    first: int,
    last: int,
    first_time: Callable[[], float],
    offset_at: Callable[[float], int],
    floor: int | None = None,
) -> int | None:
    """The next offset to deliver on ``partition`` for ``start`` (``None``: an offset
    mapping that does not name this partition). ``first_time()`` is the timestamp of the
    first retained event, ``offset_at(t)`` the first offset appended at or after ``t``.
    ``floor`` (default ``first``): the lowest offset that can be asked for without loss —
    lower than ``first`` when the offsets below ``first`` were never used rather than
    removed (Redis: a foreign entry's id at the head of the partition).
    Raises :class:`NotFoundError` when ``start`` lies before what retention kept."""
    floor = first if floor is None else floor
    if start.kind == "beginning":
        return first
    if start.kind == "end":
        return last + 1
    if start.kind == "offset":
        wanted = start.offset_for(partition)
        if wanted is None:
            return None
        if wanted < floor:
            raise out_of_range(config.name, group, partition, f"offset {wanted}", first, last)
        return min(max(wanted, first), last + 1)
    assert start.time is not None
    if floor > 1 and start.time <= first_time():
        raise out_of_range(config.name, group, partition, f"time {start.time:.3f}", first, last)
    return offset_at(start.time)
