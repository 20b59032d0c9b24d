"""What the queue backend tests share: the backends one test opens on its namespace (and
the clean-up of that namespace afterwards), a job builder and lease for the
engine-specific tests, the check of a job's state, and the check that a stopping worker
wakes a waiting claimer."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

from foundry.backends.queue import JobState, JobStatus, NewJob, open_queue_backend
from tests.backends.queue.engines import close, drop_schema

LONG = 60.0  # a lease that does not lapse during a test


class _Closable(Protocol):
    def close(self) -> None: ...


B = TypeVar("B", bound=_Closable)


def job(queue: str, **fields: object) -> NewJob:
    """A minimal job for ``queue`` with a fresh id (the engine-specific tests)."""
    return NewJob(id=uuid.uuid4().hex, queue=queue, unit="u", payload=b"[]", **fields)  # type: ignore[arg-type]


def expect(state: JobState | None, status: JobStatus) -> JobState:
    """``state`` (from ``get`` or ``wait``), which must exist and be ``status``."""
    assert state is not None
    assert state.status is status
    return state


class Namespace(Generic[B]):
    """The backends one test opens on ``url``, a private namespace (a prefix, a schema,
    a file), each an instance of ``kind``. Leaving it closes them all and removes what
    they created: the others are closed, then ``destroy()`` (when the engine has it) runs
    on the first one opened before it is closed, or on a fresh backend when the test
    opened none itself (the code it ran may have); then a PostgreSQL schema is dropped.
    """

    def __init__(self, url: str, kind: type[B]) -> None:
        self.url = url
        self.kind = kind
        self.opened: list[B] = []

    def open(self, options: str = "") -> B:
        """Another backend ("process") on the namespace; ``options`` is appended to the URL."""
        backend = open_queue_backend(self.url + options)
        assert isinstance(backend, self.kind)
        self.opened.append(backend)
        return backend

    def __enter__(self) -> Namespace[B]:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            for backend in reversed(self.opened[1:]):
                backend.close()
        finally:
            if self.opened:
                close(self.opened[0], self.url)
            else:
                try:
                    close(open_queue_backend(self.url), self.url)
                finally:
                    drop_schema(self.url)


def assert_a_stop_wakes_a_waiting_claimer(backend: Any, waiting: Callable[[], bool]) -> None:
    """A claimer waits up to a minute on the empty queue ``idle``; once ``waiting()`` says
    it is blocked (or after 10 s), a stopping worker bumps the backend (what
    ``Worker.stop()`` does): then the claimer returns empty-handed at once."""
    got: list[list[object]] = []
    t = threading.Thread(
        target=lambda: got.append(backend.claim("idle", "w", lease=LONG, limit=1, timeout=60))
    )
    t.start()
    deadline = time.monotonic() + 10
    while not waiting() and time.monotonic() < deadline:
        time.sleep(0.01)
    # When a stopping worker bumps the backend (what Worker.stop() does)
    backend.signals.bump_all()
    # Then the claimer returns empty-handed instead of waiting for its minute
    t.join(30)
    assert not t.is_alive()
    assert got == [[]]
