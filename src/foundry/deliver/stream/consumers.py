"""The consumer threads one :meth:`StreamRuntime.run` started, as one handle."""

from __future__ import annotations

import time

from foundry.deliver.stream.consumer import Consumer, StreamSide

__all__ = ["Consumers"]


class Consumers:
    """The consumer threads :meth:`StreamRuntime.run` started."""

    def __init__(self, runtime: StreamSide, members: list[Consumer]) -> None:
        self.runtime = runtime
        self.members = members

    def start(self) -> None:
        for member in self.members:
            member.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Finish the event in hand, commit what is done, leave the group."""
        for member in self.members:
            member.stopping.set()
        until = time.monotonic() + timeout
        for member in self.members:
            member.join(max(0.0, until - time.monotonic()))

    @property
    def alive(self) -> bool:
        return any(m.is_alive() for m in self.members)

    @property
    def failures(self) -> list[tuple[str, BaseException]]:
        """``(consumer name, error)`` of each member that died (its partitions went to
        the other members); empty while all are healthy or stopped by ``stop()``."""
        return [(m.name, m.failure) for m in self.members if m.failure is not None]

    def __enter__(self) -> Consumers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
