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


# Made once per published event: not frozen=True, whose __init__ sets each field through
# object.__setattr__ (as the backend records, foundry.backends.stream.base); treat it as
# immutable all the same. unsafe_hash keeps it hashable by value, as the frozen one was.
@dataclass(slots=True, unsafe_hash=True)
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

    # Made once per event handled: it keeps the backend's record and reads where the
    # event came from off it, rather than copying seven fields for every event.
    __slots__ = ("_event", "data", "deliveries", "group")

    def __init__(self, event: Event, group: str, data: Any) -> None:
        self._event = event
        self.group = group
        self.deliveries = event.deliveries
        self.data = data

    @property
    def stream(self) -> str:
        return self._event.stream

    @property
    def partition(self) -> int:
        return self._event.partition

    @property
    def offset(self) -> int:
        return self._event.offset

    @property
    def id(self) -> str:
        return self._event.id

    @property
    def key(self) -> str | None:
        return self._event.key

    @property
    def timestamp(self) -> float:
        return self._event.timestamp

    def __getitem__(self, name: str) -> Any:
        return self.data[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.data.get(name, default) if isinstance(self.data, Mapping) else default

    def __repr__(self) -> str:
        return (
            f"<StreamEvent {self.stream}/{self.partition}@{self.offset} id={self.id} key={self.key} "
            f"group={self.group} deliveries={self.deliveries}>"
        )
