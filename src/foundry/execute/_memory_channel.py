"""Bounded memory channels with trio's close semantics, usable from threads and loops.

``open_channel(capacity)`` returns a ``(SendChannel, ReceiveChannel)`` pair over one
bounded buffer. Both ends work from plain threads (``send``/``receive``) and from any
asyncio loop (``asend``/``areceive``), at the same time: a thread may feed a channel
that a task on a loop drains.

Contract (trio's memory channels, ``trio.open_memory_channel``):

- ``clone()`` makes another handle on the same end; an end is open while any of its
  clones is open.
- Using a clone after *you* closed it raises :class:`~foundry.errors.ChannelClosedError`;
  a task blocked on a clone when another task closes that clone gets the same error.
- When the last send clone closes, receivers get every buffered item and *then*
  :class:`~foundry.errors.EndOfChannel`. Iterating a receive end (``for``/``async for``)
  stops there.
- When the last receive clone closes, every send raises
  :class:`~foundry.errors.BrokenChannelError`. The items still buffered are *returned*
  by that ``close()`` call (trio drops them; Foundry hands them back so that an accepted
  item is never silently lost).
- A full buffer is backpressure: ``send`` blocks up to ``timeout`` and then raises
  :class:`~foundry.errors.ChannelFullError` (the item was not accepted). The capacity
  is at least 1: every intake is bounded, and there is no unbounded mode.

Metrics (when a registry is given, labelled by the channel's name): the buffer fill
(0..1) and the number of blocked senders as gauges; the depth and the age of the oldest
buffered item as gauges computed when the registry is read.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from types import EllipsisType
from typing import Any, Generic, Self, TypeVar

from foundry.errors import (
    BrokenChannelError,
    ChannelClosedError,
    ChannelEmptyError,
    ChannelFullError,
    EndOfChannel,
)
from foundry.observe import names
from foundry.observe.metrics import Gauge, Registry

__all__ = ["ChannelStats", "ReceiveChannel", "SendChannel", "open_channel"]

T = TypeVar("T")
log = logging.getLogger("foundry.channels")

DEFAULT_SEND_TIMEOUT = 60.0
_counter = 0
_counter_lock = threading.Lock()


def _next_name() -> str:
    global _counter
    with _counter_lock:
        _counter += 1
        return f"channel-{_counter}"


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Waiter:
    """One blocked sender or receiver: a thread (a lock acquired at birth, released by
    ``wake``) or a task (a future on its loop, resolved thread-safely)."""

    __slots__ = ("_future", "_lock", "_loop", "_thread", "woken")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.woken = False
        self._loop = loop
        self._thread = threading.get_ident()
        if loop is None:
            self._lock: threading.Lock | None = threading.Lock()
            self._lock.acquire()
            self._future: asyncio.Future[None] | None = None
        else:
            self._lock = None
            self._future = loop.create_future()

    def wake(self) -> None:
        """Called with the channel lock held; each waiter is woken at most once."""
        self.woken = True
        if self._lock is not None:
            self._lock.release()
            return
        assert self._future is not None
        assert self._loop is not None
        if threading.get_ident() == self._thread:
            _resolve(self._future)
        else:
            try:
                self._loop.call_soon_threadsafe(_resolve, self._future)
            except RuntimeError:  # the waiter's loop is closed: nobody is waiting any more
                pass

    def wait(self, deadline: float | None) -> None:
        assert self._lock is not None
        if deadline is None:
            self._lock.acquire()
        else:
            remaining = deadline - time.monotonic()
            if remaining > 0:
                self._lock.acquire(timeout=remaining)

    async def wait_async(self, deadline: float | None) -> None:
        assert self._future is not None
        assert self._loop is not None
        if deadline is None:
            await self._future
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        timer = self._loop.call_later(remaining, _resolve, self._future)
        try:
            await self._future
        finally:
            timer.cancel()


@dataclass(frozen=True, slots=True)
class ChannelStats:
    """A snapshot of one channel (trio's ``statistics()``)."""

    name: str
    capacity: int
    buffered: int
    open_send_channels: int
    open_receive_channels: int
    blocked_senders: int
    waiting_receivers: int
    sent: int
    received: int
    oldest_age: float

    @property
    def fill(self) -> float:
        return self.buffered / self.capacity


class _State:
    """The shared buffer and bookkeeping of one channel; every field under ``lock``."""

    def __init__(self, capacity: int, name: str, metrics: Registry | None, send_timeout: float | None):
        self.lock = threading.Lock()
        self.name = name
        self.capacity = capacity
        self.send_timeout = send_timeout
        self.buffer: deque[tuple[float, Any]] = deque()
        self.open_send = 0
        self.open_receive = 0
        self.send_waiters: deque[_Waiter] = deque()
        self.receive_waiters: deque[_Waiter] = deque()
        self.blocked_senders = 0
        self.waiting_receivers = 0
        self.sent = 0
        self.received = 0
        self._unregister: list[Callable[[], None]] = []
        self._fill: Gauge | None = None
        self._blocked: Gauge | None = None
        if metrics is not None:
            self._fill = metrics.gauge(
                names.CHANNEL_FILL, "Fraction of a channel's buffer in use (0..1)", ("stage",)
            ).labels(name)
            self._blocked = metrics.gauge(
                names.CHANNEL_BLOCKED_SENDERS, "Senders blocked on a full channel", ("stage",)
            ).labels(name)
            self._fill.set(0.0)
            self._blocked.set(0.0)
            labels = {"queue": name}
            self._unregister = [
                metrics.collect(
                    names.QUEUE_DEPTH,
                    "Items accepted but not yet taken at a hand-off",
                    lambda: [(labels, float(len(self.buffer)))],
                ),
                metrics.collect(
                    names.QUEUE_OLDEST_AGE,
                    "Age in seconds of the oldest item waiting at a hand-off",
                    lambda: [(labels, self.oldest_age())],
                ),
            ]

    # -- called with the lock held ------------------------------------------

    def put(self, item: Any) -> None:
        self.buffer.append((time.monotonic(), item))
        self.sent += 1
        if self._fill is not None:
            self._fill.set(len(self.buffer) / self.capacity)
        if self.receive_waiters:
            self.receive_waiters.popleft().wake()

    def take(self) -> Any:
        _, item = self.buffer.popleft()
        self.received += 1
        if self._fill is not None:
            self._fill.set(len(self.buffer) / self.capacity)
        if self.send_waiters:
            self.send_waiters.popleft().wake()
        return item

    def wake_all(self, waiters: deque[_Waiter]) -> None:
        while waiters:
            waiters.popleft().wake()

    def set_blocked(self, delta: int) -> None:
        self.blocked_senders += delta
        if self._blocked is not None:
            self._blocked.set(self.blocked_senders)

    def abandon(self, waiter: _Waiter, waiters: deque[_Waiter], can_proceed: bool) -> None:
        """A waiter leaves without using its turn: drop it, or hand a wake-up it got on."""
        try:
            waiters.remove(waiter)
        except ValueError:
            if waiter.woken and can_proceed and waiters:
                waiters.popleft().wake()

    def oldest_age(self) -> float:
        buffer = self.buffer
        try:
            return max(0.0, time.monotonic() - buffer[0][0]) if buffer else 0.0
        except IndexError:  # drained between the check and the read (read without the lock)
            return 0.0

    def maybe_retire(self) -> None:
        if self.open_send == 0 and self.open_receive == 0:
            for unregister in self._unregister:
                unregister()
            self._unregister = []


class _End:
    __slots__ = ("_closed", "_state")

    def __init__(self, state: _State) -> None:
        self._state = state
        self._closed = False

    @property
    def name(self) -> str:
        return self._state.name

    @property
    def closed(self) -> bool:
        return self._closed

    def statistics(self) -> ChannelStats:
        st = self._state
        with st.lock:
            return ChannelStats(
                name=st.name,
                capacity=st.capacity,
                buffered=len(st.buffer),
                open_send_channels=st.open_send,
                open_receive_channels=st.open_receive,
                blocked_senders=st.blocked_senders,
                waiting_receivers=st.waiting_receivers,
                sent=st.sent,
                received=st.received,
                oldest_age=st.oldest_age(),
            )

    def _closed_error(self, what: str) -> ChannelClosedError:
        return ChannelClosedError(
            f"channel {self._state.name!r}: {what} on a {type(self).__name__} that your code already "
            "closed. Fix: keep the end open until you are done with it, or clone() it for another user"
        )

    @staticmethod
    def _deadline(timeout: float | None) -> float | None:
        return None if timeout is None else time.monotonic() + max(0.0, timeout)

    def _count(self, delta: int) -> None:
        raise NotImplementedError

    def _leave(self) -> None:
        raise NotImplementedError

    def clone(self) -> Self:
        """Another handle on this end; the end stays open while any clone is open."""
        st = self._state
        with st.lock:
            if self._closed:
                raise self._closed_error("clone()")
            self._count(+1)
        return type(self)(st)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self._leave()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._leave()


class SendChannel(_End, Generic[T]):
    """The sending end of a channel (see the module docstring for the contract)."""

    __slots__ = ()

    def _count(self, delta: int) -> None:
        self._state.open_send += delta

    def _leave(self) -> None:
        self.close()

    def _step(
        self, item: T, deadline: float | None, waiter: _Waiter | None, make: Callable[[], _Waiter]
    ) -> _Waiter | None:
        """One attempt under the lock: send and return ``None``, raise, or return a new waiter."""
        st = self._state
        with st.lock:
            if waiter is not None and not waiter.woken:
                st.abandon(waiter, st.send_waiters, False)
            if self._closed:
                raise self._closed_error("send()")
            if st.open_receive == 0:
                raise BrokenChannelError(
                    f"channel {st.name!r}: every receiving end is closed, so nobody would ever read this "
                    "item; it was not accepted. Fix: stop sending once the consumer has stopped (or keep a "
                    "receiver open until the senders are done)"
                )
            if len(st.buffer) < st.capacity:
                st.put(item)
                return None
            if deadline is not None and time.monotonic() >= deadline:
                raise ChannelFullError(
                    f"channel {st.name!r} stayed full ({st.capacity} of {st.capacity} items buffered) until "
                    "the send timed out; the item was not accepted. Fix: the consumer is slower than the "
                    "producer: add consumers (concurrency=), raise the buffer, or slow the producer"
                )
            fresh = make()
            st.send_waiters.append(fresh)
            if waiter is None:
                st.set_blocked(+1)
            return fresh

    def _unblock(self, waited: bool) -> None:
        if waited:
            with self._state.lock:
                self._state.set_blocked(-1)

    def send(self, item: T, timeout: float | EllipsisType | None = ...) -> None:
        """Put ``item`` in the buffer, blocking while it is full (up to ``timeout`` s;
        default: the channel's ``send_timeout``)."""
        deadline = self._deadline(self._state.send_timeout if isinstance(timeout, EllipsisType) else timeout)
        waiter = self._step(item, deadline, None, _sync_waiter)
        if waiter is None:
            return
        try:
            while waiter is not None:
                waiter.wait(deadline)
                waiter = self._step(item, deadline, waiter, _sync_waiter)
        finally:
            self._unblock(True)

    def send_nowait(self, item: T) -> None:
        """Put ``item`` in the buffer or raise :class:`ChannelFullError` at once."""
        self._step(item, 0.0, None, _sync_waiter)

    async def asend(self, item: T, timeout: float | EllipsisType | None = ...) -> None:
        """``send`` for async code: waits on the caller's loop without blocking it."""
        deadline = self._deadline(self._state.send_timeout if isinstance(timeout, EllipsisType) else timeout)
        loop = asyncio.get_running_loop()
        waiter = self._step(item, deadline, None, lambda: _Waiter(loop))
        if waiter is None:
            return
        try:
            while waiter is not None:
                try:
                    await waiter.wait_async(deadline)
                except BaseException:
                    st = self._state
                    with st.lock:
                        st.abandon(waiter, st.send_waiters, len(st.buffer) < st.capacity)
                    raise
                waiter = self._step(item, deadline, waiter, lambda: _Waiter(loop))
        finally:
            self._unblock(True)

    def close(self) -> None:
        """Close this clone (idempotent). The last one to close ends the receivers."""
        st = self._state
        with st.lock:
            if self._closed:
                return
            self._closed = True
            st.open_send -= 1
            st.wake_all(st.send_waiters)  # a sender blocked on this clone must see it closed
            if st.open_send == 0:
                st.wake_all(st.receive_waiters)
            st.maybe_retire()

    async def aclose(self) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SendChannel {self._state.name} {'closed' if self._closed else 'open'}>"


class ReceiveChannel(_End, Generic[T]):
    """The receiving end of a channel (see the module docstring for the contract)."""

    __slots__ = ()

    def _count(self, delta: int) -> None:
        self._state.open_receive += delta

    def _step(
        self, deadline: float | None, waiter: _Waiter | None, make: Callable[[], _Waiter]
    ) -> tuple[bool, Any]:
        """One attempt under the lock: ``(True, item)``, raise, or ``(False, new waiter)``."""
        st = self._state
        with st.lock:
            if waiter is not None and not waiter.woken:
                st.abandon(waiter, st.receive_waiters, False)
            if self._closed:
                raise self._closed_error("receive()")
            if st.buffer:
                return True, st.take()
            if st.open_send == 0:
                raise EndOfChannel(f"channel {st.name!r}: every sender closed and the buffer is drained")
            if deadline is not None and time.monotonic() >= deadline:
                raise ChannelEmptyError(
                    f"channel {st.name!r}: nothing arrived before the receive timed out. "
                    "Fix: wait longer, or check that the producer is running"
                )
            fresh = make()
            st.receive_waiters.append(fresh)
            if waiter is None:
                st.waiting_receivers += 1
            return False, fresh

    def _unwait(self) -> None:
        with self._state.lock:
            self._state.waiting_receivers -= 1

    def receive(self, timeout: float | None = None) -> T:
        """The next item, blocking up to ``timeout`` s (``None``: until one arrives or
        every sender closes)."""
        deadline = self._deadline(timeout)
        done, value = self._step(deadline, None, _sync_waiter)
        if done:
            return value  # type: ignore[no-any-return]
        try:
            while not done:
                value.wait(deadline)
                done, value = self._step(deadline, value, _sync_waiter)
            return value  # type: ignore[no-any-return]
        finally:
            self._unwait()

    def receive_nowait(self) -> T:
        """The next item, or :class:`ChannelEmptyError` / :class:`EndOfChannel` at once."""
        _, value = self._step(0.0, None, _sync_waiter)
        return value  # type: ignore[no-any-return]

    async def areceive(self, timeout: float | None = None) -> T:
        deadline = self._deadline(timeout)
        loop = asyncio.get_running_loop()
        done, value = self._step(deadline, None, lambda: _Waiter(loop))
        if done:
            return value  # type: ignore[no-any-return]
        try:
            while not done:
                waiter: _Waiter = value
                try:
                    await waiter.wait_async(deadline)
                except BaseException:
                    st = self._state
                    with st.lock:
                        st.abandon(waiter, st.receive_waiters, bool(st.buffer))
                    raise
                done, value = self._step(deadline, waiter, lambda: _Waiter(loop))
            return value  # type: ignore[no-any-return]
        finally:
            self._unwait()

    def close(self) -> list[T]:
        """Close this clone (idempotent). When it is the last receiver, senders break and
        the items still buffered are returned to the caller instead of being dropped."""
        st = self._state
        with st.lock:
            if self._closed:
                return []
            self._closed = True
            st.open_receive -= 1
            st.wake_all(st.receive_waiters)  # a receiver blocked on this clone must see it closed
            leftovers: list[T] = []
            if st.open_receive == 0:
                st.wake_all(st.send_waiters)
                leftovers = [item for _, item in st.buffer]
                st.buffer.clear()
                if st._fill is not None:
                    st._fill.set(0.0)
            st.maybe_retire()
            return leftovers

    async def aclose(self) -> list[T]:
        return self.close()

    def __iter__(self) -> Iterator[T]:
        while True:
            try:
                yield self.receive()
            except EndOfChannel:
                return

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.areceive()
        except EndOfChannel:
            raise StopAsyncIteration from None

    def _leave(self) -> None:
        dropped = self.close()
        if dropped:
            log.warning(
                "channel %r: the last receiver closed with %d item(s) still buffered; they were "
                "discarded. Fix: drain the channel before leaving the `with` block, or call close() "
                "yourself to get them back",
                self._state.name,
                len(dropped),
            )

    def __repr__(self) -> str:
        return f"<ReceiveChannel {self._state.name} {'closed' if self._closed else 'open'}>"


def _sync_waiter() -> _Waiter:
    return _Waiter(None)


def open_channel(
    capacity: int,
    *,
    name: str | None = None,
    metrics: Registry | None = None,
    send_timeout: float | None = DEFAULT_SEND_TIMEOUT,
) -> tuple[SendChannel[Any], ReceiveChannel[Any]]:
    """A bounded channel of ``capacity`` items (≥ 1): ``(send_end, receive_end)``.

    ``send_timeout`` is how long ``send`` waits on a full buffer before raising
    :class:`~foundry.errors.ChannelFullError` (``None``: forever, which a deadlock on a
    full channel turns into a hang; keep a timeout). ``metrics`` registers the channel's
    gauges under ``name``.
    """
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(
            f"channel {name or '?'!r}: capacity={capacity!r} must be an integer ≥ 1. Fix: every "
            "channel is bounded; pick the most items you accept to hold in memory (e.g. 64)"
        )
    if send_timeout is not None and send_timeout < 0:
        raise ValueError(f"channel {name or '?'!r}: send_timeout={send_timeout!r} must be ≥ 0 or None")
    state = _State(capacity, name or _next_name(), metrics, send_timeout)
    state.open_send = state.open_receive = 1
    return SendChannel(state), ReceiveChannel(state)


def stats_row(stats: ChannelStats) -> Mapping[str, Any]:
    """A flat dict of a channel's statistics (for tables and JSON)."""
    return {
        "channel": stats.name,
        "buffered": stats.buffered,
        "capacity": stats.capacity,
        "fill": stats.fill,
        "blocked_senders": stats.blocked_senders,
        "sent": stats.sent,
        "received": stats.received,
        "oldest_age": stats.oldest_age,
    }
