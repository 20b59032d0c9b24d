"""A plain ``@app.work`` unit whose decision is ``stream`` (ordered per key, durable).

Each ``submit`` appends the call (``{"args": [...], "kwargs": {...}}``, JSON) to a stream
named after the unit, keyed by the unit's ``key`` argument; a consumer group ``run`` in
this process handles the calls in order per key. The handle resolves when this process
handled the event; a call handled by another process (after a crash, or by a consumer
elsewhere) is done there and its result is not seen here — use a queue or a workflow
when the caller needs the result from anywhere.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import inspect
import re
import threading
import uuid
from typing import Any

from foundry.backends.stream import StreamConfig
from foundry.deliver.stream.consumers import Consumers
from foundry.deliver.stream.event import StreamEvent
from foundry.deliver.stream.options import ConsumerOptions
from foundry.deliver.stream.runtime import StreamRuntime
from foundry.errors import SubmitError
from foundry.handle import FutureSource, Handle
from foundry.runtime import RuntimeContext, SubmitOptions, UnitSpec

__all__ = ["StreamUnitRunner", "make_runner"]

_GROUP = "run"


class StreamUnitRunner:
    def __init__(self, spec: UnitSpec, ctx: RuntimeContext) -> None:
        self.spec = spec
        name = re.sub(r"[^A-Za-z0-9_-]", "-", spec.name)[:100]
        self.runtime = StreamRuntime(
            StreamConfig(name, partitions=1),
            ctx.settings.stream,
            metrics=ctx.metrics,
            key_field=None,
            watchdog=ctx.settings.watchdog,
            tracing=ctx.tracing,
        )
        options = ConsumerOptions(group=_GROUP, timeout=spec.traits.timeout)
        if spec.is_async:  # on the consumer's (watched) loop, stalls attributed to the unit
            self.runtime.add_group(self._ahandle, options, watch=[spec])
        else:
            self.runtime.add_group(self._handle, options)
        self._futures: dict[str, cf.Future[Any]] = {}
        self._lock = threading.Lock()
        self._consumers: Consumers | None = None
        try:
            self._signature: inspect.Signature | None = inspect.signature(spec.fn)
        except (TypeError, ValueError):
            self._signature = None

    def _key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        name = self.spec.traits.key
        if name is None:
            return None
        if name in kwargs:
            return kwargs[name]
        if self._signature is not None:
            try:
                bound = self._signature.bind_partial(*args, **kwargs)
            except TypeError as exc:
                raise SubmitError(
                    f"unit {self.spec.name!r}: {exc}. Fix: pass the arguments it takes"
                ) from exc
            if name in bound.arguments:
                return bound.arguments[name]
        raise SubmitError(
            f"unit {self.spec.name!r}: key={name!r} names an argument that this call did not pass. "
            f"Fix: pass {name}=..., it orders the work"
        )

    def _handle(self, event: StreamEvent) -> None:
        future = self._futures.pop(event.id, None)
        try:
            value = self.spec.fn(*event["args"], **event["kwargs"])
        except Exception as exc:
            self._failed(event, future, exc)
            raise
        if future is not None and not future.done():
            future.set_result(value)

    async def _ahandle(self, event: StreamEvent) -> None:
        future = self._futures.pop(event.id, None)
        try:
            value = await self.spec.fn(*event["args"], **event["kwargs"])
        except Exception as exc:
            self._failed(event, future, exc)
            raise
        if future is not None and not future.done():
            future.set_result(value)

    def _failed(self, event: StreamEvent, future: cf.Future[Any] | None, exc: Exception) -> None:
        if future is not None and event.deliveries >= ConsumerOptions(group=_GROUP).max_deliveries:
            future.set_exception(exc)
        elif future is not None:
            self._futures[event.id] = future

    def submit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        if options.delay is not None or options.eta is not None or options.priority:
            raise SubmitError(
                f"unit {self.spec.name!r} runs on an ordered stream: delay, eta and priority would break "
                "the order. Fix: drop them, or declare the unit durable without key/ordered (a queue)"
            )
        future: cf.Future[Any] = cf.Future()
        event_id = options.key or uuid.uuid4().hex
        key = self._key(args, kwargs)
        with self._lock:
            self._futures[event_id] = future  # before publishing: the consumer may be quick
        try:
            published = self.runtime.publish_many(
                [{"args": list(args), "kwargs": kwargs}], ids=[event_id], keys=[key]
            )[0]
        except BaseException:
            self._futures.pop(event_id, None)
            raise
        if published.duplicate:
            self._futures.pop(event_id, None)
            future.set_exception(
                SubmitError(
                    f"unit {self.spec.name!r}: a call with key {event_id!r} was already submitted; "
                    "it ran (or runs) once. Fix: use a new key for new work"
                )
            )
        with self._lock:
            if self._consumers is None:
                self._consumers = self.runtime.run([_GROUP])
        return Handle(published.id, self.spec.name, FutureSource(future))

    async def asubmit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        return await asyncio.to_thread(self.submit, args, kwargs, options)

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.submit(args, kwargs, SubmitOptions()).result()

    def close(self, timeout: float = 10.0) -> None:
        self.runtime.close(timeout)


def make_runner(spec: Any, ctx: Any) -> Any:
    """A unit decided as ``stream`` (ordered per key, durable): each call is an event on a
    stream named after the unit, handled in order per key by this process's consumer."""
    return StreamUnitRunner(spec, ctx)
