"""The event-stream runtime: publishing, consumer groups, replay, lag, dead letters.

A :class:`StreamRuntime` serves one declared stream over a :class:`StreamBackend`
(``foundry.backends.stream``). Publishing appends JSON events; every *group* sees every
event; inside a group, *consumers* (threads here, or other processes on other hosts)
share the partitions.

How per-key order is kept, even under redelivery and with several consumers in a group:

1. **A key lives in one partition** (a stable hash of the key), appended in order.
2. **One consumer owns a partition at a time.** Consumers renew a membership record
   (``join``) and assign partitions by a range rule over the sorted live members; a
   consumer reads a partition only while it holds that partition's *lease*
   (``acquire``, renewed every third of ``session``). A consumer that dies stops
   renewing; after ``session`` seconds another consumer takes the lease over. Moving one
   partition pauses only that partition — no stop-the-world rebalance.
3. **One event in flight per partition.** The owner handles a batch strictly in offset
   order, one event after another, and commits the batch (cumulative) before reading
   the next one. A failing event is retried *in place* (with back-off) — the events
   after it in its partition wait — until it succeeds or is dead-lettered. The back-off
   pauses only that partition: the consumer serves its other partitions meanwhile and
   resumes the paused batch when its retry is due.
4. **Redeliveries come first, one at a time.** The backend never hands out a later
   event while an earlier one is pending (``read`` contract). After a crash, the new
   owner gets the uncommitted window back, oldest first, and takes it one event per
   read and one commit per event until it sees a fresh event again, so a poison event
   that kills its consumer is counted precisely and the events behind it are not.

At-least-once: an event is committed only after its handler returned. A crash between
the handler and the commit redelivers the events of the uncommitted window (at most one
batch) — make handlers idempotent: ``event.id`` is the producer's id, stable across
redeliveries and replays; :class:`Idempotency` records handled ids atomically with
your own writes.

An event delivered more than ``max_deliveries`` times without an acknowledgement (its
consumer crashed or overran the ack deadline each time), or whose handler raised on
``max_deliveries`` attempts, is written to the dead letters with the reason (and the
error) and the group moves on.
So is a stored entry that is not an event Foundry can read (a foreign producer's,
a corrupted row: ``Event.malformed`` says why), at once. A consumer whose threads die
(a bug, a handler calling ``sys.exit``) leaves the group, so its partitions go to the
other members, and says so in the log, the failures metric and ``Consumers.failures``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import json
import logging
import math
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from foundry.backends.stream import (
    DeadLetter,
    Event,
    NewEvent,
    PartitionLag,
    Start,
    StreamBackend,
    StreamConfig,
    open_stream_backend,
)
from foundry.config import DEFAULT_WATCHDOG, safe_url
from foundry.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigError,
    DeclarationError,
    NotFoundError,
    PayloadTooLargeError,
    SubmitError,
)
from foundry.execute.asyncio_loop import CallerLoop
from foundry.observe import names
from foundry.observe.metrics import Registry
from foundry.observe.stall import Target, UnitLike
from foundry.observe.tracing import OFF, Tracing, messaging_system
from foundry.retry import OUTAGE, Backoff
from foundry.serialize import Codec, encode_error, get_codec

__all__ = [
    "ConsumerOptions",
    "Consumers",
    "Idempotency",
    "Published",
    "StreamEvent",
    "StreamRuntime",
    "make_runner",
]

log = logging.getLogger("foundry.stream")

T = TypeVar("T")
Handler = Callable[["StreamEvent"], Any]

_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)  # json.dumps(**kw) builds one per call
MAX_PAYLOAD = 1024 * 1024  # bytes per event (NATS's default max_payload)
PUBLISH_CHUNK = 1000  # events per backend call


@dataclass(frozen=True, slots=True)
class Published:
    """Where a published event went. ``duplicate``: its id was already in the stream
    (within the dedup window) and nothing new was stored."""

    id: str
    partition: int
    offset: int | None
    duplicate: bool = False


class StreamEvent:
    """What a handler receives: the decoded event (``event.data``, or ``event["field"]``)
    and where it came from. ``id`` is the producer's event id — the same on every
    redelivery and replay, the key for idempotent handlers."""

    __slots__ = ("data", "deliveries", "group", "id", "key", "offset", "partition", "stream", "timestamp")

    def __init__(self, event: Event, group: str, data: Any) -> None:
        self.stream = event.stream
        self.group = group
        self.partition = event.partition
        self.offset = event.offset
        self.id = event.id
        self.key = event.key
        self.timestamp = event.timestamp
        self.deliveries = event.deliveries
        self.data = data

    def __getitem__(self, name: str) -> Any:
        return self.data[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.data.get(name, default) if isinstance(self.data, Mapping) else default

    def __repr__(self) -> str:
        return (
            f"<StreamEvent {self.stream}/{self.partition}@{self.offset} id={self.id} key={self.key} "
            f"group={self.group} deliveries={self.deliveries}>"
        )


@dataclass(frozen=True, slots=True)
class ConsumerOptions:
    """How one group consumes. Durations in seconds."""

    group: str
    start: Start = field(default_factory=Start.beginning)  # where a *new* group starts
    ack_deadline: float = 30.0  # an unacknowledged delivery is redelivered after this
    max_deliveries: int = 5  # deliveries/attempts before the dead letters
    batch: int = 100  # events read per partition at a time (the uncommitted window)
    max_in_flight: int = 1000  # bound on events held by one consumer (backpressure)
    retry_backoff: float = 0.1  # first retry delay of a failing event; doubles, ≤ 5 s
    timeout: float | None = None  # handler time limit (async handlers are cancelled)
    session: float = 10.0  # membership and partition lease time-to-live
    poll: float = 0.2  # longest wait for new events before looking at other partitions

    def __post_init__(self) -> None:
        for name in ("ack_deadline", "session", "poll", "retry_backoff"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise DeclarationError(
                    self.group, name, value, "is not a positive duration", f'give {name} like "30s"'
                )
        for name in ("max_deliveries", "batch", "max_in_flight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DeclarationError(
                    self.group, name, value, "is not a positive integer", f"give {name}=N with N ≥ 1"
                )

    @property
    def read_size(self) -> int:
        return min(self.batch, self.max_in_flight)


@dataclass
class _Group:
    options: ConsumerOptions
    handler: Handler
    is_async: bool
    name: str
    watch: tuple[UnitLike, ...] = ()


def _retry(stop: threading.Event, what: Callable[[], T], *, attempts: int | None = None) -> T:
    """Call ``what``, retrying while the backend is unavailable (bounded back-off), until
    ``stop`` is set (then the last error is raised)."""
    pauses = OUTAGE.pauses()
    tries = 0
    while True:
        try:
            return what()
        except BackendUnavailableError:
            tries += 1
            if stop.is_set() or (attempts is not None and tries >= attempts):
                raise
            stop.wait(next(pauses))


class StreamRuntime:
    """One declared stream: publish, consume, replay, observe."""

    def __init__(
        self,
        config: StreamConfig,
        url: str,
        *,
        metrics: Registry | None = None,
        key_field: str | None = None,
        codec: str = "json",
        backend: StreamBackend | None = None,
        watchdog: float | None = DEFAULT_WATCHDOG,
        tracing: Tracing = OFF,
    ) -> None:
        self.config = config
        self.tracing = tracing  # the app's OpenTelemetry switch: a span per publish and per handled event
        self._url = url  # to connect with; ``url`` is what is shown
        self.watchdog = watchdog  # threshold of the loop watchdog on async handlers' loops (None: off)
        self.name = config.name
        self.metrics = metrics or Registry()
        self.key_field = key_field
        self.codec: Codec = get_codec(codec)
        self._backend = backend
        self._own_backend = backend is None
        self._ready = False
        self._lock = threading.Lock()
        self.groups: dict[str, _Group] = {}
        self._running: list[Consumers] = []
        self._closed = False
        self._published = self.metrics.counter(
            names.STREAM_PUBLISHED, "events appended to a stream", ("stream",)
        ).labels(self.name)
        self._lag_cache: tuple[float, list[tuple[dict[str, str], float]]] = (0.0, [])
        self._unregister_lag = self.metrics.collect(
            names.STREAM_CONSUMER_LAG, "events after the group's committed offset", self._collect_lag
        )

    # -- the backend -----------------------------------------------------------

    @property
    def url(self) -> str:
        """The log's URL with its secrets masked (``safe_url``)."""
        return safe_url(self._url)

    def __repr__(self) -> str:
        return f"<StreamRuntime {self.name} on {self.url}>"

    @property
    def backend(self) -> StreamBackend:
        with self._lock:
            if self._closed:
                raise BackendError(f"stream {self.name!r} is closed. Fix: declare it again in a new app")
            if self._backend is None:
                self._backend = open_stream_backend(self._url)
            if not self._ready:
                self._backend.ensure_stream(self.config)
                self._ready = True
            return self._backend

    # -- publishing ------------------------------------------------------------

    def _encode(self, event: Any, id: str | None, key: Any, trace: str | None = None) -> NewEvent:
        if id is None:
            id = uuid.uuid4().hex
        elif not isinstance(id, str) or not id or len(id) > 200:
            raise SubmitError(
                f"stream {self.name!r}: event id {id!r} is not usable. Fix: give id= a non-empty string "
                "of at most 200 characters (the same id on a retry makes the publish idempotent)"
            )
        if key is None and self.key_field is not None:
            if not isinstance(event, Mapping) or self.key_field not in event:
                raise SubmitError(
                    f"stream {self.name!r}: the event has no field {self.key_field!r}, which orders it "
                    f"(key={self.key_field!r}). Fix: include {self.key_field!r} in the event, or pass key=..."
                )
            key = event[self.key_field]
        if key is not None:
            if isinstance(key, bool) or not isinstance(key, str | int):
                raise SubmitError(
                    f"stream {self.name!r}: key {key!r} is not a string or an integer. "
                    "Fix: key events by an id (a session id, an account number)"
                )
            key = str(key)
        try:
            payload = _JSON.encode(event).encode() if self.codec.name == "json" else b""
        except (TypeError, ValueError):
            payload = b""
        if not payload:  # pickle, or not JSON: the codec encodes or names the problem
            payload = self.codec.encode(event, unit=self.name, what="the event")
        if len(payload) > MAX_PAYLOAD:
            raise PayloadTooLargeError(
                f"stream {self.name!r}: the event encodes to {len(payload)} bytes, over the "
                f"{MAX_PAYLOAD}-byte limit. Fix: publish a reference (a path, a URL, an id) instead"
            )
        return NewEvent(id, payload, key, trace)

    def publish(self, event: Any, *, id: str | None = None, key: Any = None) -> Published:
        """Append one event; returns once the log stored it (or found its id)."""
        return self.publish_many(
            [event], ids=None if id is None else [id], keys=None if key is None else [key]
        )[0]

    def publish_many(
        self,
        events: Iterable[Any],
        *,
        ids: Sequence[str] | None = None,
        keys: Sequence[Any] | None = None,
    ) -> list[Published]:
        """Append events in order, in batches (one transaction / script / pipelined burst
        each). Every event is validated before any is sent: a bad one rejects the call
        and nothing of it is stored. Traced, the call is one *send* span, whose context
        every event of it carries."""
        tracer = self.tracing.tracer()
        if tracer is None:
            return self._publish_many(events, ids, keys, None)
        with tracer.send(f"send {self.name}", self._span_attributes("publish", "send")) as (span, trace):
            out = self._publish_many(events, ids, keys, trace)
            span.set_attribute("messaging.batch.message_count", len(out))
            return out

    def _span_attributes(self, operation: str, kind: str) -> dict[str, Any]:
        return {
            "messaging.system": messaging_system(self._url),
            "messaging.destination.name": self.name,
            "messaging.operation": operation,
            "messaging.operation.type": kind,
            "foundry.delivery": "stream",
        }

    def _publish_many(
        self,
        events: Iterable[Any],
        ids: Sequence[str] | None,
        keys: Sequence[Any] | None,
        trace: str | None,
    ) -> list[Published]:
        items = list(events)
        if ids is not None and len(ids) != len(items):
            raise SubmitError(
                f"stream {self.name!r}: {len(ids)} ids for {len(items)} events. Fix: one id each"
            )
        if keys is not None and len(keys) != len(items):
            raise SubmitError(
                f"stream {self.name!r}: {len(keys)} keys for {len(items)} events. Fix: one key each"
            )
        encoded = [
            self._encode(item, None if ids is None else ids[i], None if keys is None else keys[i], trace)
            for i, item in enumerate(items)
        ]
        backend = self.backend
        out: list[Published] = []
        never = threading.Event()
        for start in range(0, len(encoded), PUBLISH_CHUNK):
            chunk = encoded[start : start + PUBLISH_CHUNK]
            # A retry after "unavailable" re-sends the same ids: dedup makes it safe.
            appended = _retry(never, functools.partial(backend.append, self.name, chunk), attempts=8)
            out.extend(
                Published(e.id, a.partition, a.offset, a.duplicate)
                for e, a in zip(chunk, appended, strict=True)
            )
        self._published.inc(sum(1 for p in out if not p.duplicate))
        return out

    async def apublish(self, event: Any, *, id: str | None = None, key: Any = None) -> Published:
        """:meth:`publish` from async code, off the event loop."""
        return await asyncio.to_thread(self.publish, event, id=id, key=key)

    # -- consumers -------------------------------------------------------------

    def add_group(
        self, handler: Handler, options: ConsumerOptions, *, watch: Iterable[UnitLike] = ()
    ) -> None:
        """Consume with ``handler``; a loop stall is attributed to the handler, or to the
        units in ``watch`` whose code it runs."""
        if options.group in self.groups:
            raise DeclarationError(
                self.name,
                "group",
                options.group,
                "already has a handler on this stream",
                "give each group one handler (several consumers of a group share its partitions)",
            )
        if not callable(handler):
            raise DeclarationError(self.name, "consumer", handler, "is not callable", "decorate a function")
        self.groups[options.group] = _Group(
            options,
            handler,
            inspect.iscoroutinefunction(handler),
            getattr(handler, "__qualname__", repr(handler)),
            tuple(watch),
        )

    def _group(self, group: str) -> _Group:
        found = self.groups.get(group)
        if found is None:
            known = ", ".join(sorted(self.groups)) or "none"
            raise NotFoundError(
                f"stream {self.name!r} has no consumer for group {group!r} in this app (groups: {known}). "
                f"Fix: declare one with @{self.name}.consumer(group={group!r})"
            )
        return found

    def ensure_group(self, group: str) -> None:
        """Create the group at its declared start if the backend does not have it yet."""
        options = self._group(group).options
        self.backend.create_group(self.name, group, options.start)

    def run(self, groups: Iterable[str] | None = None, *, consumers: int = 1) -> Consumers:
        """Start ``consumers`` consumer threads for each group (all by default) and return
        them; ``stop()`` them (or use ``with``) when done."""
        chosen = list(self.groups) if groups is None else list(groups)
        if not chosen:
            raise NotFoundError(
                f"stream {self.name!r} has no consumer groups to run. Fix: declare one with "
                f"@{self.name}.consumer(group='...')"
            )
        if isinstance(consumers, bool) or not isinstance(consumers, int) or consumers < 1:
            raise ConfigError(f"consumers={consumers!r}. Fix: run at least one consumer per group")
        members: list[_Consumer] = []
        for group in chosen:
            spec = self._group(group)
            self.ensure_group(group)
            members.extend(_Consumer(self, spec) for _ in range(consumers))
        running = Consumers(self, members)
        with self._lock:
            self._running.append(running)
        running.start()
        return running

    def drain(
        self, groups: Iterable[str] | None = None, *, timeout: float = 30.0, consumers: int = 1
    ) -> None:
        """Run the groups until each has committed everything published so far, then stop.
        Raises :class:`~foundry.errors.ResultTimeoutError` if that takes over ``timeout``."""
        from foundry.errors import ResultTimeoutError

        chosen = list(self.groups) if groups is None else list(groups)
        with self.run(chosen, consumers=consumers) as running:
            until = time.monotonic() + timeout
            while True:
                behind = {g: sum(p.lag for p in self.lag(g)) for g in chosen}
                if not any(behind.values()):
                    return
                if running.failures and not running.alive:
                    name, error = running.failures[0]
                    raise BackendError(
                        f"stream {self.name!r}: every consumer died before the groups caught up "
                        f"({behind}); the first, {name}, on {type(error).__name__}: {error}. "
                        "Fix: see the logged traceback"
                    ) from error
                if time.monotonic() > until:
                    raise ResultTimeoutError(
                        f"stream {self.name!r}: groups still behind after {timeout}s: {behind}. "
                        "Fix: wait longer, or look at `foundry streams lag` and the dead letters"
                    )
                time.sleep(0.02)

    # -- replay and observation ------------------------------------------------

    def replay(
        self,
        group: str,
        *,
        offset: int | Mapping[int, int] | None = None,
        time: float | None = None,
        partitions: Sequence[int] | None = None,
    ) -> None:
        """Move ``group`` back (or forward) to an offset or a time: the next events its
        consumers see start there. Stop the group's consumers first, or they finish the
        batch they hold (and their commit of it is ignored)."""
        if (offset is None) == (time is None):
            raise SubmitError(
                f"stream {self.name!r}: replay needs exactly one of offset= or time=. "
                "Fix: replay(group, offset=1) for the beginning, or replay(group, time=unix_seconds)"
            )
        start = Start.at(offset) if offset is not None else Start.since(time)  # type: ignore[arg-type]
        self.backend.seek(self.name, group, start, partitions)

    def lag(self, group: str) -> list[PartitionLag]:
        return self.backend.lag(self.name, group)

    def dead_letters(self, group: str | None = None, limit: int = 100) -> list[DeadLetter]:
        return self.backend.dead_letters(self.name, group, limit)

    def _collect_lag(self) -> list[tuple[dict[str, str], float]]:
        stamp, cached = self._lag_cache
        if time.monotonic() - stamp < 1.0 or self._backend is None or self._closed:
            return cached
        samples: list[tuple[dict[str, str], float]] = []
        for group in self.groups:
            with contextlib.suppress(BackendError, NotFoundError):
                for part in self.backend.lag(self.name, group):
                    labels = {"stream": self.name, "group": group, "partition": str(part.partition)}
                    samples.append((labels, float(part.lag)))
        self._lag_cache = (time.monotonic(), samples)
        return samples

    def close(self, timeout: float = 10.0) -> None:
        with self._lock:
            running, self._running = self._running, []
        for consumers in running:
            consumers.stop(timeout)
        self._unregister_lag()
        with self._lock:
            self._closed = True
            backend, self._backend = self._backend, None
        if backend is not None and self._own_backend:
            backend.close()


