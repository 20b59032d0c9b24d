"""How one consumer group consumes: :class:`ConsumerOptions`, and the declared group
(options and handler) the runtime keeps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from foundry.backends.stream import (
    Start,
)
from foundry.deliver.stream.event import StreamEvent
from foundry.errors import (
    DeclarationError,
)
from foundry.observe.stall import UnitLike

__all__ = ["ConsumerOptions", "GroupSpec", "Handler"]


T = TypeVar("T")
Handler = Callable[[StreamEvent], Any]


@dataclass(frozen=True, slots=True)
class ConsumerOptions:
    """How one group consumes. Durations in seconds."""

    group: str
    start: Start = field(default_factory=Start.beginning)  # where a *new* group starts
    ack_deadline: float = 30.0  # an unacknowledged delivery is redelivered after this
    max_deliveries: int = 5  # deliveries/attempts before the dead letters
    batch: int = 100  # events read per partition at a time (the uncommitted window)
    max_in_flight: int = 1000  # bound on events held by one consumer (backpressure)
    retry_backoff: float = 0.1  # first retry delay of a failing event; doubles, ≤ 5 s
    timeout: float | None = None  # handler time limit (async handlers are cancelled)
    session: float = 10.0  # membership and partition lease time-to-live
    poll: float = 0.2  # longest wait for new events before looking at other partitions
    # Run the handler once per event id (claim, run, record: foundry.deliver.stream.idempotency):
    # True keeps the records on the stream's own engine, a URL names another store.
    idempotent: bool | str = False

    def __post_init__(self) -> None:
        for name in ("ack_deadline", "session", "poll", "retry_backoff"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise DeclarationError(
                    self.group, name, value, "is not a positive duration", f'give {name} like "30s"'
                )
        for name in ("max_deliveries", "batch", "max_in_flight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DeclarationError(
                    self.group, name, value, "is not a positive integer", f"give {name}=N with N ≥ 1"
                )

        idem = self.idempotent
        if not isinstance(idem, bool) and (not isinstance(idem, str) or "://" not in idem):
            raise DeclarationError(
                self.group,
                "idempotent",
                idem,
                "is not True, False or a store URL",
                'give idempotent=True (records on the stream\'s engine) or idempotent="redis://host:6379/0"',
            )

    @property
    def read_size(self) -> int:
        return min(self.batch, self.max_in_flight)


@dataclass
class GroupSpec:
    options: ConsumerOptions
    handler: Handler
    is_async: bool
    name: str
    watch: tuple[UnitLike, ...] = ()
