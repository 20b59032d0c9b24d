"""The RabbitMQ side of the AMQP queue: one connection driven by a private event-loop
thread (aiormq, the AMQP core of aio-pika), used from ordinary threads.

* **Publishing** never waits on the network: a message goes into an outbox that one
  task drains onto a channel in publisher-confirm mode — woken once per batch, not per
  message, and while earlier messages await confirmation it lets up to 4 ms of
  publishes gather into one batch (``_GATHER``); due jobs of one queue and priority in
  a batch share a message (``_pack``); the batch is framed here and written in one
  socket write (``_publish_framed``), at most ``_WINDOW`` messages unconfirmed. A
  message leaves the outbox's accounting only when the broker confirmed it; a nack or
  a dropped connection puts it back and it is sent again (duplicates are harmless: the
  state store decides). The outbox is bounded: a publisher blocks when it is full and
  gives up with :class:`~foundry.errors.BackendUnavailableError` after ``reconnect``
  seconds.
* **Consuming** is push: one channel per queue with ``basic.qos(prefetch)`` and
  ``basic.consume``; deliveries land in a buffer that ``take`` hands to the claimer.
  A consumer nobody has used for ``linger`` seconds closes its channel, which returns
  its buffered, unacknowledged messages to the queue for other workers.
* **Reconnecting**: when the connection drops (broker restart, network), the buffers of
  the dead channels are discarded (RabbitMQ redelivers those messages), the connection
  is reopened with back-off, consumers that are in use resubscribe, and the outbox is
  sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Coroutine, Iterator
from typing import Any, NamedTuple, TypeVar

import aiormq
from aiormq.abc import ChannelFrame, DeliveredMessage
from pamqp import commands as spec

from foundry.backends._records import Fields
from foundry.errors import BackendError, BackendUnavailableError, ConfigError, MalformedRecordError

__all__ = ["AmqpClient", "Consumer", "Delivery", "parse_body"]

log = logging.getLogger("foundry.queue.amqp")

T = TypeVar("T")

MAX_PENDING = 50_000  # messages published but not yet confirmed, per process
# Unconfirmed publishes in flight at once: aiormq walks every pending confirmation on each
# "multiple" ack the broker sends, so an unbounded window costs O(n²).
_WINDOW = 512
# Seconds a busy publisher (earlier messages still unconfirmed) waits for company before
# a write, unless a full pack is already there: at a few thousand submits/s this makes
# batches of ~_PACK jobs, which share messages — half the broker's CPU per job and a
# third of this thread's (bench/queues.py) — for at most this much publish delay under
# load. An idle client (nothing unconfirmed) sends at once.
_GATHER = 0.004
_PACK = 16  # most jobs carried by one message
_MAX_BODY = 64 * 1024  # longer than any message Foundry publishes (16 lines of at most ~300 bytes)
_DECLARE_RETRY = 5.0  # longest pause before a queue whose declaration failed is tried again

Outgoing = tuple[str, bytes, int, int]  # (queue, body, broker priority, jobs in the body)
_REDECLARE = 30.0  # seconds after which a publish declares its queue again (x-expires)


class Message:
    """One AMQP delivery, which may carry several jobs (see :meth:`AmqpClient._pump`):
    it is acknowledged once every job in it is settled."""

    __slots__ = ("channel", "left", "nacked", "tag")

    def __init__(self, channel: Any, tag: int, jobs: int) -> None:
        self.channel = channel  # the aiormq channel it arrived on: the ack must go there
        self.tag = tag
        self.left = jobs
        self.nacked = False


class Delivery(NamedTuple):
    job_id: str
    priority: int
    eta: float | None
    message: Message


class Consumer:
    """The deliveries of one queue waiting for a claimer (see :meth:`take`)."""

    def __init__(self, client: AmqpClient, queue: str) -> None:
        self.client = client
        self.queue = queue
        self.cond = threading.Condition()
        self.buf: deque[Delivery] = deque()
        self.channel: Any = None  # set and cleared by the loop thread
        self.prefetch = 0
        self.active = 0  # claims in progress (between take and ack)
        self.last_use = time.monotonic()
        self.recent = 0.0  # when the broker was last asked for more (subscribe, qos, ack)
        self.busy = True  # the last take found more than one delivery: a backlog is flowing
        self.kicks = 0
        self.subscribing: asyncio.Lock | None = None  # one subscription at a time (loop thread)

    def kick(self) -> None:
        """Wake the claimers waiting in :meth:`take` empty-handed (a worker stopping)."""
        with self.cond:
            self.kicks += 1
            self.cond.notify_all()

    async def on_message(self, message: DeliveredMessage) -> None:
        if message.channel is not self.channel:
            # An old channel's delivery: a closed one's the broker gives back by itself;
            # one still open would pin what it holds for as long as it lives — close it.
            if not message.channel.is_closed:
                self.client._spawn_now(_close_quietly(message.channel))
            return
        try:
            jobs = parse_body(message.body, self.queue)
        except MalformedRecordError as exc:
            # Not Foundry's: it must not pin a prefetch slot. Kept, with the reason, aside.
            await self.client.reject_foreign(self.queue, message, str(exc))
            return
        record = Message(message.channel, int(message.delivery_tag or 0), len(jobs))
        deliveries = [Delivery(job_id, priority, eta, record) for job_id, priority, eta in jobs]
        with self.cond:
            self.buf.extend(deliveries)
            self.cond.notify()

    @contextlib.contextmanager
    def using(self) -> Iterator[None]:
        with self.cond:
            self.active += 1
        try:
            yield
        finally:
            with self.cond:
                self.active -= 1
                self.last_use = time.monotonic()

    def take(self, limit: int, timeout: float, kicks: int) -> list[Delivery]:
        """Up to ``limit`` deliveries, waiting up to ``timeout`` s for the first. Right
        after the broker was asked for more, while a backlog is flowing, wait a moment
        (until 2 ms pass without a new delivery) so one claim gets the whole batch the
        broker is pushing; a lone delivery to an idle queue goes at once. Returns
        empty-handed once :meth:`kick` moved ``kicks`` on."""
        if time.monotonic() - self.recent < 0.005:
            timeout = max(timeout, 0.02)  # just subscribed: the broker is pushing the backlog
        end = time.monotonic() + timeout
        with self.cond:
            while not self.buf:
                left = end - time.monotonic()
                if left <= 0 or self.client.stopped.is_set() or self.kicks != kicks:
                    return []
                self.cond.wait(left)
            if len(self.buf) < limit and self.busy and time.monotonic() - self.recent < 0.02:
                stop = time.monotonic() + 0.02
                while len(self.buf) < limit and time.monotonic() < stop:
                    n = len(self.buf)
                    self.cond.wait(0.002)
                    if len(self.buf) == n:
                        break
            self.busy = len(self.buf) > 1
            return [self.buf.popleft() for _ in range(min(limit, len(self.buf)))]

    def _drop_buffer(self) -> None:
        with self.cond:
            self.buf.clear()
            self.cond.notify_all()


def parse_body(body: Any, queue: str = "?") -> list[tuple[str, int, float | None]]:
    """The jobs a message carries, ``(job id, priority, eta)``: lines of ``<job id>
    <priority> <eta or ->``, at most ``_PACK`` of them (see ``AmqpQueue._announce``).
    Anything else — not UTF-8, another format, too long — raises
    :class:`~foundry.errors.MalformedRecordError`, and nothing else is raised."""
    where = f"a message on RabbitMQ queue {queue}"
    if not isinstance(body, bytes | bytearray | memoryview):
        raise MalformedRecordError(where, "body", type(body).__name__, "is not bytes")
    data = bytes(body)
    if len(data) > _MAX_BODY:
        raise MalformedRecordError(
            where, "body", f"{len(data)} bytes", "is longer than any message Foundry sends"
        )
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise MalformedRecordError(where, "body", data[:40], "is not UTF-8 text") from None
    lines = text.split("\n")
    if len(lines) > _PACK:
        raise MalformedRecordError(where, "body", f"{len(lines)} lines", f"carries more than {_PACK} jobs")
    jobs: list[tuple[str, int, float | None]] = []
    for line in lines:
        parts = line.rsplit(" ", 2)
        if len(parts) != 3:
            raise MalformedRecordError(where, "line", line, "is not '<job id> <priority> <eta or ->'")
        job_id, priority, eta = parts
        f = Fields(where)
        f.name("job id", job_id)
        jobs.append(
            (
                job_id,
                f.integer("priority", priority, low=-(2**31 - 1)),
                None if eta == "-" else f.number("eta", eta),
            )
        )
    return jobs


def _shortstr(text: str) -> bytes:
    data = text.encode()
    return bytes([len(data)]) + data


@functools.lru_cache(maxsize=4096)
def _method_frame(channel: int, queue: str) -> bytes:
    """``basic.publish`` to the default exchange with routing key ``queue``, mandatory:
    a message no queue takes is returned, not confirmed and dropped (see _publish_framed)."""
    payload = struct.pack(">HHH", 60, 40, 0) + _shortstr("") + _shortstr(queue) + b"\x01"
    return struct.pack(">BHI", 1, channel, len(payload)) + payload + b"\xce"


def _framing_supported(ch: Any) -> bool:
    return all(
        hasattr(ch, a)
        for a in ("confirmations", "delivery_tag", "write_queue", "lock", "number", "message_id_delivery_tag")
    )


async def _close_quietly(channel: Any) -> None:
    with contextlib.suppress(Exception):
        await channel.close()


def _forget_id(ids: dict[str, int], message_id: str, tag: int, _: object) -> None:
    if ids.get(message_id) == tag:
        del ids[message_id]


def _pack(items: list[Outgoing]) -> list[Outgoing]:
    """Merge consecutive due jobs for the same queue and priority into one message
    (at most ``_PACK`` jobs): a burst of submissions costs the broker and every
    consumer one delivery per message, not per job. Delayed jobs travel alone."""
    out: list[Outgoing] = []
    for item in items:
        queue, body, priority, count = item
        if out and body.endswith(b" -"):
            q, b, p, c = out[-1]
            if q == queue and p == priority and c + count <= _PACK and b.endswith(b" -"):
                out[-1] = (q, b + b"\n" + body, p, c + count)
                continue
        out.append(item)
    return out


async def _publish_framed(ch: Any, batch: list[Outgoing]) -> list[asyncio.Future[Any]]:
    """Publish ``batch`` on ``ch`` (confirm mode) as one socket write: Foundry frames the
    three AMQP frames of each message itself (method, content header with
    ``delivery_mode=2``, ``priority`` and a ``message_id``, body) and registers each
    delivery tag's confirmation the way aiormq does; aiormq resolves them when the broker
    acks.

    Every message is *mandatory*: RabbitMQ confirms a message that no queue took (the
    queue was deleted under the publisher) with an ordinary ack, so without the flag
    such a job's message would be dropped while its publisher counts it as delivered,
    and the job would wait for the ``orphan_after`` sweep. Returned, aiormq finds the
    confirmation by the message id and fails it (``PublishError``); the message goes
    back to the outbox and its queue is declared again first."""
    n = ch.number
    futures: list[asyncio.Future[Any]] = []
    parts: list[bytes] = []
    ids = ch.message_id_delivery_tag
    async with ch.lock:
        for queue, body, priority, _ in batch:
            ch.delivery_tag += 1
            tag = ch.delivery_tag
            future = ch.create_future()
            ch.confirmations[tag] = future
            message_id = f"f{tag}"
            ids[message_id] = tag
            future.add_done_callback(functools.partial(_forget_id, ids, message_id, tag))
            futures.append(future)
            header = (
                struct.pack(">HHQHBB", 60, 0, len(body), 0x1880, 2, priority)
                + bytes([len(message_id)])
                + message_id.encode()
            )
            parts.append(_method_frame(n, queue))
            parts.append(struct.pack(">BHI", 2, n, len(header)) + header + b"\xce")
            parts.append(struct.pack(">BHI", 3, n, len(body)) + body + b"\xce")
        await ch.write_queue.put(ChannelFrame(payload=b"".join(parts), should_close=False))
    return futures


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is an optional extra
        return asyncio.new_event_loop()


class AmqpClient:
    """One RabbitMQ connection for one :class:`~foundry.backends.queue.amqp.AmqpQueue`."""

    def __init__(self, url: str, *, shown: str, reconnect: float, linger: float) -> None:
        self._url = url  # to connect with
        self.shown = shown  # the URL with its password masked
        self.reconnect = reconnect
        self.linger = linger
        self.stopped = threading.Event()  # close() began
        self._args: dict[str, dict[str, Any]] = {}  # queue -> declare arguments
        self._declared: dict[str, float] = {}  # on the current connection: queue -> when
        self._consumers: dict[str, Consumer] = {}
        self._settle_lock = threading.Lock()
        self._outbox: deque[Outgoing] = deque()
        self._pending = 0  # published and not yet confirmed (outbox + in flight)
        self._inflight = 0  # sent and not yet confirmed
        self._room = threading.Condition()
        self._kicked = False
        self._up = threading.Event()
        self._conn: Any = None
        self._pub: Any = None
        self._admin: Any = None
        self._declarer: Any = None  # the publisher's channel for declarations (see _try_declare)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._parked: dict[str, list[Outgoing]] = {}  # queue -> messages waiting for its declaration
        self._declare_pause: dict[str, float] = {}  # queue -> the next back-off of its declaration
        self.failure: BaseException | None = None  # a task of the loop died: this client is unusable
        self.loop = _new_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="foundry-amqp", daemon=True)
        self._thread.start()
        self._kick = self.run(self._make_event(), 5.0)
        try:
            self.run(self._connect(), reconnect)
        except BaseException:
            self._stop_loop()
            raise
        self._spawn(self._supervise())
        self._spawn(self._pump())
        self._spawn(self._linger_loop())

    # -- calling into the loop -----------------------------------------------------

    @staticmethod
    async def _make_event() -> asyncio.Event:
        return asyncio.Event()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run one of the client's lasting tasks (publisher, supervisor, linger): one that
        ends by an exception before ``close()`` leaves the client unusable, so it is
        recorded in ``failure`` (a worker checks it and exits) rather than lost."""

        def start() -> None:
            task = self.loop.create_task(coro)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            task.add_done_callback(self._watch_task)

        self.loop.call_soon_threadsafe(start)

    def _watch_task(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or self.stopped.is_set() or task.exception() is None:
            return
        exc = task.exception()
        name = getattr(task.get_coro(), "__name__", "a task")
        self.failure = BackendError(
            f"queue {self.shown}: the RabbitMQ client's {name.strip('_')} task failed "
            f"({type(exc).__name__}: {exc}); this process can no longer publish or reconnect. "
            "Fix: a bug in Foundry, report it with the traceback logged above; restart the process"
        )
        log.critical("%s", self.failure, exc_info=exc)
        with self._room:
            self._room.notify_all()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the loop and wait at most ``timeout`` s for it."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError as exc:
            future.cancel()
            raise BackendUnavailableError(
                f"queue {self.shown}: RabbitMQ did not answer within {timeout:g}s. Fix: check that the "
                "broker is running and reachable; accepted jobs are safe in the state store"
            ) from exc
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            raise ConfigError(
                f"queue {self.shown}: RabbitMQ refused a queue declaration ({exc}); a queue of that name "
                "exists with other arguments (e.g. another max_priority). Fix: use the same options "
                "everywhere, or another prefix"
            ) from exc
        except (aiormq.exceptions.AuthenticationError, aiormq.exceptions.ProbableAuthenticationError) as exc:
            raise ConfigError(
                f"queue URL {self.shown!r}: RabbitMQ refused the login ({exc}). Fix: correct the user, "
                "password or vhost in the URL"
            ) from exc
        except (aiormq.exceptions.AMQPConnectionError, OSError) as exc:
            raise BackendUnavailableError(
                f"queue {self.shown}: RabbitMQ unreachable ({type(exc).__name__}: {exc}). Fix: start the "
                "broker or correct the URL"
            ) from exc
        except aiormq.exceptions.AMQPError as exc:
            raise BackendError(f"queue {self.shown}: RabbitMQ failed ({type(exc).__name__}: {exc})") from exc

    # -- connection ------------------------------------------------------------------

    async def _connect(self) -> None:
        conn = await asyncio.wait_for(aiormq.connect(self._url), timeout=10.0)
        try:
            self._pub = await conn.channel(publisher_confirms=True)
            self._admin = await conn.channel(publisher_confirms=False)
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        self._declared.clear()
        self._up.set()

    async def _supervise(self) -> None:
        while not self.stopped.is_set():
            conn = self._conn
            with contextlib.suppress(BaseException):
                await conn.closing
            if self.stopped.is_set():
                return
            log.warning("queue %s: connection to RabbitMQ lost; reconnecting", self.shown)
            self._up.clear()
            for consumer in self._consumers.values():
                consumer.channel = None
                consumer._drop_buffer()
            pause = 0.1
            while not self.stopped.is_set():
                try:
                    await self._connect()
                    break
                except Exception as exc:
                    log.debug("queue %s: reconnect failed (%r)", self.shown, exc)
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, 2.0)
            if self.stopped.is_set():
                return
            log.warning("queue %s: reconnected to RabbitMQ", self.shown)
            for consumer in list(self._consumers.values()):
                if consumer.active and consumer.prefetch:
                    with contextlib.suppress(Exception):
                        await self._subscribe(consumer, consumer.prefetch)
            self._kick.set()

    def wait_up(self) -> None:
        if self.failure is not None:
            raise self.failure
        if not self._up.wait(self.reconnect):
            raise BackendUnavailableError(
                f"queue {self.shown}: RabbitMQ unreachable for {self.reconnect:g}s. Fix: start the broker or "
                "correct the URL; accepted jobs are safe in the state store and will be delivered"
            )

    async def _admin_channel(self) -> Any:
        if self._admin is None or self._admin.is_closed:
            self._admin = await self._conn.channel(publisher_confirms=False)
        return self._admin

    # -- queues ------------------------------------------------------------------------

    def define(self, queue: str, arguments: dict[str, Any]) -> None:
        """How ``queue`` is declared when it is first used on a connection."""
        self._args[queue] = arguments

    def defined(self) -> list[str]:
        """Every queue this client was told how to declare."""
        return list(self._args)

    async def _declare(self, queue: str, channel: Any = None) -> None:
        ch = channel or await self._admin_channel()
        await ch.queue_declare(queue, durable=True, arguments=self._args.get(queue, {}))
        self._declared[queue] = time.monotonic()

    def message_count(self, queue: str) -> int:
        """Messages ready in ``queue`` (not counting those delivered and unacknowledged)."""

        async def count() -> int:
            ch = await self._admin_channel()
            ok = await ch.queue_declare(queue, durable=True, arguments=self._args.get(queue, {}))
            self._declared[queue] = time.monotonic()
            return int(ok.message_count or 0)

        self.wait_up()
        return self.run(count(), self.reconnect)

    def delete(self, queues: list[str]) -> None:
        """Delete ``queues`` (this client's consumers stop first)."""

        async def delete() -> None:
            for consumer in list(self._consumers.values()):
                await self._unsubscribe(consumer)
            for queue in queues:
                ch = await self._admin_channel()
                try:
                    await ch.queue_delete(queue)
                except aiormq.exceptions.ChannelClosed:
                    continue
                self._declared.pop(queue, None)

        self.wait_up()
        self.run(delete(), self.reconnect)

    # -- publishing ----------------------------------------------------------------------

    def publish(self, queue: str, body: bytes, priority: int) -> None:
        """Queue a persistent message for ``queue``; returns at once (see the module doc)."""
        if self.failure is not None:
            raise self.failure
        with self._room:
            if self._pending >= MAX_PENDING and not self._room.wait_for(
                lambda: self._pending < MAX_PENDING or self.stopped.is_set(), self.reconnect
            ):
                raise BackendUnavailableError(
                    f"queue {self.shown}: {self._pending} messages wait for RabbitMQ's confirmation. "
                    "Fix: check the broker (a memory or disk alarm blocks publishers); the jobs are safe "
                    "in the state store and will be delivered"
                )
            self._pending += 1
        self._outbox.append((queue, body, priority, 1))
        if not self._kicked:
            self._kicked = True
            self.loop.call_soon_threadsafe(self._wake_pump)

    def _wake_pump(self) -> None:
        self._kick.set()

    def _done(self, n: int = 1) -> None:
        with self._room:
            self._pending -= n
            self._room.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait until every published message is confirmed (``False`` on timeout)."""
        with self._room:
            return self._room.wait_for(lambda: self._pending <= 0, timeout)

    async def _pump(self) -> None:
        """Drain the outbox. Publishers wake this task only when it is idle
        (``_kicked`` is cleared just before it goes back to sleep), so a stream of
        publishes costs one wake-up per batch, not one per message."""
        while not self.stopped.is_set():
            if not self._outbox:
                self._kicked = False
                if not self._outbox:  # nothing slipped in before the flag was cleared
                    await self._kick.wait()
            self._kick.clear()
            self._kicked = True
            if self._inflight and len(self._outbox) < _PACK:
                # a stream of publishes: let a few more join this batch (one socket
                # write, and shared messages, for all of them); see _GATHER
                await asyncio.sleep(_GATHER)
            while self._outbox and not self.stopped.is_set():
                ch = self._pub
                if ch is None or ch.is_closed or not self._up.is_set():
                    break  # the supervisor kicks again once reconnected
                room = _WINDOW - self._inflight
                if room <= 0:
                    break  # a confirmation kicks again
                batch = _pack([self._outbox.popleft() for _ in range(min(room, len(self._outbox)))])
                refused = set()
                for queue in {q for q, _, _, _ in batch}:
                    declared = self._declared.get(queue)
                    stale = declared is None or time.monotonic() - declared > _REDECLARE
                    # a queue whose declaration failed waits for its own retry (see _try_declare)
                    if queue in self._parked or (stale and not await self._try_declare(queue)):
                        refused.add(queue)
                if refused:
                    # Only the messages of a queue that cannot be declared wait (and retry on
                    # their own back-off): the rest of the batch goes now.
                    for item in batch:
                        if item[0] in refused:
                            self._parked.setdefault(item[0], []).append(item)
                    batch = [item for item in batch if item[0] not in refused]
                    if not batch:
                        continue
                self._inflight += len(batch)
                task = asyncio.ensure_future(self._send(ch, batch))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            if self._outbox and not self.stopped.is_set():
                # no channel yet, or the confirm window is full: the supervisor (once
                # reconnected) or a confirmation kicks again
                await self._kick.wait()

    async def _try_declare(self, queue: str) -> bool:
        """Declare ``queue`` for publishing, on a channel of the publisher's own (a refused
        declaration closes its channel: nobody else's call breaks with it); on failure
        park its messages and try again after a back-off of its own (doubling up to
        ``_DECLARE_RETRY`` s)."""
        try:
            if self._declarer is None or self._declarer.is_closed:
                self._declarer = await self._conn.channel(publisher_confirms=False)
            await self._declare(queue, self._declarer)
        except Exception as exc:
            pause = self._declare_pause.get(queue, 0.2)
            self._declare_pause[queue] = min(pause * 2, _DECLARE_RETRY)
            log.warning(
                "queue %s: RabbitMQ refused to declare queue %r (%s: %s); its messages wait (the jobs are "
                "safe in the state store) and the declaration is tried again in %.1fs",
                self.shown,
                queue,
                type(exc).__name__,
                exc,
                pause,
            )
            self.loop.call_later(pause, self._unpark, queue)
            return False
        self._declare_pause.pop(queue, None)
        return True

    def _unpark(self, queue: str) -> None:
        """Back to the outbox: the messages parked by a failed declaration of ``queue``."""
        items = self._parked.pop(queue, [])
        if items:
            self._outbox.extend(items)
            self._kick.set()

    async def reject_foreign(self, queue: str, message: DeliveredMessage, reason: str) -> None:
        """A message on ``queue`` that Foundry did not write: copy it, with the reason in
        its ``x-foundry-reason`` header, to ``<queue>.rejected`` (durable; inspect it with
        the RabbitMQ tools), then acknowledge it so it frees its prefetch slot. If the copy
        cannot be made, give it back after a pause (it is never dropped)."""
        rejected = f"{queue}.rejected"
        log.warning("queue %s: %s; moved to RabbitMQ queue %r", self.shown, reason, rejected)
        tag = int(message.delivery_tag or 0)
        ok = False
        try:
            ch = await self._admin_channel()
            await ch.queue_declare(rejected, durable=True)
            headers: dict[str, Any] = {"x-foundry-reason": reason[:2000], "x-foundry-queue": queue}
            props = spec.Basic.Properties(delivery_mode=2, headers=headers)
            confirm = await self._pub.basic_publish(
                bytes(message.body), routing_key=rejected, properties=props
            )
            ok = isinstance(confirm, spec.Basic.Ack)
        except Exception as exc:
            log.warning("queue %s: could not set aside a foreign message (%r); it goes back", self.shown, exc)
        channel = message.channel
        if channel.is_closed:
            return
        with contextlib.suppress(Exception):
            if ok:
                await channel.basic_ack(tag)
            else:
                await asyncio.sleep(1.0)  # do not spin on a broker that refuses the copy
                await channel.basic_nack(tag, requeue=True)

    async def _send(self, ch: Any, batch: list[Outgoing]) -> None:
        """Publish ``batch`` and wait for the broker's confirmations; what is not
        confirmed goes back to the outbox."""
        try:
            if _framing_supported(ch):
                confirmations = await _publish_framed(ch, batch)
            else:  # pragma: no cover - another aiormq: one publish at a time
                confirmations = [self._publish_one(ch, item) for item in batch]
            results = await asyncio.gather(*confirmations, return_exceptions=True)
        except Exception as exc:
            results = [exc] * len(batch)
        self._inflight -= len(batch)
        failed = [item for item, r in zip(batch, results, strict=True) if not isinstance(r, spec.Basic.Ack)]
        self._done(sum(item[3] for item in batch) - sum(item[3] for item in failed))
        for item, r in zip(batch, results, strict=True):
            if isinstance(r, aiormq.exceptions.PublishError):  # returned: no queue took it
                self._declared.pop(item[0], None)  # declare it again before the next try
        if failed:
            if not self.stopped.is_set() and not ch.is_closed:
                await asyncio.sleep(0.05)  # nacked by a live broker: do not spin
            self._outbox.extend(failed)
        self._kick.set()

    def _publish_one(self, ch: Any, item: Outgoing) -> Any:
        queue, body, priority, _ = item
        props = spec.Basic.Properties(delivery_mode=2, priority=priority)
        return asyncio.ensure_future(
            ch.basic_publish(body, routing_key=queue, properties=props, mandatory=True)
        )

    # -- consuming -------------------------------------------------------------------

    def consumer(self, queue: str) -> Consumer:
        consumer = self._consumers.get(queue)
        if consumer is None:
            consumer = self._consumers.setdefault(queue, Consumer(self, queue))
        return consumer

    def ensure_consuming(self, consumer: Consumer, prefetch: int) -> None:
        """Subscribe ``consumer`` (or raise its prefetch) before a claim waits on it."""
        ch = consumer.channel
        if ch is not None and not ch.is_closed and consumer.prefetch >= prefetch:
            return
        self.wait_up()
        self.run(self._subscribe(consumer, max(prefetch, consumer.prefetch)), self.reconnect)

    async def _subscribe(self, consumer: Consumer, prefetch: int) -> None:
        """Subscribe ``consumer`` (or raise its prefetch): one call at a time per consumer,
        since the supervisor's resubscription after a reconnect and a claimer's
        ``ensure_consuming`` meet here, and two channels consuming for one buffer would
        leave one of them holding its prefetched messages unseen."""
        if consumer.subscribing is None:
            consumer.subscribing = asyncio.Lock()
        async with consumer.subscribing:
            await self._subscribe_now(consumer, prefetch)

    async def _subscribe_now(self, consumer: Consumer, prefetch: int) -> None:
        ch = consumer.channel
        if ch is not None and not ch.is_closed:
            if consumer.prefetch < prefetch:
                await ch.basic_qos(prefetch_count=prefetch, global_=True)
                consumer.prefetch = prefetch
                consumer.recent = time.monotonic()
            return
        ch = await self._conn.channel(publisher_confirms=False)
        try:
            await ch.basic_qos(prefetch_count=prefetch, global_=True)
            await self._declare(consumer.queue, ch)
            consumer.channel = ch
            consumer.prefetch = prefetch
            consumer.recent = time.monotonic()
            await ch.basic_consume(consumer.queue, consumer.on_message, no_ack=False)
        except BaseException:
            consumer.channel = None
            with contextlib.suppress(Exception):
                await ch.close()
            raise

    async def _unsubscribe(self, consumer: Consumer, *, idle_for: float | None = None) -> None:
        """Close ``consumer``'s channel (the broker requeues what it held); with
        ``idle_for``, only if no claim is using it and none ended that recently —
        decided under the consumer's lock, so a claim starting now resubscribes."""
        with consumer.cond:
            if idle_for is not None and (consumer.active or time.monotonic() - consumer.last_use <= idle_for):
                return
            ch, consumer.channel = consumer.channel, None
            consumer.prefetch = 0
            consumer.buf.clear()
            consumer.cond.notify_all()
        if ch is not None and not ch.is_closed:
            with contextlib.suppress(Exception):
                await ch.close()

    async def _linger_loop(self) -> None:
        while not self.stopped.is_set():
            await asyncio.sleep(0.25)
            for consumer in list(self._consumers.values()):
                if consumer.channel is not None:
                    await self._unsubscribe(consumer, idle_for=self.linger)

    def settle(self, deliveries: list[Delivery], *, ack: bool) -> None:
        """Acknowledge (or give back, ``ack=False``) deliveries: a message is acked when
        its last job is settled, given back whole at the first give-back (its other jobs
        come again and are skipped by the store). Stale ones are skipped: their channel
        closed, so the broker already took them back."""
        if not deliveries:
            return
        now = time.monotonic()
        for consumer in self._consumers.values():
            if consumer.channel is deliveries[0].message.channel:
                consumer.recent = now
        done: list[Message] = []
        with self._settle_lock:
            for d in deliveries:
                m = d.message
                if m.nacked or m.left <= 0:
                    continue
                if ack:
                    m.left -= 1
                    if m.left == 0:
                        done.append(m)
                else:
                    m.nacked = True
                    done.append(m)
        if not done:
            return

        async def settle() -> None:
            for m in done:
                if m.channel.is_closed:
                    continue
                with contextlib.suppress(Exception):
                    if ack:
                        await m.channel.basic_ack(m.tag, wait=False)
                    else:
                        await m.channel.basic_nack(m.tag, requeue=True, wait=False)

        self.loop.call_soon_threadsafe(lambda: self._spawn_now(settle()))

    def _spawn_now(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- closing -----------------------------------------------------------------------

    def kick_consumers(self) -> None:
        """Wake every claimer waiting on one of this client's consumers (a worker stops)."""
        for consumer in list(self._consumers.values()):
            consumer.kick()

    def close(self, flush: float = 5.0) -> None:
        if self.stopped.is_set():
            return
        if self._up.is_set():
            self.flush(flush)
        self.stopped.set()
        with self._room:
            self._room.notify_all()
        for consumer in self._consumers.values():
            consumer._drop_buffer()

        async def shutdown() -> None:
            for consumer in list(self._consumers.values()):
                await self._unsubscribe(consumer)
            self._kick.set()
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    await self._conn.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            self.run(shutdown(), 10.0)
        self._stop_loop()

    def _stop_loop(self) -> None:
        self.stopped.set()
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10.0)
        if not self.loop.is_running():
            self.loop.close()