class Consumers:
    """The consumer threads :meth:`StreamRuntime.run` started."""

    def __init__(self, runtime: StreamRuntime, members: list[_Consumer]) -> None:
        self.runtime = runtime
        self.members = members

    def start(self) -> None:
        for member in self.members:
            member.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Finish the event in hand, commit what is done, leave the group."""
        for member in self.members:
            member.stopping.set()
        until = time.monotonic() + timeout
        for member in self.members:
            member.join(max(0.0, until - time.monotonic()))

    @property
    def alive(self) -> bool:
        return any(m.is_alive() for m in self.members)

    @property
    def failures(self) -> list[tuple[str, BaseException]]:
        """``(consumer name, error)`` of each member that died (its partitions went to
        the other members); empty while all are healthy or stopped by ``stop()``."""
        return [(m.name, m.failure) for m in self.members if m.failure is not None]

    def __enter__(self) -> Consumers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_instance = 0
_instance_lock = threading.Lock()


def _consumer_name(group: str) -> str:
    global _instance
    with _instance_lock:
        _instance += 1
        n = _instance
    host = socket.gethostname().split(".")[0] or "host"
    return f"{host}-{os.getpid()}-{n}-{uuid.uuid4().hex[:6]}-{group}"


@dataclass
class _Held:
    """A batch of one partition paused on a failing event: it resumes at ``events[index]``
    (attempt ``attempt``) once ``due`` (monotonic) has passed, while the consumer serves
    its other partitions. The batch stays pending on the backend (the heartbeat extends
    its deadline), so a crash meanwhile redelivers it. ``letter``: the event's dead letter
    could not be written; resuming writes it before anything else."""

    events: list[Event]
    index: int
    attempt: int
    due: float
    letter: tuple[Event, str, BaseException | None] | None = None


class _Consumer:
    """One member of a group: a worker thread that handles its partitions in order and a
    heartbeat thread that keeps its membership, leases and ack deadlines alive.

    The two live and die together: if either thread ends other than by ``stop()`` (a bug,
    a handler calling ``sys.exit``, a backend refusing the group), the failure is logged,
    counted (``foundry_stream_consumer_failures_total``) and kept in ``failure``; the
    other thread stops and the consumer leaves the group and releases its leases, so
    another member takes its partitions over instead of them being renewed for a dead
    worker."""

    def __init__(self, runtime: StreamRuntime, spec: _Group) -> None:
        self.runtime = runtime
        self.spec = spec
        self.options = spec.options
        self.group = spec.options.group
        self.name = _consumer_name(self.group)
        self.stopping = threading.Event()
        self.failure: BaseException | None = None
        self.owned: set[int] = set()
        self.assigned: set[int] = set()
        self.busy: int | None = None
        self.busy_since = 0.0
        self._held: dict[int, _Held] = {}
        self._recovering: set[int] = set()
        self._durations: list[float] = []
        self._handled = 0
        self._lock = threading.Lock()
        self._loop: CallerLoop | None = None
        m = runtime.metrics
        labels = (runtime.name, self.group)
        self._consumed = m.counter(
            names.STREAM_CONSUMED, "events handled by a group", ("stream", "group")
        ).labels(*labels)
        self._redelivered = m.counter(
            names.STREAM_REDELIVERED, "events delivered again (crash, deadline, retry)", ("stream", "group")
        ).labels(*labels)
        self._dead = m.counter(
            names.STREAM_DEAD, "events moved to the dead letters", ("stream", "group")
        ).labels(*labels)
        self._in_flight = m.gauge(
            names.STREAM_IN_FLIGHT, "events read and not yet committed", ("stream", "group")
        ).labels(*labels)
        self._seconds = m.histogram(
            names.STREAM_HANDLER_SECONDS, "handler wall time per event", ("stream", "group")
        ).labels(*labels)
        self._failed = m.counter(
            names.STREAM_CONSUMER_FAILURES,
            "consumer threads that ended on an error (their partitions go to other members)",
            ("stream", "group"),
        ).labels(*labels)
        self._worker = threading.Thread(target=self._work, name=f"foundry-stream-{self.name}", daemon=True)
        self._beat = threading.Thread(target=self._heartbeat, name=f"foundry-beat-{self.name}", daemon=True)

    def start(self) -> None:
        self._coordinate()
        self._worker.start()
        self._beat.start()

    def join(self, timeout: float) -> None:
        self._worker.join(timeout)
        self._beat.join(max(0.1, timeout))

    def is_alive(self) -> bool:
        return self._worker.is_alive()

    def _fail(self, exc: BaseException, thread: str) -> None:
        """The ``thread`` ended on ``exc``: report it and stop the whole consumer."""
        with self._lock:
            first = self.failure is None
            if first:
                self.failure = exc
        if first:
            log.error(
                "stream %s group %s: consumer %s died (%s thread: %s: %s); it leaves the group and "
                "its partitions go to the other members. Fix: see the traceback below",
                self.runtime.name,
                self.group,
                self.name,
                thread,
                type(exc).__name__,
                exc,
                exc_info=exc,
            )
            self._failed.inc()
        self.stopping.set()

    # -- coordination ----------------------------------------------------------

    @property
    def _backend(self) -> StreamBackend:
        return self.runtime.backend

    def _coordinate(self) -> None:
        """Renew membership, recompute the assignment, take and renew leases."""
        backend, stream, session = self._backend, self.runtime.name, self.options.session
        try:
            members = backend.join(stream, self.group, self.name, session)
            partitions = self.runtime.config.partitions
            me = members.index(self.name) if self.name in members else 0
            assigned = {p for p in range(partitions) if p % max(1, len(members)) == me}
            with self._lock:
                holding = set(self._held)  # a paused batch keeps its partition until it is done
            owned = set()
            for p in sorted(self.owned | assigned):
                if p in assigned or p == self.busy or p in holding:
                    if backend.acquire(stream, self.group, p, self.name, session):
                        owned.add(p)
                else:
                    backend.release(stream, self.group, p, self.name)
            with self._lock:
                # A partition just taken over may hold a dead owner's window: read it one
                # event at a time until a fresh event shows up (rule 4), so only the event
                # actually handed out has its delivery count raised.
                self._recovering |= owned - self.owned
                self.assigned, self.owned = assigned, owned
        except BackendUnavailableError as exc:
            log.warning("stream %s group %s: coordination failed, will retry: %s", stream, self.group, exc)

    def _heartbeat(self) -> None:
        beat = min(self.options.session, self.options.ack_deadline) / 3
        try:
            while not self.stopping.wait(beat):
                if not self._worker.is_alive():  # ended without saying why: never renew for it
                    self._fail(RuntimeError("the worker thread ended"), "worker")
                    break
                self._coordinate()
                self._extend()
        except BaseException as exc:
            self._fail(exc, "heartbeat")
        with contextlib.suppress(BackendError):
            self._backend.leave(self.runtime.name, self.group, self.name)

    def _extend(self) -> None:
        """Push back the ack deadline of what this consumer holds: the batch in hand
        (unless its handler overran ``timeout``) and the batches paused for a retry."""
        busy, timeout = self.busy, self.options.timeout
        with self._lock:
            partitions = set(self._held)
        if busy is not None and (timeout is None or time.monotonic() - self.busy_since < timeout):
            partitions.add(busy)
        for p in sorted(partitions):
            with contextlib.suppress(BackendUnavailableError):
                self._backend.extend(self.runtime.name, self.group, p, self.name, self.options.ack_deadline)

    # -- the work --------------------------------------------------------------

    def _work(self) -> None:
        try:
            self._serve()
        except BaseException as exc:
            self._fail(exc, "worker")
        finally:
            with self._lock:
                held, self._held = self._held, {}
            for batch in held.values():  # stopped while paused: the events stay pending
                self._in_flight.dec(len(batch.events))
            if self._loop is not None:
                self._loop.close()

    def _serve(self) -> None:
        """Round-robin over the owned partitions: read and handle a batch of each, or
        resume a paused one whose retry is due. Only the partition of a failing event
        waits for its back-off; the others go on."""
        poll = self.options.poll
        while not self.stopping.is_set():
            with self._lock:
                owned = sorted(self.owned)
                for p in [p for p in self._held if p not in self.owned]:
                    # The lease went to another member: it gets these events redelivered.
                    self._in_flight.dec(len(self._held.pop(p).events))
                held = dict(self._held)
            if not owned:
                self.stopping.wait(min(poll, self.options.session / 3))
                continue
            readable = [p for p in owned if p not in held]
            next_due = min((h.due for h in held.values()), default=math.inf)
            progressed = False
            for p in owned:
                if self.stopping.is_set() or p not in self.owned:
                    continue
                batch = held.get(p)
                if batch is not None:
                    if batch.due <= time.monotonic():
                        self._resume(p, batch)
                        progressed = True
                    continue
                wait = 0.0
                if not progressed:  # long-poll while idle, but not past a due retry
                    wait = min(poll / len(readable), max(0.0, next_due - time.monotonic()))
                if self._one_batch(p, wait):
                    progressed = True
            if not progressed and not readable:  # only paused partitions: sleep until one is due
                self.stopping.wait(min(poll, max(0.0, next_due - time.monotonic())))

    def _one_batch(self, partition: int, wait: float) -> bool:
        backend, stream = self._backend, self.runtime.name
        recovering = partition in self._recovering
        self.busy = partition
        try:
            try:
                events = _retry(
                    self.stopping,
                    lambda: backend.read(
                        stream,
                        self.group,
                        partition,
                        self.name,
                        max=1 if recovering else self.options.read_size,
                        ack_deadline=self.options.ack_deadline,
                        timeout=wait,
                    ),
                )
            except BackendUnavailableError:
                return False
            if not events:
                return False
            if events[-1].deliveries > 1:
                self._recovering.add(partition)
                self._redelivered.inc(len(events))
            else:
                self._recovering.discard(partition)
            self._in_flight.inc(len(events))
            self._advance(partition, _Held(events, 0, events[0].deliveries, 0.0))
            return True
        finally:
            self.busy = None

    def _resume(self, partition: int, batch: _Held) -> None:
        self.busy = partition
        try:
            self._advance(partition, batch)
        finally:
            self.busy = None

    def _commit(self, partition: int, offset: int) -> None:
        try:
            _retry(
                self.stopping, lambda: self._backend.commit(self.runtime.name, self.group, partition, offset)
            )
        except BackendUnavailableError:
            log.warning(
                "stream %s group %s partition %d: commit of %d failed; the events will be redelivered",
                self.runtime.name,
                self.group,
                partition,
                offset,
            )
        except BackendError as exc:  # the group was moved (replay) under this batch
            log.info("stream %s group %s: commit ignored: %s", self.runtime.name, self.group, exc)

    def _dead_letter(self, event: Event, reason: str, error: BaseException | None = None) -> bool:
        """Record ``event`` as dead (which commits past it); ``False`` when the record
        could not be written — then nothing may be committed past it."""
        record = None if error is None else json.dumps(encode_error(error))
        log.warning(
            "stream %s group %s: event %s (partition %d offset %d) dead-lettered: %s",
            self.runtime.name,
            self.group,
            event.id,
            event.partition,
            event.offset,
            reason,
        )
        try:
            _retry(
                self.stopping,
                lambda: self._backend.dead_letter(self.runtime.name, self.group, event, reason, record),
            )
        except BackendError as exc:
            log.warning(
                "stream %s group %s: the dead letter of event %s (partition %d offset %d) could not be "
                "written (%s); it stays pending and is tried again",
                self.runtime.name,
                self.group,
                event.id,
                event.partition,
                event.offset,
                exc,
            )
            return False
        self._dead.inc()
        return True

    def _gives_up(self, event: Event, attempt: int) -> tuple[str, BaseException | None] | None:
        """Why ``event`` goes to the dead letters before its handler runs, if it does."""
        if event.malformed is not None:  # no retry can make an entry Foundry's
            return f"not an event Foundry can read: {event.malformed}", None
        if attempt > self.options.max_deliveries:
            return (
                f"delivered {event.deliveries} times without an acknowledgement "
                f"(max_deliveries={self.options.max_deliveries}): its consumer crashed, hung or overran "
                f"the ack deadline ({self.options.ack_deadline:g}s) each time",
                None,
            )
        return None

    def _advance(self, partition: int, batch: _Held) -> None:
        """Handle ``batch.events`` from ``batch.index`` on, strictly in order, and commit
        what is done. A failing event with attempts left pauses the batch (``_held``)
        until its back-off has passed; the events behind it wait, other partitions do not.
        """
        limit = self.options.max_deliveries
        events = batch.events
        done: int | None = None
        attempt = batch.attempt
        index = batch.index
        pending_letter = batch.letter
        try:
            while index < len(events):
                event = events[index]
                letter: tuple[Event, str, BaseException | None] | None = pending_letter
                pending_letter = None
                if letter is None:
                    given_up = self._gives_up(event, attempt)
                    if given_up is not None:
                        letter = (event, *given_up)
                    else:
                        data, problem = self._decode(event)
                        if problem is not None:  # no retry can fix bytes that are not an event
                            letter = (event, problem, None)
                        else:
                            error = self._call(event, data, attempt)
                            if error is None:
                                self._handled += 1
                                done = event.offset
                                index += 1
                                attempt = events[index].deliveries if index < len(events) else 0
                                continue
                            if attempt >= limit:
                                letter = (
                                    dataclasses.replace(event, deliveries=attempt),
                                    f"handler {self.spec.name} raised {type(error).__name__}: {error} "
                                    f"(attempt {attempt} of max_deliveries={limit})",
                                    error,
                                )
                            else:
                                self._redelivered.inc()
                                self._pause(partition, _Held(events, index, attempt + 1, 0.0), done, attempt)
                                return
                if not self._dead_letter(*letter):
                    if self.stopping.is_set():
                        break  # it stays pending: redelivered to whoever reads next
                    self._pause(partition, _Held(events, index, attempt, 0.0, letter), done, attempt)
                    return
                done = event.offset
                index += 1
                attempt = events[index].deliveries if index < len(events) else 0
            if done is not None:
                self._commit(partition, done)
            with self._lock:
                self._held.pop(partition, None)
            self._in_flight.dec(len(events))
        except BaseException:
            # A handler ended the thread (sys.exit): what it finished is not redone elsewhere.
            if done is not None:
                with contextlib.suppress(BackendError):
                    self._backend.commit(self.runtime.name, self.group, partition, done)
            raise
        finally:
            self._consumed.inc(self._handled)  # metrics once per batch, not per event
            self._handled = 0
            self._seconds.observe_many(self._durations)
            self._durations.clear()

    def _pause(self, partition: int, batch: _Held, done: int | None, failed_attempt: int) -> None:
        """Hold ``batch`` until its back-off (``retry_backoff`` doubling per attempt of
        this delivery, at most 5 s) has passed; commit what succeeded before it first."""
        if done is not None:  # keep what succeeded even if we crash while paused
            self._commit(partition, done)
        first = batch.events[batch.index].deliveries
        # One partition waits alone, so no jitter: retry_backoff doubling per retry, ≤ 5 s.
        policy = Backoff(self.options.retry_backoff, 5.0, jitter="none", owner=self.group)
        delay = policy.delay(1 + max(0, failed_attempt - first))
        batch.due = time.monotonic() + delay
        with self._lock:
            self._held[partition] = batch

    def _new_loop(self) -> CallerLoop:
        """This consumer's loop for an ``async def`` handler, watched unless the app's
        ``watchdog`` setting is off (``loop="stream:<stream>/<group>"``)."""
        spec = self.spec
        return CallerLoop(
            label=f"stream:{self.runtime.name}/{self.group}",
            watchdog=self.runtime.watchdog,
            registry=self.runtime.metrics,
            units=(Target(spec.name, spec.handler), *spec.watch),
        )

    def _decode(self, event: Event) -> tuple[Any, str | None]:
        try:
            return self.runtime.codec.decode(event.payload), None
        except Exception as exc:
            return None, (
                f"the event is not valid {self.runtime.codec.name} ({type(exc).__name__}: {exc}); "
                "a producer outside Foundry wrote it, or with another codec"
            )

    def _call(self, event: Event, data: Any, attempt: int) -> BaseException | None:
        tracer = self.runtime.tracing.tracer()
        if tracer is None:
            return self._handle(event, data, attempt)
        attributes = {
            **self.runtime._span_attributes("process", "process"),
            "messaging.consumer.group.name": self.group,
            "messaging.message.id": event.id,
            "messaging.destination.partition.id": str(event.partition),
            "foundry.stream.offset": event.offset,
            "foundry.stream.delivery": attempt,
            "foundry.unit": self.spec.name,
        }
        with tracer.process(f"process {self.runtime.name}", event.trace, attributes) as span:
            error = self._handle(event, data, attempt)
            if error is not None:
                tracer.failed(span, error)
            return error

    def _handle(self, event: Event, data: Any, attempt: int) -> BaseException | None:
        view = StreamEvent(event, self.group, data)
        view.deliveries = attempt
        self.busy_since = time.monotonic()
        started = time.perf_counter()
        try:
            if self.spec.is_async:
                if self._loop is None:
                    self._loop = self._new_loop()
                coro = self.spec.handler(view)
                self._loop.run(asyncio.wait_for(coro, self.options.timeout))
            else:
                self.spec.handler(view)
        except Exception as exc:
            return exc
        finally:
            self._durations.append(time.perf_counter() - started)
        return None


# -- idempotency --------------------------------------------------------------------


class Idempotency:
    """A record of the event ids a group has handled, in a SQLite file, for handlers that
    must not apply an event twice.

    ``with idem.once(event) as tx:`` opens one transaction, records ``event.id`` for
    ``event.group`` and hands you the connection (``tx``) — or ``None`` when the id was
    already recorded, i.e. this is a redelivery or a replay of an event already applied.
    Write your effect through ``tx``: the effect and the record commit together or not at
    all (exactly-once effect for writes to this database). For effects elsewhere, the
    record narrows duplicates to a crash between your effect and the commit.

    ``forget(group)`` drops a group's record — do it before a deliberate replay whose
    effects you *want* applied again.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        with self._tx() as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS foundry_handled (grp TEXT NOT NULL, id TEXT NOT NULL, "
                "at REAL NOT NULL, PRIMARY KEY (grp, id)) WITHOUT ROWID"
            )

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A plain transaction on the same database (set-up, reports, resets)."""
        with self._tx() as conn:
            yield conn

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @staticmethod
    def _check_id(group: Any, event_id: Any) -> None:
        if not isinstance(event_id, str) or not event_id or not isinstance(group, str):
            raise SubmitError(
                f"Idempotency: event id {event_id!r} (group {group!r}) cannot be recorded: an empty id "
                "would make every other id-less event look applied already. Fix: pass the StreamEvent "
                "your handler received (Foundry gives every event an id, derived from its stream, "
                "partition and offset when its producer set none)"
            )

    @contextlib.contextmanager
    def once(self, event: StreamEvent) -> Iterator[sqlite3.Connection | None]:
        """Record ``event.id`` for ``event.group`` with your writes; ``None`` when it was
        recorded before. An event without an id is refused (:class:`SubmitError`), never
        treated as seen."""
        self._check_id(event.group, event.id)
        with self._tx() as conn:
            fresh = conn.execute(
                "INSERT OR IGNORE INTO foundry_handled VALUES (?,?,?)", (event.group, event.id, time.time())
            ).rowcount
            yield conn if fresh else None

    def seen(self, group: str, event_id: str) -> bool:
        self._check_id(group, event_id)
        row = (
            self._conn()
            .execute("SELECT 1 FROM foundry_handled WHERE grp=? AND id=?", (group, event_id))
            .fetchone()
        )
        return row is not None

    def forget(self, group: str) -> int:
        with self._tx() as conn:
            return int(conn.execute("DELETE FROM foundry_handled WHERE grp=?", (group,)).rowcount)

    def close(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()
        self._local = threading.local()


# -- @app.work units whose decision is `stream` --------------------------------------


def make_runner(spec: Any, ctx: Any) -> Any:
    """A unit decided as ``stream`` (ordered per key, durable): each call is an event on a
    stream named after the unit, handled in order per key by this process's consumer."""
    from foundry.deliver._stream_unit import StreamUnitRunner

    return StreamUnitRunner(spec, ctx)
