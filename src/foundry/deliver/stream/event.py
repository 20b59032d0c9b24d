"""What a stream hands out and hands back: :class:`StreamEvent` (what a handler
receives) and :class:`Published` (where a published event went).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from foundry.backends.stream import (
    Event,
)

__all__ = ["Published", "StreamEvent"]


T = TypeVar("T")


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
