"""NATS JetStream: one JetStream stream per partition, one durable pull consumer per group.

URL: ``nats://host:4222`` (several servers: ``nats://a:4222,b:4222``) with the options
``prefix=`` (default ``foundry``; JetStream names become ``FOUNDRY_<stream>_<n>`` and
subjects ``foundry.<stream>.<n>``) and ``storage=file|memory`` (default ``file``).

How the contract maps onto JetStream:

* **Dense offsets.** Each partition is its own JetStream stream with the one subject
  ``<prefix>.<stream>.<partition>``, so the stream sequence *is* the partition offset
  (1, 2, 3 …), lag is a subtraction and ``opt_start_seq`` is a replay from an offset.
* **Publish dedup**: every event carries ``Nats-Msg-Id: <event id>``; the stream's
  ``duplicate_window`` is the dedup window (clamped to ``max_age``; JetStream requires
  it). A batch goes out with ``publish_async`` and is awaited as a whole. Dedup is per
  partition: an id republished with a *different* key could land elsewhere (a producer
  bug Foundry does not guard against on this engine).
* **Publishing from a coroutine** (``aappend``): a nats client belongs to the event loop
  it was made on, so each other loop that appends gets a client of its own, made at its
  first call (at most ``_LOOP_CLIENTS`` loops; beyond, the call is awaited through the
  backend's loop thread) and closed when that loop shuts its async generators down
  (``asyncio.run`` does) or by :meth:`close`. Its append is one ``await js.publish`` (a
  batch: ``publish_async`` and its acks) on the caller's loop, with no thread in between.
* **Groups** are durable pull consumers named after the group, ``AckExplicit``,
  ``ack_wait`` = the group's ack deadline, ``max_deliver`` unlimited (Foundry
  dead-letters by its own count, with a reason), ``max_ack_pending`` bounded. A commit
  acknowledges every message up to the offset, oldest first, and waits for the server
  on the last. Not ``AckAll``: JetStream ignores a cumulative ack whose *delivery*
  sequence is below the last one acknowledged, and after a takeover a message held
  back from the first delivery has a lower delivery sequence than the redelivered
  older ones — its commit would be dropped without an error.
* **Order under redelivery.** JetStream hands out new messages while older ones wait
  for their ``ack_wait``, so a read here is not atomic between readers
  (``capabilities.atomic_read = False``): the runtime holds the partition's lease while
  reading. Within a reader, messages newer than the pending window are *held* back
  until every older pending message (redelivered by the server after its ``ack_wait``)
  has been handed out and committed — a new owner after a crash never processes a
  later event of a key before the earlier one.
* **Extend** sends ``+WPI`` (``in_progress``) for the messages a consumer holds.
* **Retention** is JetStream's own (``max_age``, ``max_msgs``, ``max_bytes``);
  :meth:`enforce_retention` has nothing to do.
* **Leases and membership** are records in a small coordination stream per stream
  (one message per subject, compare-and-set with ``Nats-Expected-Last-Subject-Sequence``);
  dead letters are a stream ``<PREFIX>_<stream>_dead``.

The client reconnects by itself (``max_reconnect_attempts=-1``); while the server is
away every call raises :class:`~foundry.errors.BackendUnavailableError` within its
timeout, and nothing acknowledged is lost (file storage).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import math
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar
from urllib.parse import parse_qsl, urlsplit

import nats
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import api

from foundry.backends._nats import client_options
from foundry.backends._urls import ShowsUrl
from foundry.backends.stream._common import (
    CheckedRead,
    dead_from_record,
    dead_record,
    event_letter,
    gap_letter,
)
from foundry.backends.stream.base import (
    Appended,
    Capabilities,
    DeadLetter,
    Event,
    MalformedEntryError,
    NewEvent,
    PartitionLag,
    Start,
    StreamConfig,
    StreamInfo,
    check_name,
    check_partition,
    derived_id,
    malformed_event,
    out_of_range,
    partition_for,
    partitions_changed,
    unknown_group,
    unknown_stream,
)
from foundry.config import safe_url
from foundry.errors import BackendError, BackendUnavailableError, ConfigError, NotFoundError
from foundry.tracecontext import pack, unpack

__all__ = ["NatsStreamBackend", "decode_message"]

T = TypeVar("T")

_MAX_ACK_PENDING = 20_000
_LOOP_CLIENTS = 8  # event loops with a connection of their own for aappend (more: a thread hop)
_DEFAULT_ACK_WAIT = 30.0
_CONFLICT_CODES = (10071, 10164)  # wrong last subject sequence
_UNAVAILABLE = (
    nats.errors.NoServersError,
    nats.errors.ConnectionClosedError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.ConnectionDrainingError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.NoStreamResponseError,
    TimeoutError,
    ConnectionError,
    OSError,
)


def _parse(url: str) -> tuple[list[str], str, api.StorageType]:
    parts = urlsplit(url)
    prefix, storage = "foundry", api.StorageType.FILE
    for name, value in parse_qsl(parts.query):
        if name == "prefix":
            if not value or not value.replace("_", "").replace("-", "").isalnum():
                raise ConfigError(
                    f"stream URL {safe_url(url)!r}: prefix={value!r}. Fix: letters, digits, '-' or '_'"
                )
            prefix = value
        elif name == "storage":
            if value not in ("file", "memory"):
                raise ConfigError(
                    f"stream URL {safe_url(url)!r}: storage={value!r}. Fix: storage=file or storage=memory"
                )
            storage = api.StorageType(value)
        else:
            raise ConfigError(
                f"stream URL {safe_url(url)!r}: unknown option {name!r}. "
                "Fix: the nats stream takes only prefix= and storage="
            )
    if not parts.netloc:
        raise ConfigError(f"stream URL {safe_url(url)!r} names no server. Fix: nats://127.0.0.1:4222")
    servers = [f"{parts.scheme}://{host}" for host in parts.netloc.split(",")]
    return servers, prefix, storage


def decode_message(
    stream: str,
    partition: int,
    offset: int,
    headers: Mapping[str, Any] | None,
    data: Any,
    timestamp: float,
    deliveries: int,
) -> Event:
    """A JetStream message (its stream sequence ``offset``, headers and data) as an event,
    or :class:`MalformedEntryError`; nothing else is raised. Anyone can publish to the
    partition's subject: a message without ``Nats-Msg-Id`` gets the id
    :func:`~foundry.backends.stream.base.derived_id` (stable across redeliveries), one
    without ``Foundry-Key`` no key; whether its data is an event is the codec's call. Its
    ``traceparent``/``tracestate`` headers are its trace context, ignored when they do not
    parse (a foreign producer's may be anything)."""
    if headers is None:
        headers = {}
    if not isinstance(headers, Mapping):
        raise MalformedEntryError(f"its headers are {type(headers).__name__}, not a mapping")
    ident, key = headers.get("Nats-Msg-Id"), headers.get("Foundry-Key")
    if ident is not None and not isinstance(ident, str):
        raise MalformedEntryError(f"its Nats-Msg-Id is {type(ident).__name__}, not text")
    if key is not None and not isinstance(key, str):
        raise MalformedEntryError(f"its Foundry-Key is {type(key).__name__}, not text")
    if not isinstance(data, bytes | bytearray | memoryview):
        raise MalformedEntryError(f"its data is {type(data).__name__}, not bytes")
    if not isinstance(timestamp, int | float) or not math.isfinite(timestamp):
        raise MalformedEntryError(f"its timestamp {timestamp!r} is not a time")
    return Event(
        stream,
        partition,
        offset,
        ident or derived_id(stream, partition, offset),
        key,
        bytes(data),
        float(timestamp),
        deliveries,
        trace=pack(headers.get("traceparent"), headers.get("tracestate")),
    )


def _headers(event: NewEvent) -> dict[str, str]:
    """An event's message headers: its id (JetStream's dedup), key and trace context."""
    headers = {"Nats-Msg-Id": event.id}
    if event.key is not None:
        headers["Foundry-Key"] = event.key
    if event.trace is not None:  # W3C Trace Context's own header names
        headers["traceparent"], state = unpack(event.trace)
        if state is not None:
            headers["tracestate"] = state
    return headers


async def _acks(futures: Sequence[asyncio.Future[T]]) -> list[T]:
    """The results of ``futures``, in order, or the first one's error. Cheaper than
    ``gather`` (no callback per future: acks mostly arrive in order, so the wait is on the
    first that is not done yet); every error is retrieved, so none is logged as lost."""
    try:
        for future in futures:
            if not future.done():
                await future
        return [future.result() for future in futures]
    except BaseException:
        for future in futures:
            future.add_done_callback(_retrieve)
        raise


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _b64encode(payload: bytes) -> str:
    return base64.b64encode(payload).decode()


def _refused_login(exc: BaseException) -> bool:
    """Whether the NATS client's error is the server refusing the credentials."""
    return isinstance(exc, nats.errors.AuthorizationError) or "authorization violation" in str(exc).lower()


_CLOSING: set[asyncio.Task[None]] = set()  # closes scheduled on a loop that runs in the closing thread


class _LoopClient:
    """The connection of one event loop other than the backend's, for :meth:`aappend`:
    a nats client belongs to the loop it was made on. Opened at the loop's first call;
    closed by the loop's shutdown of its async generators (``asyncio.run`` ends with it:
    the client registers one) or by the backend's :meth:`close`, whichever comes first."""

    def __init__(self, open: Callable[[], Awaitable[Any]], timeout: float) -> None:
        self._open = open
        self._timeout = timeout
        self._lock: asyncio.Lock | None = None
        self._nc: Any = None
        self.js: Any = None
        self._hook: AsyncGenerator[None, None] | None = None

    async def connect(self) -> Any:
        if self._nc is not None and not self._nc.is_closed:
            return self.js
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._nc is None or self._nc.is_closed:
                nc = await self._open()
                self._nc, self.js = nc, nc.jetstream(timeout=self._timeout)
                self._hook = self._closer(nc)
                await anext(self._hook)  # now the loop's: it closes the client as the loop ends
        return self.js

    async def _closer(self, nc: Any) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            if not nc.is_closed:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(nc.close(), self._timeout)

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close the connection from any thread (the loop must not be blocked)."""
        hook, self._hook = self._hook, None
        if hook is None or loop.is_closed():
            return
        closing = hook.aclose()
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:  # close() called from a coroutine of that loop: close when it yields
            task = loop.create_task(closing)
            _CLOSING.add(task)
            task.add_done_callback(_CLOSING.discard)
        elif loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(closing, loop).result(self._timeout * 2)
        else:
            with contextlib.suppress(Exception):
                loop.run_until_complete(closing)


@dataclass
class _Part:
    """What this process knows of one (group, partition): the pending window
    ``(floor, hi]`` on the server, messages handed out and messages held back."""

    sub: Any = None
    known: bool = False
    floor: int = 0
    hi: int = 0
    ack_wait: float | None = None
    out: dict[int, Msg] = field(default_factory=dict)  # handed out, not committed
    redo: dict[int, Msg] = field(default_factory=dict)  # redelivered, waiting for their turn
    held: dict[int, Msg] = field(default_factory=dict)  # newer than the window, held back
    checked_retention: float = 0.0


class NatsStreamBackend(ShowsUrl, CheckedRead):
    """NATS JetStream (see the module docstring)."""

    # A call pipelines all its messages and waits once for their acks at the end: the larger
    # the call, the fewer of those pauses (20 per 20,000 events cost a third of the rate).
    capabilities: ClassVar[Capabilities] = Capabilities(
        atomic_read=False, dense_offsets=True, append_batch=10_000
    )

    def __init__(self, url: str, *, request_timeout: float = 5.0) -> None:
        self._url = url  # to connect with; messages and reprs show ``shown``
        self.shown = safe_url(url)
        self._servers, self.prefix, self._storage = _parse(url)
        self._timeout = request_timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="foundry-nats", daemon=True)
        self._thread.start()
        self._nc: Any = None
        self._js: Any = None
        self._connect_lock: asyncio.Lock | None = None
        self._configs: dict[str, StreamConfig] = {}
        self._parts: dict[tuple[str, str, int], _Part] = {}
        self._clients: dict[asyncio.AbstractEventLoop, _LoopClient] = {}  # other loops', for aappend
        self._clients_lock = threading.Lock()
        self._closed = False

    # -- plumbing --------------------------------------------------------------

    def _jsname(self, stream: str, partition: int | str) -> str:
        return f"{self.prefix.upper()}_{stream}_{partition}"

    def _subject(self, stream: str, partition: int | str) -> str:
        return f"{self.prefix}.{stream}.{partition}"

    def _call(self, make: Callable[[], Coroutine[Any, Any, T]], what: str, timeout: float | None = None) -> T:
        if self._closed:
            raise BackendError(f"stream backend {self.shown} is closed. Fix: open a new one")
        future = asyncio.run_coroutine_threadsafe(self._guard(make, what), self._loop)
        try:
            return future.result((timeout or 0.0) + self._timeout * 3)
        except TimeoutError as exc:
            future.cancel()
            raise BackendUnavailableError(f"NATS at {self.shown}: {what} timed out") from exc

    async def _hop(self, make: Callable[[], Coroutine[Any, Any, T]], what: str, timeout: float) -> T:
        """:meth:`_call` for a coroutine of another loop: awaited there, not blocking it."""
        try:
            future = asyncio.run_coroutine_threadsafe(self._guard(make, what), self._loop)
        except RuntimeError as exc:  # the backend's loop closed under us
            raise BackendError(f"stream backend {self.shown} is closed. Fix: open a new one") from exc
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout + self._timeout * 3)
        except TimeoutError as exc:
            future.cancel()
            raise BackendUnavailableError(f"NATS at {self.shown}: {what} timed out") from exc

    async def _guard(
        self, make: Callable[[], Awaitable[T]], what: str, connect: Callable[[], Awaitable[Any]] | None = None
    ) -> T:
        """``make()`` once connected (by ``connect``, default the backend's own connection),
        its driver errors turned into Foundry's."""
        try:
            await (connect or self._connected)()
            return await make()
        except (NotFoundError, ConfigError, BackendError):
            raise
        except nats.js.errors.APIError as exc:
            if isinstance(exc, _UNAVAILABLE):
                raise BackendUnavailableError(f"NATS at {self.shown}: {what} failed: {exc}") from exc
            raise BackendError(f"NATS at {self.shown}: {what} failed: {exc}") from exc
        except _UNAVAILABLE as exc:
            raise BackendUnavailableError(
                f"NATS at {self.shown}: {what} failed ({type(exc).__name__}: {exc}); the client reconnects "
                "by itself. Fix: check that nats-server runs with JetStream (-js)"
            ) from exc
        except nats.errors.Error as exc:
            raise BackendError(f"NATS at {self.shown}: {what} failed: {exc}") from exc

    async def _connected(self) -> Any:
        if self._nc is not None and not self._nc.is_closed:
            return self._js
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if self._nc is None or self._nc.is_closed:
                self._nc = await self._open()
                self._js = self._nc.jetstream(timeout=self._timeout)
        return self._js

    async def _open(self) -> Any:
        """A new client connected from the running loop (probed first, a refused login
        raised at once)."""
        await self._probe()

        refused: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

        async def on_error(exc: BaseException) -> None:
            # The client retries a refused login like a lost server, until the
            # call's timeout: a refusal is not transient, so stop at the first.
            if _refused_login(exc) and not refused.done():
                refused.set_result(exc)

        connecting = asyncio.ensure_future(nats.connect(**client_options(self._servers, error_cb=on_error)))
        first: set[asyncio.Future[Any]] = {connecting, refused}
        await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
        if not connecting.done():
            connecting.cancel()
            with contextlib.suppress(BaseException):
                await connecting
            raise ConfigError(
                f"NATS at {self.shown} refused the login ({refused.result()}). Fix: check the "
                "user and password (or token) in the stream URL"
            )
        return connecting.result()

    async def _probe(self) -> None:
        """Fail fast and clearly when no server listens: the client itself would keep
        retrying the first connection until the call's timeout."""
        errors = []
        for server in self._servers:
            parts = urlsplit(server)
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(parts.hostname or "127.0.0.1", parts.port or 4222), 2.0
                )
            except (OSError, TimeoutError) as exc:
                errors.append(f"{safe_url(server)}: {exc or type(exc).__name__}")
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return
        raise BackendUnavailableError(
            f"cannot reach NATS at {self.shown} ({'; '.join(errors)}). Fix: start nats-server with "
            "JetStream (nats-server -js), or point the stream URL at a running one"
        )

    def _state(self, stream: str, group: str, partition: int) -> _Part:
        key = (stream, group, partition)
        state = self._parts.get(key)
        if state is None:
            state = self._parts[key] = _Part()
        return state

    async def _forget(self, stream: str, group: str, partition: int) -> None:
        state = self._parts.pop((stream, group, partition), None)
        if state is not None and state.sub is not None:
            with contextlib.suppress(Exception):
                await state.sub.unsubscribe()

    async def _config_async(self, stream: str, js: Any = None) -> StreamConfig:
        """The stream's layout, asked once (through ``js``: default the backend's client)."""
        config = self._configs.get(stream)
        if config is not None:
            return config
        js = js or self._js
        try:
            info = await js.stream_info(self._jsname(stream, 0))
        except nats.js.errors.NotFoundError:
            raise unknown_stream(stream, await self._streams(js)) from None
        meta = json.loads(info.config.description or "{}")
        config = StreamConfig(
            stream,
            int(meta["partitions"]),
            meta.get("max_age"),
            meta.get("max_events"),
            meta.get("max_bytes"),
            float(meta.get("dedup_window", 120.0)),
        )
        self._configs[stream] = config
        return config

    # -- streams ---------------------------------------------------------------

    def ensure_stream(self, config: StreamConfig) -> StreamConfig:
        async def run() -> StreamConfig:
            try:
                existing = await self._js.stream_info(self._jsname(config.name, 0))
                partitions = int(json.loads(existing.config.description or "{}").get("partitions", 0))
                if partitions != config.partitions:
                    raise partitions_changed(config, partitions)
            except nats.js.errors.NotFoundError:
                pass
            description = json.dumps(
                {
                    "foundry": config.name,
                    "partitions": config.partitions,
                    "max_age": config.max_age,
                    "max_events": config.max_events,
                    "max_bytes": config.max_bytes,
                    "dedup_window": config.dedup_window,
                }
            )
            window = config.dedup_window or 0.001
            if config.max_age is not None:
                window = min(window, config.max_age)
            for p in range(config.partitions):
                await self._upsert_stream(
                    api.StreamConfig(
                        name=self._jsname(config.name, p),
                        description=description,
                        subjects=[self._subject(config.name, p)],
                        retention=api.RetentionPolicy.LIMITS,
                        storage=self._storage,
                        max_age=config.max_age,
                        max_msgs=config.max_events or -1,
                        max_bytes=config.max_bytes or -1,
                        duplicate_window=window,
                        discard=api.DiscardPolicy.OLD,
                        num_replicas=1,
                    )
                )
            for suffix, limits in (("dead", {"max_msgs": 100_000}), ("coord", {"max_msgs_per_subject": 1})):
                await self._upsert_stream(
                    api.StreamConfig(
                        name=self._jsname(config.name, suffix),
                        description=json.dumps({"foundry-aux": config.name}),
                        subjects=[self._subject(config.name, suffix) + ".>"],
                        storage=self._storage,
                        num_replicas=1,
                        **limits,  # type: ignore[arg-type]
                    )
                )
            self._configs[config.name] = config
            return config

        return self._call(run, "create stream")

    async def _upsert_stream(self, config: api.StreamConfig) -> None:
        try:
            await self._js.add_stream(config)
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != 10058:  # stream name already in use with a different configuration
                raise
            await self._js.update_stream(config)

    async def _streams(self, js: Any = None) -> list[str]:
        names: set[str] = set()
        for info in await (js or self._js).streams_info():
            config = info.config
            if not (config.name or "").startswith(self.prefix.upper() + "_"):
                continue
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                meta = json.loads(config.description or "{}")
                if "foundry" in meta:
                    names.add(str(meta["foundry"]))
        return sorted(names)

    def streams(self) -> list[str]:
        return self._call(self._streams, "list streams")

    async def _bounds(self, stream: str, partition: int) -> tuple[int, int]:
        """(first retained offset, last offset) of one partition."""
        state = (await self._js.stream_info(self._jsname(stream, partition))).state
        last = int(state.last_seq)
        first = int(state.first_seq) if state.messages else last + 1
        return max(first, 1), last

    def info(self, stream: str) -> StreamInfo:
        async def run() -> StreamInfo:
            config = await self._config_async(stream)
            bounds = [await self._bounds(stream, p) for p in range(config.partitions)]
            return StreamInfo(
                config=config,
                first=tuple(b[0] for b in bounds),
                last=tuple(b[1] for b in bounds),
                groups=tuple(await self._groups(stream)),
            )

        return self._call(run, "stream info")

    def delete_stream(self, stream: str) -> bool:
        async def run() -> bool:
            found = False
            for key in [k for k in self._parts if k[0] == stream]:
                await self._forget(*key)
            p = 0
            while True:
                try:
                    await self._js.delete_stream(self._jsname(stream, p))
                    found = True
                except nats.js.errors.NotFoundError:
                    break
                p += 1
            for suffix in ("dead", "coord"):
                with contextlib.suppress(nats.js.errors.NotFoundError):
                    await self._js.delete_stream(self._jsname(stream, suffix))
            self._configs.pop(stream, None)
            return found

        return self._call(run, "delete stream")

    # -- producing -------------------------------------------------------------

    def append(self, stream: str, events: Sequence[NewEvent]) -> list[Appended]:
        if not events:
            return []
        return self._call(lambda: self._append(self._js, stream, events), "append", len(events) / 1_000)

    async def aappend(self, stream: str, events: Sequence[NewEvent]) -> list[Appended]:
        """:meth:`append` on the caller's loop, through a connection of that loop's own
        (opened at its first call; closed when the loop shuts its async generators down,
        as ``asyncio.run`` does, or by :meth:`close`). Beyond ``_LOOP_CLIENTS`` loops, the
        call goes through the backend's own connection, awaited without blocking."""
        if not events:
            return []
        if self._closed:
            raise BackendError(f"stream backend {self.shown} is closed. Fix: open a new one")
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return await self._guard(lambda: self._append(self._js, stream, events), "append")
        client = self._clients.get(loop) or self._loop_client(loop)
        if client is None:  # over the bound: the backend's own connection, through its thread
            return await self._hop(
                lambda: self._append(self._js, stream, events), "append", len(events) / 1_000
            )
        return await self._guard(lambda: self._append(client.js, stream, events), "append", client.connect)

    async def _append(self, js: Any, stream: str, events: Sequence[NewEvent]) -> list[Appended]:
        """Append through ``js`` (a client of the running loop)."""
        config = self._configs.get(stream) or await self._config_async(stream, js)
        count = config.partitions
        if len(events) == 1:  # the client's request/reply (bounded by its request timeout)
            event = events[0]
            part = partition_for(event.key, event.id, count)
            one = await js.publish(self._subject(stream, part), event.payload, headers=_headers(event))
            return [Appended(part, int(one.seq), bool(one.duplicate))]
        subjects = [self._subject(stream, p) for p in range(count)]
        parts = [partition_for(e.key, e.id, count) for e in events] if count > 1 else [0] * len(events)
        publish = js.publish_async
        # No wait_stall: a timed wait per message costs a task each (7x slower); the whole
        # batch is bounded here instead (publish_async waits while the client's window of
        # pending acks is full, so the publishing is bounded too).
        async with asyncio.timeout(self._timeout * 2 + len(events) / 2_000):
            futures = [
                await publish(subjects[p], e.payload, headers=_headers(e))
                for e, p in zip(events, parts, strict=True)
            ]
            acks = await _acks(futures)
        return [Appended(p, int(a.seq), bool(a.duplicate)) for p, a in zip(parts, acks, strict=True)]

    def _loop_client(self, loop: asyncio.AbstractEventLoop) -> _LoopClient | None:
        """The client of ``loop`` (made, not yet connected, on first use); ``None`` when
        ``_LOOP_CLIENTS`` other live loops have one."""
        with self._clients_lock:
            if self._closed:
                raise BackendError(f"stream backend {self.shown} is closed. Fix: open a new one")
            client = self._clients.get(loop)
            if client is None:
                for gone in [other for other in self._clients if other.is_closed()]:
                    del self._clients[gone]
                if len(self._clients) >= _LOOP_CLIENTS:
                    return None
                client = self._clients[loop] = _LoopClient(self._open, self._timeout)
            return client

    def enforce_retention(self, stream: str) -> int:
        self._call(lambda: self._config_async(stream), "retention")
        return 0  # JetStream applies max_age / max_msgs / max_bytes itself

    # -- groups ----------------------------------------------------------------

    async def _groups(self, stream: str) -> list[str]:
        infos = await self._js.consumers_info(self._jsname(stream, 0))
        return sorted(i.name for i in infos)

    def groups(self, stream: str) -> list[str]:
        async def run() -> list[str]:
            await self._config_async(stream)
            return await self._groups(stream)

        return self._call(run, "list groups")

    async def _consumer_info(self, stream: str, group: str, partition: int) -> Any:
        try:
            return await self._js.consumer_info(self._jsname(stream, partition), group)
        except nats.js.errors.NotFoundError:
            await self._config_async(stream)
            raise unknown_group(stream, group, await self._groups(stream)) from None

    async def _start_config(
        self, config: StreamConfig, group: str, start: Start, partition: int
    ) -> api.ConsumerConfig | None:
        """The consumer config that starts ``group`` at ``start`` on one partition
        (``None``: this partition is not named by an offset mapping)."""
        first, last = await self._bounds(config.name, partition)
        base: dict[str, Any] = {}
        if start.kind == "beginning":
            base = {"deliver_policy": api.DeliverPolicy.BY_START_SEQUENCE, "opt_start_seq": first}
        elif start.kind == "end":
            base = {"deliver_policy": api.DeliverPolicy.BY_START_SEQUENCE, "opt_start_seq": last + 1}
        elif start.kind == "offset":
            wanted = start.offset_for(partition)
            if wanted is None:
                return None
            if wanted < first:
                raise out_of_range(config.name, group, partition, f"offset {wanted}", first, last)
            base = {
                "deliver_policy": api.DeliverPolicy.BY_START_SEQUENCE,
                "opt_start_seq": min(wanted, last + 1),
            }
        else:
            assert start.time is not None
            if first > 1:
                oldest = await self._js.get_msg(self._jsname(config.name, partition), seq=first)
                if oldest.time is not None and start.time <= oldest.time.timestamp():
                    raise out_of_range(config.name, group, partition, f"time {start.time:.3f}", first, last)
            when = datetime.datetime.fromtimestamp(start.time, datetime.UTC)
            base = {"deliver_policy": api.DeliverPolicy.BY_START_TIME, "opt_start_time": when}
        return api.ConsumerConfig(
            durable_name=group,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=_DEFAULT_ACK_WAIT,
            max_deliver=-1,
            max_ack_pending=_MAX_ACK_PENDING,
            filter_subject=self._subject(config.name, partition),
            replay_policy=api.ReplayPolicy.INSTANT,
            **base,
        )

    def create_group(self, stream: str, group: str, start: Start) -> bool:
        check_name("group", group)

        async def run() -> bool:
            config = await self._config_async(stream)
            if group in await self._groups(stream):
                return False
            configs = [await self._start_config(config, group, start, p) for p in range(config.partitions)]
            for p, consumer in enumerate(configs):
                if consumer is None:
                    consumer = await self._start_config(config, group, Start.beginning(), p)
                await self._js.add_consumer(self._jsname(stream, p), consumer)
            return True

        return self._call(run, "create group")

    def delete_group(self, stream: str, group: str) -> bool:
        async def run() -> bool:
            config = await self._config_async(stream)
            found = False
            for p in range(config.partitions):
                await self._forget(stream, group, p)
                with contextlib.suppress(nats.js.errors.NotFoundError):
                    found = await self._js.delete_consumer(self._jsname(stream, p), group) or found
            return found

        return self._call(run, "delete group")

    def seek(self, stream: str, group: str, start: Start, partitions: Sequence[int] | None = None) -> None:
        async def run() -> None:
            config = await self._config_async(stream)
            chosen = list(range(config.partitions)) if partitions is None else list(partitions)
            old = {}
            for p in chosen:
                check_partition(config, p)
                old[p] = await self._consumer_info(stream, group, p)
            fresh = {p: await self._start_config(config, group, start, p) for p in chosen}
            for p, consumer in fresh.items():
                if consumer is None:
                    continue
                consumer.ack_wait = old[p].config.ack_wait
                await self._forget(stream, group, p)
                await self._js.delete_consumer(self._jsname(stream, p), group)
                await self._js.add_consumer(self._jsname(stream, p), consumer)

        self._call(run, "seek")

    # -- consuming -------------------------------------------------------------

    async def _prepare(self, stream: str, group: str, partition: int, ack_deadline: float) -> _Part:
        config = await self._config_async(stream)
        check_partition(config, partition)
        state = self._state(stream, group, partition)
        if not state.known or state.ack_wait != ack_deadline:
            info = await self._consumer_info(stream, group, partition)
            if abs((info.config.ack_wait or 0) - ack_deadline) > 1e-3:
                info.config.ack_wait = ack_deadline
                await self._js.add_consumer(self._jsname(stream, partition), info.config)
            state.ack_wait = ack_deadline
            if not state.known:
                delivered = int(info.delivered.stream_seq)
                state.hi = delivered
                state.floor = delivered - int(info.num_ack_pending or 0)
                state.held.clear()
                state.out.clear()
                state.redo.clear()
                state.known = True
        if state.sub is None:
            state.sub = await self._js.pull_subscribe_bind(
                durable=group, stream=self._jsname(stream, partition), pending_msgs_limit=_MAX_ACK_PENDING * 2
            )
        return state

    def _read(
        self, stream: str, group: str, partition: int, consumer: str, limit: int, ack: float, timeout: float
    ) -> list[Event]:
        async def run() -> list[Event]:
            state = await self._prepare(stream, group, partition, ack)
            until = time.monotonic() + (timeout if timeout > 0 else 0.0)
            try:
                while True:
                    ready = self._take(state, limit)
                    if ready:
                        return [self._event(stream, partition, m) for m in ready]
                    if state.floor >= state.hi and state.held:
                        return await self._release_held(stream, group, partition, state, limit)
                    remaining = until - time.monotonic()
                    try:
                        msgs = await state.sub.fetch(
                            batch=limit, timeout=min(remaining, 5.0) if remaining > 0.01 else 0.01
                        )
                    except (TimeoutError, nats.errors.TimeoutError):
                        msgs = []
                    self._sort(state, msgs)
                    if not msgs and state.floor < state.hi and state.floor + 1 not in state.redo:
                        await self._pending_lost_to_retention(stream, group, partition, state)
                    if until - time.monotonic() <= 0 and not self._can_hand_out(state):
                        return []
            except BaseException:
                state.known = False  # resynchronise with the server on the next read
                raise

        return self._call(run, "read", timeout=timeout + 5.0)

    def _sort(self, state: _Part, msgs: list[Msg]) -> None:
        """File fetched messages: redeliveries of the pending window ``(floor, hi]`` wait in
        ``redo`` to go out in order; newer ones are held until nothing is pending."""
        for msg in msgs:
            seq = int(msg.metadata.sequence.stream)
            if seq <= state.floor:
                continue  # committed already (a redelivery that raced our commit)
            if seq <= state.hi:
                state.redo[seq] = msg  # the latest delivery of it wins
            else:
                state.held[seq] = msg

    def _can_hand_out(self, state: _Part) -> bool:
        return state.floor + 1 in state.redo or (state.floor >= state.hi and bool(state.held))

    def _take(self, state: _Part, limit: int) -> list[Msg]:
        """The run of redelivered messages that starts right after the committed offset:
        nothing goes out while an earlier pending message has not come back."""
        run: list[Msg] = []
        seq = state.floor + 1
        while seq in state.redo and len(run) < limit:
            msg = state.redo.pop(seq)
            state.out[seq] = msg
            run.append(msg)
            seq += 1
        return run

    async def _release_held(
        self, stream: str, group: str, partition: int, state: _Part, limit: int
    ) -> list[Event]:
        seqs = sorted(state.held)[:limit]
        if seqs[0] > state.hi + 1:
            await self._record_gap(stream, group, partition, state.hi + 1, seqs[0] - 1)
            state.floor = state.hi = seqs[0] - 1
        # Keep the contiguous run only: a missing sequence will arrive (or is a gap next time).
        run = [seqs[0]]
        for seq in seqs[1:]:
            if seq != run[-1] + 1:
                break
            run.append(seq)
        msgs = [state.held.pop(s) for s in run]
        state.hi = run[-1]
        for seq, msg in zip(run, msgs, strict=True):
            state.out[seq] = msg
        return [self._event(stream, partition, m) for m in msgs]

    async def _pending_lost_to_retention(self, stream: str, group: str, partition: int, state: _Part) -> None:
        now = time.monotonic()
        if now - state.checked_retention < 1.0:
            return
        state.checked_retention = now
        first, _ = await self._bounds(stream, partition)
        if first > state.floor + 1:
            lost_to = min(first - 1, state.hi)
            await self._record_gap(stream, group, partition, state.floor + 1, lost_to)
            state.floor = lost_to
            for box in (state.out, state.redo):
                for seq in [s for s in box if s <= lost_to]:
                    del box[seq]

    def _event(self, stream: str, partition: int, msg: Msg) -> Event:
        meta = msg.metadata
        offset = int(meta.sequence.stream)
        deliveries = int(meta.num_delivered)
        try:
            return decode_message(
                stream, partition, offset, msg.headers, msg.data, meta.timestamp.timestamp(), deliveries
            )
        except MalformedEntryError as exc:
            data = msg.data if isinstance(msg.data, bytes) else b""
            return malformed_event(
                stream,
                partition,
                offset,
                f"message {offset} of partition {partition} is not a Foundry event: {exc}",
                deliveries=deliveries,
                payload=data,
            )

    async def _record_gap(self, stream: str, group: str, partition: int, lo: int, hi: int) -> None:
        letter = gap_letter(await self._config_async(stream), group, partition, lo, hi, time.time())
        await self._publish_dead(stream, letter)

    async def _publish_dead(self, stream: str, letter: DeadLetter) -> None:
        record = dead_record(letter, payload=_b64encode)
        await self._js.publish(
            self._subject(stream, "dead") + f".{letter.group}", json.dumps(record).encode()
        )

    async def _commit(self, stream: str, group: str, partition: int, offset: int) -> None:
        state = await self._prepare(
            stream, group, partition, self._state(stream, group, partition).ack_wait or 30.0
        )
        if offset <= state.floor:
            return
        candidates = [s for s in state.out if s <= offset]
        if not candidates:
            raise BackendError(
                f"stream {stream!r} group {group!r} partition {partition}: cannot commit offset {offset}; "
                "this connection was not handed that event. Fix: commit from the reader that read it"
            )
        candidates.sort()
        for seq in candidates[:-1]:  # sent in order on one connection, confirmed by the last
            with contextlib.suppress(nats.errors.MsgAlreadyAckdError):
                await state.out[seq].ack()
        await state.out[candidates[-1]].ack_sync(timeout=self._timeout)
        for seq in candidates:
            del state.out[seq]
        state.floor = max(candidates)
        for seq in [s for s in state.redo if s <= state.floor]:
            del state.redo[seq]

    def commit(self, stream: str, group: str, partition: int, offset: int) -> None:
        self._call(lambda: self._commit(stream, group, partition, offset), "commit")

    def extend(self, stream: str, group: str, partition: int, consumer: str, ack_deadline: float) -> None:
        async def run() -> None:
            state = self._parts.get((stream, group, partition))
            if state is None:
                return
            for msg in list(state.out.values()):
                with contextlib.suppress(nats.errors.MsgAlreadyAckdError):
                    await msg.in_progress()

        self._call(run, "extend")

    def dead_letter(
        self, stream: str, group: str, event: Event, reason: str, error: str | None = None
    ) -> None:
        async def run() -> None:
            await self._publish_dead(stream, event_letter(stream, group, event, reason, error, time.time()))
            await self._commit(stream, group, event.partition, event.offset)

        self._call(run, "dead letter")

    def dead_letters(self, stream: str, group: str | None = None, limit: int = 100) -> list[DeadLetter]:
        async def run() -> list[DeadLetter]:
            await self._config_async(stream)
            name = self._jsname(stream, "dead")
            state = (await self._js.stream_info(name)).state
            out: list[DeadLetter] = []
            seq = int(state.first_seq)
            while seq and seq <= state.last_seq and len(out) < limit:
                try:
                    raw = await self._js.get_msg(name, seq=seq)
                except nats.js.errors.NotFoundError:
                    seq += 1
                    continue
                seq += 1
                letter = dead_from_record(stream, json.loads(raw.data or b"{}"), payload=base64.b64decode)
                if group is None or letter.group == group:
                    out.append(letter)
            return out

        return self._call(run, "dead letters")

    def lag(self, stream: str, group: str) -> list[PartitionLag]:
        async def run() -> list[PartitionLag]:
            config = await self._config_async(stream)
            out = []
            for p in range(config.partitions):
                info = await self._consumer_info(stream, group, p)
                first, last = await self._bounds(stream, p)
                pending = int(info.num_ack_pending or 0)
                out.append(PartitionLag(p, int(info.delivered.stream_seq) - pending, last, first, pending))
            return out

        return self._call(run, "lag")

    # -- coordination ----------------------------------------------------------

    async def _record(self, stream: str, name: str) -> tuple[dict[str, Any], int]:
        try:
            raw = await self._js.get_msg(
                self._jsname(stream, "coord"), subject=self._subject(stream, "coord") + "." + name
            )
        except nats.js.errors.NotFoundError:
            return {}, 0
        return json.loads(raw.data or b"{}"), int(raw.seq or 0)

    async def _swap(self, stream: str, name: str, value: dict[str, Any], last: int) -> bool:
        try:
            await self._js.publish(
                self._subject(stream, "coord") + "." + name,
                json.dumps(value).encode(),
                headers={"Nats-Expected-Last-Subject-Sequence": str(last)},
            )
        except nats.js.errors.APIError as exc:
            if exc.err_code in _CONFLICT_CODES:
                return False
            raise
        return True

    def join(self, stream: str, group: str, consumer: str, ttl: float) -> list[str]:
        async def run() -> list[str]:
            await self._config_async(stream)
            for _ in range(20):
                members, seq = await self._record(stream, f"members.{group}")
                now = time.time()
                live = {c: e for c, e in members.items() if e > now}
                live[consumer] = now + ttl
                if await self._swap(stream, f"members.{group}", live, seq):
                    return sorted(live)
            raise BackendUnavailableError(f"NATS at {self.shown}: join {group!r} kept conflicting; retry")

        return self._call(run, "join")

    def leave(self, stream: str, group: str, consumer: str) -> None:
        async def run() -> None:
            config = await self._config_async(stream)
            for _ in range(20):
                members, seq = await self._record(stream, f"members.{group}")
                members.pop(consumer, None)
                if await self._swap(stream, f"members.{group}", members, seq):
                    break
            for p in range(config.partitions):
                await self._release(stream, group, p, consumer)

        self._call(run, "leave")

    def acquire(self, stream: str, group: str, partition: int, consumer: str, ttl: float) -> bool:
        async def run() -> bool:
            lease, seq = await self._record(stream, f"lease.{group}.{partition}")
            now = time.time()
            owner = lease.get("owner")
            if owner and owner != consumer and float(lease.get("expires", 0)) > now:
                return False
            if not await self._swap(
                stream, f"lease.{group}.{partition}", {"owner": consumer, "expires": now + ttl}, seq
            ):
                return False
            if owner != consumer:
                state = self._parts.get((stream, group, partition))
                if state is not None:
                    state.known = False  # another owner may have moved the window
            return True

        return self._call(run, "acquire")

    async def _release(self, stream: str, group: str, partition: int, consumer: str) -> None:
        lease, seq = await self._record(stream, f"lease.{group}.{partition}")
        if lease.get("owner") == consumer:
            await self._swap(stream, f"lease.{group}.{partition}", {"owner": "", "expires": 0}, seq)

    def release(self, stream: str, group: str, partition: int, consumer: str) -> None:
        self._call(lambda: self._release(stream, group, partition, consumer), "release")

    def close(self) -> None:
        with self._clients_lock:  # closed first: no loop makes a client of its own from now on
            if self._closed:
                return
            self._closed = True
            clients, self._clients = self._clients, {}
        for loop, client in clients.items():
            client.close(loop)

        async def shutdown() -> None:
            for key in list(self._parts):
                await self._forget(*key)
            if self._nc is not None and not self._nc.is_closed:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._nc.close(), self._timeout)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(self._timeout * 2)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(self._timeout)
        if not self._loop.is_running():
            self._loop.close()
