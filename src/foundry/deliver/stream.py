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
   after it wait — until it succeeds or is dead-lettered.
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
from foundry.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigError,
    DeclarationError,
    NotFoundError,
    PayloadTooLargeError,
    SubmitError,
)
from foundry.observe import names
from foundry.observe.metrics import Registry
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


def _retry(stop: threading.Event, what: Callable[[], T], *, attempts: int | None = None) -> T:
    """Call ``what``, retrying while the backend is unavailable (bounded back-off), until
    ``stop`` is set (then the last error is raised)."""
    delay = 0.05
    tries = 0
    while True:
        try:
            return what()
        except BackendUnavailableError:
            tries += 1
            if stop.is_set() or (attempts is not None and tries >= attempts):
                raise
            stop.wait(delay)
            delay = min(delay * 2, 2.0)


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
    ) -> None:
        self.config = config
        self.url = url
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
    def backend(self) -> StreamBackend:
        with self._lock:
            if self._closed:
                raise BackendError(f"stream {self.name!r} is closed. Fix: declare it again in a new app")
            if self._backend is None:
                self._backend = open_stream_backend(self.url)
            if not self._ready:
                self._backend.ensure_stream(self.config)
                self._ready = True
            return self._backend

    # -- publishing ------------------------------------------------------------

    def _encode(self, event: Any, id: str | None, key: Any) -> NewEvent:
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
        return NewEvent(id, payload, key)

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
        and nothing of it is stored."""
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
            self._encode(item, None if ids is None else ids[i], None if keys is None else keys[i])
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

    def add_group(self, handler: Handler, options: ConsumerOptions) -> None:
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
        with self.run(chosen, consumers=consumers):
            until = time.monotonic() + timeout
            while True:
                behind = {g: sum(p.lag for p in self.lag(g)) for g in chosen}
                if not any(behind.values()):
                    return
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


class _Consumer:
    """One member of a group: a worker thread that handles its partitions in order and a
    heartbeat thread that keeps its membership, leases and ack deadlines alive."""

    def __init__(self, runtime: StreamRuntime, spec: _Group) -> None:
        self.runtime = runtime
        self.spec = spec
        self.options = spec.options
        self.group = spec.options.group
        self.name = _consumer_name(self.group)
        self.stopping = threading.Event()
        self.owned: set[int] = set()
        self.assigned: set[int] = set()
        self.busy: int | None = None
        self.busy_since = 0.0
        self._recovering: set[int] = set()
        self._durations: list[float] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
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
            owned = set()
            for p in sorted(self.owned | assigned):
                if p in assigned or p == self.busy:
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
        while not self.stopping.wait(beat):
            self._coordinate()
            busy = self.busy
            timeout = self.options.timeout
            if busy is not None and (timeout is None or time.monotonic() - self.busy_since < timeout):
                with contextlib.suppress(BackendUnavailableError):
                    self._backend.extend(
                        self.runtime.name, self.group, busy, self.name, self.options.ack_deadline
                    )
        with contextlib.suppress(BackendError):
            self._backend.leave(self.runtime.name, self.group, self.name)

    # -- the work --------------------------------------------------------------

    def _work(self) -> None:
        try:
            while not self.stopping.is_set():
                with self._lock:
                    owned = sorted(self.owned)
                if not owned:
                    self.stopping.wait(min(self.options.poll, self.options.session / 3))
                    continue
                idle = True
                for p in owned:
                    if self.stopping.is_set() or p not in self.owned:
                        continue
                    wait = 0.0 if not idle else self.options.poll / len(owned)
                    if self._one_batch(p, wait):
                        idle = False
        except Exception:
            log.exception("stream %s group %s: consumer %s stopped", self.runtime.name, self.group, self.name)
        finally:
            if self._loop is not None:
                self._loop.close()

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
            try:
                self._handle_batch(partition, events)
            finally:
                self._in_flight.dec(len(events))
            return True
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

    def _dead_letter(self, event: Event, reason: str, error: BaseException | None = None) -> None:
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
        with contextlib.suppress(BackendError):
            _retry(
                self.stopping,
                lambda: self._backend.dead_letter(self.runtime.name, self.group, event, reason, record),
            )
        self._dead.inc()

    def _handle_batch(self, partition: int, events: list[Event]) -> None:
        limit = self.options.max_deliveries
        done: int | None = None
        handled = 0
        for event in events:  # the whole batch, even when stopping: it is bounded
            if event.deliveries > limit:
                self._dead_letter(
                    event,
                    f"delivered {event.deliveries} times without an acknowledgement "
                    f"(max_deliveries={limit}): its consumer crashed, hung or overran the ack deadline "
                    f"({self.options.ack_deadline:g}s) each time",
                )
                done = event.offset
                continue
            data, problem = self._decode(event)
            if problem is not None:  # no retry can fix bytes that are not an event
                self._dead_letter(event, problem)
                done = event.offset
                continue
            attempt = event.deliveries
            while True:
                error = self._call(event, data, attempt)
                if error is None:
                    handled += 1
                    done = event.offset
                    break
                if attempt >= limit:
                    self._dead_letter(
                        dataclasses.replace(event, deliveries=attempt),
                        f"handler {self.spec.name} raised {type(error).__name__}: {error} "
                        f"(attempt {attempt} of max_deliveries={limit})",
                        error,
                    )
                    done = event.offset
                    break
                if done is not None:  # keep what succeeded even if we crash while waiting
                    self._commit(partition, done)
                    done = None
                self._redelivered.inc()
                delay = min(self.options.retry_backoff * 2 ** (attempt - event.deliveries), 5.0)
                if self.stopping.wait(delay):
                    break
                attempt += 1
            if self.stopping.is_set() and done != event.offset:
                break  # stopped while retrying: the failing event stays pending
        if done is not None:
            self._commit(partition, done)
        self._consumed.inc(handled)  # metrics once per batch, not per event
        self._seconds.observe_many(self._durations)
        self._durations.clear()

    def _decode(self, event: Event) -> tuple[Any, str | None]:
        try:
            return self.runtime.codec.decode(event.payload), None
        except Exception as exc:
            return None, (
                f"the event is not valid {self.runtime.codec.name} ({type(exc).__name__}: {exc}); "
                "a producer outside Foundry wrote it, or with another codec"
            )

    def _call(self, event: Event, data: Any, attempt: int) -> BaseException | None:
        view = StreamEvent(event, self.group, data)
        view.deliveries = attempt
        self.busy_since = time.monotonic()
        started = time.perf_counter()
        try:
            if self.spec.is_async:
                if self._loop is None:
                    self._loop = asyncio.new_event_loop()
                coro = self.spec.handler(view)
                self._loop.run_until_complete(asyncio.wait_for(coro, self.options.timeout))
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

    @contextlib.contextmanager
    def once(self, event: StreamEvent) -> Iterator[sqlite3.Connection | None]:
        with self._tx() as conn:
            fresh = conn.execute(
                "INSERT OR IGNORE INTO foundry_handled VALUES (?,?,?)", (event.group, event.id, time.time())
            ).rowcount
            yield conn if fresh else None

    def seen(self, group: str, event_id: str) -> bool:
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
