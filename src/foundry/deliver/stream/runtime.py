"""The stream runtime: one declared stream (publish, consumer groups, replay, lag)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from foundry.backends.idempotency import IdempotencyStore, open_idempotency_store, store_url_for
from foundry.backends.stream import (
    Appended,
    DeadLetter,
    NewEvent,
    PartitionLag,
    Start,
    StreamBackend,
    StreamConfig,
    open_stream_backend,
)
from foundry.config import DEFAULT_WATCHDOG, safe_url
from foundry.deliver.stream.consumer import Consumer
from foundry.deliver.stream.consumers import Consumers
from foundry.deliver.stream.event import Published
from foundry.deliver.stream.options import ConsumerOptions, GroupSpec, Handler
from foundry.errors import (
    BackendError,
    ConfigError,
    DeclarationError,
    NotFoundError,
    PayloadTooLargeError,
    SubmitError,
)
from foundry.observe import names
from foundry.observe.metrics import Registry
from foundry.observe.stall import UnitLike
from foundry.observe.tracing import OFF, Tracing, messaging_system
from foundry.outage import aride_outage, ride_outage
from foundry.payload import dumps_text
from foundry.serialize import Codec, get_codec

__all__ = ["StreamRuntime"]


T = TypeVar("T")

MAX_PAYLOAD = 1024 * 1024  # bytes per event (NATS's default max_payload)


def _chunks(events: list[NewEvent], size: int) -> Iterator[list[NewEvent]]:
    """``events`` in batches of ``size``: one transaction / script / pipelined burst each."""
    for start in range(0, len(events), size):
        yield events[start : start + size]


def _published(event: NewEvent, appended: Appended) -> Published:
    return Published(event.id, appended.partition, appended.offset, appended.duplicate)


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
        self._json = self.codec.name == "json"
        self._backend = backend
        self._own_backend = backend is None
        self._ready = False
        self._lock = threading.Lock()
        self.groups: dict[str, GroupSpec] = {}
        self._running: list[Consumers] = []
        self._stores: dict[str, IdempotencyStore] = {}  # by URL, opened by idempotent groups
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

    def idempotency_store(self, url: str | None = None) -> IdempotencyStore:
        """The idempotency store of this stream's idempotent groups: on the stream's own
        engine (its SQLite file, its NATS cluster, its Redis) unless ``url`` names another.
        Opened once per URL, closed with the runtime."""
        target = store_url_for(self._url) if url is None else url
        with self._lock:
            if self._closed:
                raise BackendError(f"stream {self.name!r} is closed. Fix: declare it again in a new app")
            store = self._stores.get(target)
            if store is None:
                store = self._stores[target] = open_idempotency_store(target)
            return store

    # -- publishing ------------------------------------------------------------

    def _encode(self, event: Any, id: str | None, key: Any, trace: str | None = None) -> NewEvent:
        # Runs once per published event: concrete-type checks first (an ABC isinstance
        # costs as much as the rest), the JSON encoder made once (dumps_text).
        if id is None:
            id = uuid.uuid4().hex
        elif not isinstance(id, str) or not id or len(id) > 200:
            raise SubmitError(
                f"stream {self.name!r}: event id {id!r} is not usable. Fix: give id= a non-empty string "
                "of at most 200 characters (the same id on a retry makes the publish idempotent)"
            )
        if key is None and self.key_field is not None:
            if not (type(event) is dict or isinstance(event, Mapping)) or self.key_field not in event:
                raise SubmitError(
                    f"stream {self.name!r}: the event has no field {self.key_field!r}, which orders it "
                    f"(key={self.key_field!r}). Fix: include {self.key_field!r} in the event, or pass key=..."
                )
            key = event[self.key_field]
        if key is not None and type(key) is not str:
            if isinstance(key, bool) or not isinstance(key, str | int):
                raise SubmitError(
                    f"stream {self.name!r}: key {key!r} is not a string or an integer. "
                    "Fix: key events by an id (a session id, an account number)"
                )
            key = str(key)
        payload = b""
        if self._json:
            try:
                payload = dumps_text(event).encode()
            except (TypeError, ValueError, RecursionError):
                pass
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
        if self.tracing.tracer() is not None:  # the send span: publish_many's
            return self.publish_many(
                [event], ids=None if id is None else [id], keys=None if key is None else [key]
            )[0]
        new = self._encode(event, id, key)
        backend = self.backend
        [appended] = ride_outage(functools.partial(backend.append, self.name, [new]), tries=8)
        return self._count(new, appended)

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
        with self._sending() as (span, trace):
            return self._spanned(span, self._append_all(self._encode_all(events, ids, keys, trace)))

    @contextlib.contextmanager
    def _sending(self) -> Iterator[tuple[Any, str | None]]:
        """The *send* span of one publish call and its trace context (``None, None``
        untraced)."""
        tracer = self.tracing.tracer()
        if tracer is None:
            yield None, None
            return
        with tracer.send(f"send {self.name}", self.span_attributes("publish", "send")) as sent:
            yield sent

    @staticmethod
    def _spanned(span: Any, out: list[Published]) -> list[Published]:
        if span is not None:
            span.set_attribute("messaging.batch.message_count", len(out))
        return out

    def span_attributes(self, operation: str, kind: str) -> dict[str, Any]:
        return {
            "messaging.system": messaging_system(self._url),
            "messaging.destination.name": self.name,
            "messaging.operation": operation,
            "messaging.operation.type": kind,
            "foundry.delivery": "stream",
        }

    def _append_all(self, encoded: list[NewEvent]) -> list[Published]:
        backend = self.backend
        out: list[Published] = []
        for chunk in _chunks(encoded, backend.capabilities.append_batch):
            # A retry after "unavailable" re-sends the same ids: dedup makes it safe.
            appended = ride_outage(functools.partial(backend.append, self.name, chunk), tries=8)
            out.extend(map(_published, chunk, appended))
        return self._counted(out)

    def _counted(self, out: list[Published]) -> list[Published]:
        self._published.inc(sum(1 for p in out if not p.duplicate))
        return out

    def _encode_all(
        self,
        events: Iterable[Any],
        ids: Sequence[str] | None,
        keys: Sequence[Any] | None,
        trace: str | None,
    ) -> list[NewEvent]:
        """Every event validated and encoded (before any is sent)."""
        items = events if isinstance(events, list) else list(events)
        if ids is not None and len(ids) != len(items):
            raise SubmitError(
                f"stream {self.name!r}: {len(ids)} ids for {len(items)} events. Fix: one id each"
            )
        if keys is not None and len(keys) != len(items):
            raise SubmitError(
                f"stream {self.name!r}: {len(keys)} keys for {len(items)} events. Fix: one key each"
            )
        encode = self._encode
        if keys is None:
            if ids is None:
                return [encode(item, None, None, trace) for item in items]
            return [encode(item, id, None, trace) for item, id in zip(items, ids, strict=True)]
        return [
            encode(item, None if ids is None else ids[i], key, trace)
            for i, (item, key) in enumerate(zip(items, keys, strict=True))
        ]

    async def apublish(self, event: Any, *, id: str | None = None, key: Any = None) -> Published:
        """:meth:`publish` awaited on the caller's event loop (NATS: one ``js.publish``
        through a connection of that loop; SQLite, Redis: the append in a worker thread)."""
        if self.tracing.tracer() is not None:  # the send span: publish_many's
            many = await self.apublish_many(
                [event], ids=None if id is None else [id], keys=None if key is None else [key]
            )
            return many[0]
        new = self._encode(event, id, key)
        backend = await self._abackend()
        [appended] = await aride_outage(functools.partial(backend.aappend, self.name, [new]), tries=8)
        return self._count(new, appended)

    def _count(self, event: NewEvent, appended: Appended) -> Published:
        """The record of one published event, counted unless it was a duplicate."""
        if not appended.duplicate:
            self._published.inc()
        return _published(event, appended)

    async def apublish_many(
        self,
        events: Iterable[Any],
        *,
        ids: Sequence[str] | None = None,
        keys: Sequence[Any] | None = None,
    ) -> list[Published]:
        """:meth:`publish_many` awaited on the caller's event loop: the same validation,
        batches, dedup and tracing; returns once the log stored every event."""
        with self._sending() as (span, trace):
            encoded = self._encode_all(events, ids, keys, trace)
            return self._spanned(span, await self._aappend_all(encoded))

    async def _aappend_all(self, encoded: list[NewEvent]) -> list[Published]:
        backend = await self._abackend()
        out: list[Published] = []
        for chunk in _chunks(encoded, backend.capabilities.append_batch):
            appended = await aride_outage(functools.partial(backend.aappend, self.name, chunk), tries=8)
            out.extend(map(_published, chunk, appended))
        return self._counted(out)

    async def _abackend(self) -> StreamBackend:
        """:attr:`backend` for a coroutine: opening it blocks (a connection, the stream
        made), so the first time it is opened in a worker thread."""
        backend = self._backend
        if backend is None or not self._ready or self._closed:
            return await asyncio.to_thread(lambda: self.backend)
        return backend

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
        self.groups[options.group] = GroupSpec(
            options,
            handler,
            inspect.iscoroutinefunction(handler),
            getattr(handler, "__qualname__", repr(handler)),
            tuple(watch),
        )

    def _group(self, group: str) -> GroupSpec:
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
        members: list[Consumer] = []
        for group in chosen:
            spec = self._group(group)
            self.ensure_group(group)
            members.extend(Consumer(self, spec) for _ in range(consumers))
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
            stores, self._stores = list(self._stores.values()), {}
        if backend is not None and self._own_backend:
            backend.close()
        for store in stores:
            store.close()
