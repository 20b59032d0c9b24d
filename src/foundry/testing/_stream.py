"""The eager stream runtime of a sandbox: the real one (the log in the sandbox's home,
the real consumers, retries and dead letters), whose publish returns only once every
consumer group of the stream has handled what was published — and raises the handler's
own exception for an event it failed for good (dead-lettered), like a failing eager job."""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from foundry.deliver.stream import ConsumerOptions, Published
from foundry.deliver.stream import StreamRuntime as _RealRuntime
from foundry.deliver.stream.options import Handler
from foundry.observe.stall import UnitLike

__all__ = ["EagerStreamRuntime", "StreamRuntime"]

_DRAIN = 60.0  # seconds a publish may wait for its handlers (a handler that hangs fails the test)


class EagerStreamRuntime(_RealRuntime):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._failures: dict[tuple[str, str], BaseException] = {}  # (group, event id) -> last error
        self._failures_lock = threading.Lock()

    def add_group(
        self, handler: Handler, options: ConsumerOptions, *, watch: Iterable[UnitLike] = ()
    ) -> None:
        super().add_group(self._recording(handler, options.group), options, watch=watch)

    def _recording(self, handler: Handler, group: str) -> Handler:
        """``handler``, remembering the exception of its last failed delivery of each event."""

        def failed(event: Any, exc: BaseException) -> None:
            with self._failures_lock:
                self._failures[(group, str(event.id))] = exc

        def handled(event: Any) -> None:
            with self._failures_lock:
                self._failures.pop((group, str(event.id)), None)

        if inspect.iscoroutinefunction(handler):

            @functools.wraps(handler)
            async def arecord(event: Any) -> Any:
                try:
                    value = await handler(event)
                except BaseException as exc:
                    failed(event, exc)
                    raise
                handled(event)
                return value

            return arecord

        @functools.wraps(handler)
        def record(event: Any) -> Any:
            try:
                value = handler(event)
            except BaseException as exc:
                failed(event, exc)
                raise
            handled(event)
            return value

        return record

    def publish_many(
        self,
        events: Iterable[Any],
        *,
        ids: Sequence[str] | None = None,
        keys: Sequence[Any] | None = None,
    ) -> list[Published]:
        published = super().publish_many(events, ids=ids, keys=keys)
        self._settle()
        return published

    def publish(self, event: Any, *, id: str | None = None, key: Any = None) -> Published:
        published = super().publish(event, id=id, key=key)
        self._settle()
        return published

    async def apublish(self, event: Any, *, id: str | None = None, key: Any = None) -> Published:
        published = await super().apublish(event, id=id, key=key)
        await asyncio.to_thread(self._settle)
        return published

    async def apublish_many(
        self,
        events: Iterable[Any],
        *,
        ids: Sequence[str] | None = None,
        keys: Sequence[Any] | None = None,
    ) -> list[Published]:
        published = await super().apublish_many(events, ids=ids, keys=keys)
        await asyncio.to_thread(self._settle)  # the handlers may be async ones on this very loop
        return published

    def _settle(self) -> None:
        """Wait until every group handled what was published; raise a handler's error for
        an event it failed for good."""
        if self.groups:
            self.drain(timeout=_DRAIN)
            with self._failures_lock:
                failures, self._failures = list(self._failures.values()), {}
            if failures:
                raise failures[0]


# what foundry.stream_decl builds a declared stream's runtime from, in a sandbox
StreamRuntime = EagerStreamRuntime
