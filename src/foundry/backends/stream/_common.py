"""What the stream engines share besides the contract: the checks at the door of ``read``
and the shape of a dead-letter record.

* :class:`CheckedRead` is the base class of every engine: its ``read`` (the
  :class:`~foundry.backends.stream.base.StreamBackend` signature) checks the arguments
  once and hands over to the engine's ``_read``.
* :class:`AppendInThread` gives an engine whose driver is synchronous its ``aappend``:
  ``append`` in a worker thread, so the caller's event loop goes on meanwhile.
* :func:`gap_letter` and :func:`event_letter` build the two kinds of
  :class:`~foundry.backends.stream.base.DeadLetter` (a range lost to retention, an event
  a group gave up on); every engine stores what they return.
* :func:`dead_record` and :func:`dead_from_record` turn a dead letter into the short-key
  mapping Redis (stream entry fields) and NATS (a JSON message) keep, and back.

Private to ``foundry.backends.stream``; the contract itself stays in ``base``.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from foundry.backends.stream.base import Appended, DeadLetter, Event, NewEvent, StreamConfig, gap_reason

__all__ = ["AppendInThread", "CheckedRead", "dead_from_record", "dead_record", "event_letter", "gap_letter"]


class AppendInThread(ABC):
    """``aappend`` for an engine with a synchronous driver (SQLite, Redis): its ``append``
    in a worker thread (``asyncio.to_thread``). Cancelling the await does not stop the
    thread: the append completes or fails on its own, as the contract allows."""

    @abstractmethod
    def append(self, stream: str, events: Sequence[NewEvent]) -> list[Appended]: ...

    async def aappend(self, stream: str, events: Sequence[NewEvent]) -> list[Appended]:
        """See :meth:`~foundry.backends.stream.base.StreamBackend.aappend`."""
        return await asyncio.to_thread(self.append, stream, list(events))


class CheckedRead(ABC):
    """The engines' base: ``read`` checks its arguments, ``_read`` does the reading."""

    def read(
        self,
        stream: str,
        group: str,
        partition: int,
        consumer: str,
        *,
        max: int,
        ack_deadline: float,
        timeout: float,
    ) -> list[Event]:
        """See :meth:`~foundry.backends.stream.base.StreamBackend.read`."""
        if max < 1:
            raise ValueError(f"read max={max} must be ≥ 1")
        return self._read(stream, group, partition, consumer, max, ack_deadline, timeout)

    @abstractmethod
    def _read(
        self, stream: str, group: str, partition: int, consumer: str, limit: int, ack: float, timeout: float
    ) -> list[Event]:
        """``read`` once its arguments are checked: ``limit`` (≥ 1) is ``max``, ``ack`` the
        ``ack_deadline``."""


def gap_letter(config: StreamConfig, group: str, partition: int, lo: int, hi: int, now: float) -> DeadLetter:
    """The record of offsets ``lo..hi`` of ``partition``, removed by retention before
    ``group`` processed them."""
    return DeadLetter(
        config.name,
        group,
        partition,
        lo,
        "",
        None,
        None,
        gap_reason(config, group, lo, hi),
        0,
        now,
        last_offset=hi,
    )


def event_letter(
    stream: str, group: str, event: Event, reason: str, error: str | None, now: float
) -> DeadLetter:
    """The record of ``event``, which ``group`` gave up on for ``reason``."""
    return DeadLetter(
        stream,
        group,
        event.partition,
        event.offset,
        event.id,
        event.key,
        event.payload,
        reason,
        event.deliveries,
        now,
        error,
    )


def dead_record(letter: DeadLetter, payload: Callable[[bytes], Any] = bytes) -> dict[str, Any]:
    """``letter`` as a short-key mapping without its ``None`` fields (the stream is
    implied by where it is stored); ``payload`` encodes the event's bytes."""
    record: dict[str, Any] = {
        "g": letter.group,
        "p": letter.partition,
        "o": letter.offset,
        "lo": letter.last_offset,
        "i": letter.id,
        "k": letter.key,
        "d": None if letter.payload is None else payload(letter.payload),
        "r": letter.reason,
        "e": letter.error,
        "n": letter.deliveries,
        "at": letter.dead_at,
    }
    return {name: value for name, value in record.items() if value is not None}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def dead_from_record(
    stream: str, record: Mapping[str, Any], payload: Callable[[Any], bytes] = bytes
) -> DeadLetter:
    """The dead letter stored as ``record`` (values as :func:`dead_record` wrote them, or
    their bytes as Redis returns them); ``payload`` decodes the event's bytes."""
    key, data, error, last = record.get("k"), record.get("d"), record.get("e"), record.get("lo")
    return DeadLetter(
        stream,
        _text(record["g"]),
        int(record["p"]),
        int(record["o"]),
        _text(record["i"]),
        None if key is None else _text(key),
        None if data is None else payload(data),
        _text(record["r"]),
        int(record["n"]),
        float(record["at"]),
        None if error is None else _text(error),
        None if last is None else int(last),
    )
