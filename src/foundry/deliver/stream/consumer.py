"""One member of a consumer group: the worker thread that handles its partitions in
order and the heartbeat that keeps its membership, leases and deadlines alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from foundry.backends.idempotency import IdempotencyStore
from foundry.backends.stream import (
    Event,
    StreamBackend,
    StreamConfig,
)
from foundry.deliver.stream.event import StreamEvent
from foundry.deliver.stream.idempotency import IdempotencyUnavailableError, OnceGuard
from foundry.deliver.stream.options import GroupSpec
from foundry.errors import (
    BackendError,
    BackendUnavailableError,
)
from foundry.execute.asyncio_loop import CallerLoop
from foundry.observe import names
from foundry.observe.metrics import Registry
from foundry.observe.stall import Target
from foundry.observe.tracing import Tracing
from foundry.outage import ride_outage
from foundry.payload import loads as payload_loads
from foundry.retry import Backoff
from foundry.serialize import Codec, encode_error

__all__ = ["Consumer", "StreamSide"]

log = logging.getLogger("foundry.stream")

T = TypeVar("T")


class StreamSide(Protocol):
    """What a consumer needs of its stream runtime (:class:`~foundry.deliver.stream.StreamRuntime`)."""

    name: str
    config: StreamConfig
    metrics: Registry
    codec: Codec
    tracing: Tracing
    watchdog: float | None

    @property
    def backend(self) -> StreamBackend: ...

    def span_attributes(self, operation: str, kind: str) -> dict[str, Any]: ...

    def idempotency_store(self, url: str | None = None) -> IdempotencyStore: ...


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


class Consumer:
    """One member of a group: a worker thread that handles its partitions in order and a
    heartbeat thread that keeps its membership, leases and ack deadlines alive.

    The two live and die together: if either thread ends other than by ``stop()`` (a bug,
    a handler calling ``sys.exit``, a backend refusing the group), the failure is logged,
    counted (``foundry_stream_consumer_failures_total``) and kept in ``failure``; the
    other thread stops and the consumer leaves the group and releases its leases, so
    another member takes its partitions over instead of them being renewed for a dead
    worker."""

    def __init__(self, runtime: StreamSide, spec: GroupSpec) -> None:
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
        self._handler = spec.handler
        self._timeout = self.options.timeout
        codec = runtime.codec
        self._loads: Callable[[bytes], Any] = payload_loads if codec.name == "json" else codec.decode
        self._once: OnceGuard | None = None
        if self.options.idempotent is not False:
            url = None if self.options.idempotent is True else str(self.options.idempotent)
            self._once = OnceGuard(
                runtime.idempotency_store(url),
                f"{runtime.name}/{self.group}",
                self.name,
                max(self.options.ack_deadline, self.options.timeout or 0.0),
                lambda call: ride_outage(call, stop=self.stopping),
            )
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
                events = ride_outage(
                    lambda: backend.read(
                        stream,
                        self.group,
                        partition,
                        self.name,
                        max=1 if recovering else self.options.read_size,
                        ack_deadline=self.options.ack_deadline,
                        timeout=wait,
                    ),
                    stop=self.stopping,
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
            ride_outage(
                lambda: self._backend.commit(self.runtime.name, self.group, partition, offset),
                stop=self.stopping,
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
            ride_outage(
                lambda: self._backend.dead_letter(self.runtime.name, self.group, event, reason, record),
                stop=self.stopping,
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
        # Chosen once per batch, not per event: how each event is decoded and run.
        loads = self._loads
        run = self._call if self._once is not None or self.spec.is_async else self._plain
        if self.runtime.tracing.tracer() is not None:
            run = self._call
        try:
            while index < len(events):
                event = events[index]
                letter: tuple[Event, str, BaseException | None] | None = pending_letter
                pending_letter = None
                if letter is None:
                    given_up = None
                    if event.malformed is not None or attempt > limit:
                        given_up = self._gives_up(event, attempt)
                    if given_up is not None:
                        letter = (event, *given_up)
                    else:
                        try:
                            data = loads(event.payload)
                        except Exception as exc:  # no retry can fix bytes that are not an event
                            letter = (event, self._not_decoded(exc), None)
                        else:
                            error = run(event, data, attempt)
                            if isinstance(error, IdempotencyUnavailableError) and self.stopping.is_set():
                                break  # not run: it stays pending, redelivered to whoever reads next
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

    def _not_decoded(self, exc: Exception) -> str:
        """The dead-letter reason of an event whose bytes the codec refused."""
        return (
            f"the event is not valid {self.runtime.codec.name} ({type(exc).__name__}: {exc}); "
            "a producer outside Foundry wrote it, or with another codec"
        )

    def _plain(self, event: Event, data: Any, attempt: int) -> BaseException | None:
        """:meth:`_call` for a synchronous handler, untraced, without an idempotency
        guard: the handler's view of the event, its wall time, its error."""
        view = StreamEvent(event, self.group, data)
        view.deliveries = attempt
        if self._timeout is not None:  # the heartbeat stops extending an overrunning handler
            self.busy_since = time.monotonic()
        clock = time.perf_counter
        started = clock()
        try:
            self._handler(view)
        except Exception as exc:
            self._durations.append(clock() - started)
            return exc
        self._durations.append(clock() - started)
        return None

    def _call(self, event: Event, data: Any, attempt: int) -> BaseException | None:
        tracer = self.runtime.tracing.tracer()
        if tracer is None:
            return self._handle(event, data, attempt)
        attributes = {
            **self.runtime.span_attributes("process", "process"),
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
            if self._once is None:
                self._run_handler(view)
            else:  # claim, run, record (a claim refused for a hostile record is a failure)
                self._once.run(event.id, lambda: self._run_handler(view))
        except Exception as exc:
            return exc
        finally:
            self._durations.append(time.perf_counter() - started)
        return None

    def _run_handler(self, view: StreamEvent) -> None:
        if self.spec.is_async:
            if self._loop is None:
                self._loop = self._new_loop()
            coro = self.spec.handler(view)
            self._loop.run(asyncio.wait_for(coro, self.options.timeout))
        else:
            self.spec.handler(view)
