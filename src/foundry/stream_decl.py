"""``app.stream(name, key=..., partitions=N)``: the declaration of an event stream.

The runtime (publish, consumer groups, offsets) lives in ``foundry.deliver.stream``::

    signaling = app.stream("signaling", key="session_id", partitions=4, retention="7d")

    @signaling.consumer(group="billing", max_deliveries=5, ack_deadline="30s")
    def bill(event):                      # a StreamEvent: event["session_id"], event.id
        ...

    signaling.publish({"type": "connect", "session_id": "s-1"}, id="evt-1")
    await signaling.apublish({"type": "hangup", "session_id": "s-1"})  # in async code
    with signaling.run(consumers=2):      # two consumers per group, in threads
        ...
    signaling.replay("billing", offset=1) # or time=unix_seconds
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from foundry.errors import ConfigError, DeclarationError
from foundry.traits import parse_duration, parse_size, traits_from_kwargs
from foundry.units import decide_phases, refuse_adaptive, refuse_result_ttl

if TYPE_CHECKING:
    from foundry.app import Foundry
    from foundry.backends.stream import DeadLetter, PartitionLag, Start, StreamConfig
    from foundry.deliver.stream import Consumers, Published, StreamRuntime

__all__ = ["StreamDecl"]

F = TypeVar("F", bound=Callable[..., Any])

_STREAM_OPTIONS = frozenset({"retention", "max_events", "max_bytes", "dedup_window", "codec"})


class StreamDecl:
    """An ordered, replayable log of events consumed by independent groups.

    Stream options (beside the traits): ``retention`` (max age, ``"7d"``),
    ``max_events`` and ``max_bytes`` (per partition), ``dedup_window`` (how long an
    event id is remembered for publish dedup, default ``"2m"``), ``codec`` (``"json"``).
    """

    def __init__(
        self, app: Foundry, name: str, *, key: str | None = None, partitions: int = 1, **raw: Any
    ) -> None:
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise DeclarationError(
                name,
                "partitions",
                partitions,
                "is not a positive integer",
                "give partitions=N with N ≥ 1 (order is kept per key within a partition)",
            )
        options = {k: raw.pop(k) for k in list(raw) if k in _STREAM_OPTIONS}
        self.app = app
        self.name = name
        self.partitions = partitions
        defaults: dict[str, Any] = {"durable": True, "ordered": key is not None, "replay": True}
        if key is not None:
            defaults["key"] = key
        self.traits = traits_from_kwargs(name, {**defaults, **raw})
        refuse_adaptive(name, self.traits, "a stream")
        refuse_result_ttl(name, self.traits, "a stream keeps its events by retention=", 'use retention="7d"')
        self.key = self.traits.key
        self.decision, self.phases = decide_phases(name, self.traits, None, app.host)
        self.config = self._config(options)
        self.codec = str(options.get("codec", "json"))
        if self.codec not in ("json", "pickle"):
            raise DeclarationError(name, "codec", self.codec, "is not a codec", 'use codec="json" (default)')
        self._consumers: list[tuple[Callable[..., Any], Any]] = []
        self._runtime: StreamRuntime | None = None

    def _config(self, options: dict[str, Any]) -> StreamConfig:
        from foundry.backends.stream import StreamConfig, check_name

        name = self.name
        try:
            check_name("stream", name)
        except ConfigError as exc:
            raise DeclarationError(
                name, "name", name, "is not usable as a stream name", "use 1-100 letters, digits, '_' or '-'"
            ) from exc
        retention = options.get("retention")
        max_events = options.get("max_events")
        max_bytes = options.get("max_bytes")
        if max_events is not None and (
            isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1
        ):
            raise DeclarationError(
                name, "max_events", max_events, "is not a positive integer", "give max_events=N"
            )
        return StreamConfig(
            name,
            self.partitions,
            max_age=None
            if retention is None
            else parse_duration(retention, unit=name, field_name="retention"),
            max_events=max_events,
            max_bytes=None if max_bytes is None else parse_size(max_bytes, unit=name, field_name="max_bytes"),
            dedup_window=parse_duration(
                options.get("dedup_window", "2m"), unit=name, field_name="dedup_window"
            ),
        )

    # -- the runtime -----------------------------------------------------------

    @property
    def runtime(self) -> StreamRuntime:
        if self._runtime is None:
            import importlib

            # foundry.testing's eager runtime while a sandbox holds the app, else the real one
            module = importlib.import_module(self.app._routes.get("stream_log") or "foundry.deliver.stream")
            runtime: StreamRuntime = module.StreamRuntime(
                self.config,
                self.app.settings.stream,
                metrics=self.app.metrics,
                key_field=self.key,
                codec=self.codec,
                watchdog=self.app.settings.watchdog,
                tracing=self.app.tracing,
            )
            for fn, options in self._consumers:
                runtime.add_group(fn, options)
            self._runtime = runtime
        return self._runtime

    def publish(self, event: Any, *, id: str | None = None, key: Any = None) -> Published:
        """Append ``event`` (JSON data). ``id`` makes a retried publish idempotent;
        ``key`` overrides the field named by the stream's ``key``."""
        return self.runtime.publish(event, id=id, key=key)

    def publish_many(
        self, events: Iterable[Any], *, ids: Sequence[str] | None = None, keys: Sequence[Any] | None = None
    ) -> list[Published]:
        """Append many events in order, in batches (much faster than one by one)."""
        return self.runtime.publish_many(events, ids=ids, keys=keys)

    async def apublish(self, event: Any, *, id: str | None = None, key: Any = None) -> Published:
        """:meth:`publish` from async code, awaited on the caller's own event loop (on NATS
        one ``js.publish`` through that loop's connection; SQLite and Redis append in a
        worker thread): the loop goes on while the log stores the event."""
        return await self.runtime.apublish(event, id=id, key=key)

    async def apublish_many(
        self, events: Iterable[Any], *, ids: Sequence[str] | None = None, keys: Sequence[Any] | None = None
    ) -> list[Published]:
        """:meth:`publish_many` from async code, awaited on the caller's own event loop."""
        return await self.runtime.apublish_many(events, ids=ids, keys=keys)

    def consumer(
        self,
        *,
        group: str,
        start: str | int | float | Start = "beginning",
        ack_deadline: str | float = "30s",
        max_deliveries: int = 5,
        batch: int = 100,
        max_in_flight: int = 1000,
        timeout: str | float | None = None,
        session: str | float = "10s",
        retry_backoff: str | float = "100ms",
        idempotent: bool | str = False,
    ) -> Callable[[F], F]:
        """Declare the handler of consumer group ``group`` (it gets a
        :class:`~foundry.deliver.stream.StreamEvent`). A new group starts at
        ``start``: ``"beginning"``, ``"end"``, an offset (int) or a unix time (float).
        ``idempotent=True`` runs the handler once per event id, recorded on the stream's own
        engine; a store URL (``"redis://cache:6379/2"``) keeps the records there instead."""
        from foundry.backends.stream import check_name
        from foundry.deliver.stream import ConsumerOptions

        try:
            check_name("group", group)
        except ConfigError as exc:
            raise DeclarationError(self.name, "group", group, "is not a usable group name", str(exc)) from exc

        def seconds(field: str, value: str | float) -> float:
            return parse_duration(value, unit=f"{self.name}/{group}", field_name=field)

        options = ConsumerOptions(
            group=group,
            start=_start(self.name, start),
            ack_deadline=seconds("ack_deadline", ack_deadline),
            max_deliveries=max_deliveries,
            batch=batch,
            max_in_flight=max_in_flight,
            timeout=None if timeout is None else seconds("timeout", timeout),
            session=seconds("session", session),
            retry_backoff=seconds("retry_backoff", retry_backoff),
            idempotent=idempotent,
        )

        def register(target: F) -> F:
            if any(o.group == group for _, o in self._consumers):
                raise DeclarationError(
                    self.name, "group", group, "already has a handler", "give each group one handler"
                )
            self._consumers.append((target, options))
            if self._runtime is not None:
                self._runtime.add_group(target, options)
            return target

        return register

    @property
    def groups(self) -> list[str]:
        """The groups declared in this app."""
        return [o.group for _, o in self._consumers]

    def run(self, groups: Iterable[str] | None = None, *, consumers: int = 1) -> Consumers:
        """Start the consumers of ``groups`` (all declared) in this process."""
        return self.runtime.run(groups, consumers=consumers)

    def drain(
        self, groups: Iterable[str] | None = None, *, timeout: float = 30.0, consumers: int = 1
    ) -> None:
        """Run the groups until they have handled everything published so far."""
        self.runtime.drain(groups, timeout=timeout, consumers=consumers)

    def replay(
        self,
        group: str,
        *,
        offset: int | Mapping[int, int] | None = None,
        time: float | None = None,
        partitions: Sequence[int] | None = None,
    ) -> None:
        """Move ``group`` to an offset or a time; its next events start there."""
        self.runtime.replay(group, offset=offset, time=time, partitions=partitions)

    def lag(self, group: str) -> list[PartitionLag]:
        return self.runtime.lag(group)

    def dead_letters(self, group: str | None = None, limit: int = 100) -> list[DeadLetter]:
        return self.runtime.dead_letters(group, limit)

    def close(self, timeout: float = 10.0) -> None:
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            runtime.close(timeout)

    def explain(self) -> str:
        from foundry.explain import render_text

        return render_text(self.name, self.decision, self.phases)

    def __repr__(self) -> str:
        return f"<StreamDecl {self.name} key={self.key} partitions={self.partitions}>"


def _start(stream: str, value: Any) -> Start:
    from foundry.backends.stream import Start

    if isinstance(value, Start):
        return value
    if value == "beginning":
        return Start.beginning()
    if value == "end":
        return Start.end()
    try:
        if isinstance(value, int) and not isinstance(value, bool):
            return Start.at(value)
        if isinstance(value, float):
            return Start.since(value)
    except ConfigError as exc:
        raise DeclarationError(stream, "start", value, "is not a start position", str(exc)) from exc
    raise DeclarationError(
        stream,
        "start",
        value,
        "is not a start position",
        'use "beginning", "end", an offset (int ≥ 1) or a unix time (float)',
    )
