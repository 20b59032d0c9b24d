"""The work-pool engine contract: the cut between Foundry's pool runtime and a transport.

A work pool (seed 000 §2.3) is stateless, interchangeable workers behind a dispatcher:
each request goes to the first free worker, nothing is persisted, and a request in a
worker that dies is lost. An engine carries **one attempt** of one request to one
worker and brings back what happened; the runtime (``foundry.deliver.pool``) owns
deadlines, retries of idempotent units, the bounded intake and the elastic controller.
Engines are siblings (``local``: worker processes on this machine over pipes;
``served``: the same dispatcher in ``foundry pool serve``, reached over a Unix socket;
``nats``: that dispatcher on each host behind NATS queue groups) and register by URL in
``foundry.backends.pool``.

The contract (checked for every engine by one parametrized suite,
``tests/pool/test_conformance.py``; the cut-off host by ``tests/pool/test_netns.py``):

* **One answer per attempt, exactly once.** ``send(attempt, done)`` returns at once and
  later calls ``done(reply)`` exactly once — from the engine's own thread, never from
  inside ``send`` while the caller holds a lock of the engine. :func:`answer_once`
  enforces it (a second answer is dropped and logged).
* **At most once per attempt.** The engine hands an attempt to at most one worker and
  never re-sends it by itself: whether to try again is the runtime's decision, because
  only it knows whether the unit is idempotent.
* **First free worker.** An attempt goes to a worker that is not running anything;
  when none is free it waits, up to ``attempt.wait`` seconds, and then is answered
  :data:`DEADLINE` ("no free worker within the deadline"). It is never queued past that.
* **No worker fails fast.** When no worker serves the unit at all (none started or
  subscribed, every one dead, a start-up failure) the answer is :data:`NO_WORKER` in
  well under 50 ms, not at the deadline.
* **Loss is reported, not guessed away.** A worker that dies, exceeds
  ``attempt.timeout`` or cannot be heard from answers :data:`LOST` with a ``detail``
  saying which and where: the work may or may not have happened.
* **The payload is opaque.** ``attempt.body`` is the unit's codec output (JSON unless
  the unit declared pickle); the worker decodes it with the unit's *declared* codec only
  and refuses anything else (:func:`foundry.backends.pool._common.run_request`).
* **Overload is refused.** An engine whose waiting line is full answers
  :data:`OVERLOAD` at once (nothing ran); it never queues without limit.
* **Cancel before dispatch only.** ``cancel(request)`` takes back an attempt that no
  worker has taken yet, answers it :data:`CANCELLED` and returns ``True``; an attempt a
  worker holds (or one already handed to a network) cannot be recalled: ``False``.
* **Close drains.** ``close(timeout)`` refuses new attempts, lets running and waiting
  ones finish within ``timeout``, and answers what is left (``LOST`` / ``DEADLINE``).
* **Workers keep nothing between requests** except a small cache of recent answers by
  idempotency key, so a retry that lands on the worker that already ran the key gets
  that answer instead of a second run.

Engines that own their worker processes (``local``, and a ``nats`` worker host) also
implement :class:`Sizable`, through which the elastic controller resizes them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from foundry.errors import ConfigError

__all__ = [
    "CANCELLED",
    "DEADLINE",
    "ERROR",
    "LOST",
    "NO_WORKER",
    "OK",
    "OVERLOAD",
    "Attempt",
    "Done",
    "EngineSpec",
    "EngineStats",
    "PoolEngine",
    "Reply",
    "Sizable",
    "answer_once",
    "check_subject_part",
]

log = logging.getLogger("foundry.pool")

OK = "ok"  # the worker ran it and returned: ``body`` is the value, in the unit's codec
ERROR = "error"  # the worker ran it and it raised: ``body`` is a JSON error record
LOST = "lost"  # the worker died, timed out or went silent: it may or may not have run
NO_WORKER = "no_worker"  # nobody serves the unit: nothing ran
DEADLINE = "deadline"  # no free worker within ``attempt.wait``: nothing ran
OVERLOAD = "overload"  # the engine's waiting line is full: nothing ran
CANCELLED = "cancelled"  # taken back by ``cancel`` before a worker took it: nothing ran
KINDS = (OK, ERROR, LOST, NO_WORKER, DEADLINE, OVERLOAD, CANCELLED)


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of one request, as the runtime hands it to an engine."""

    request: str  # the request id (the handle's id)
    key: str  # idempotency key: the same on every attempt of a request
    unit: str
    number: int  # 1 for the first attempt
    body: bytes  # encoded (args, kwargs) in the unit's codec
    codec: str
    wait: float  # seconds it may wait for a free worker (the deadline's remainder)
    timeout: float  # seconds one worker may take once it started it


@dataclass(frozen=True, slots=True)
class Reply:
    """What happened to one attempt."""

    kind: str  # one of OK, ERROR, LOST, NO_WORKER, DEADLINE
    body: bytes = b""
    worker: str = ""  # who ran it ("host:pid"), when known
    detail: str = ""  # for LOST / NO_WORKER / DEADLINE: what was seen, for the error message
    seconds: float = 0.0  # service time the worker measured (OK / ERROR)
    queued: float = 0.0  # seconds the attempt waited for a free worker, when the engine knows


Done = Callable[[Reply], None]


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """The one unit an engine carries requests for."""

    app: str
    unit: str
    codec: str  # "json" or "pickle": the unit's declared codec
    module: str  # where a worker imports the function from
    qualname: str
    workers: int = 1  # the first target size of engines that own their workers
    home: str = ""  # the app's state directory (where ``local://served`` finds its socket)


def answer_once(done: Done, attempt: Attempt) -> Done:
    """``done`` guarded so it runs once: a second answer (a late reply after a loss was
    reported, a supervisor's loss notice after the worker's own answer) is dropped."""
    lock = threading.Lock()
    answered = [False]

    def once(reply: Reply) -> None:
        with lock:
            if answered[0]:
                log.debug(
                    "unit %r: dropped a second answer (%s) to %s", attempt.unit, reply.kind, attempt.request
                )
                return
            answered[0] = True
        done(reply)

    return once


@dataclass(frozen=True, slots=True)
class EngineStats:
    """What an engine sees of its workers right now (``-1``: cannot know)."""

    live: int  # started and ready
    busy: int  # running an attempt
    starting: int  # started, not ready yet
    waiting: int  # attempts waiting for a free worker
    arrivals: int  # attempts ever handed to ``send`` (monotonic)
    served: int  # attempts a worker answered (monotonic)
    service_seconds: float  # sum of their service times (monotonic): how long each held its worker
    restarts: int = 0  # workers replaced after dying (monotonic)
    exits: tuple[tuple[str, int], ...] = ()  # (exit code or signal name, count) of dead workers
    workers: tuple[tuple[str, str], ...] = ()  # (worker id, "idle" | "busy" | "starting" | "retiring")


@runtime_checkable
class PoolEngine(Protocol):
    """Carries attempts to workers (see the module docstring for the contract)."""

    url: str

    def send(self, attempt: Attempt, done: Done) -> None:
        """Hand ``attempt`` to the first free worker; ``done`` is answered exactly once."""
        ...

    def stats(self) -> EngineStats: ...

    def cancel(self, request: str) -> bool:
        """Take back the attempt of ``request`` if no worker has it yet (it is answered
        :data:`CANCELLED`, and ``True`` returned); ``False`` once a worker holds it."""
        ...

    def close(self, timeout: float = 10.0) -> None:
        """Stop taking attempts, let running ones finish within ``timeout`` (the rest are
        answered ``LOST``; waiting ones ``DEADLINE``), release every process and socket."""
        ...


@runtime_checkable
class Sizable(Protocol):
    """An engine whose worker processes the elastic controller may resize."""

    def size(self) -> int:
        """The target number of workers (live + starting, less retiring)."""
        ...

    def resize(self, workers: int) -> None:
        """Start or retire workers to reach ``workers``; idle ones retire first, busy
        ones after their current attempt. Never interrupts running work."""
        ...

    def stats(self) -> EngineStats: ...


def check_subject_part(what: str, value: str) -> str:
    """A name that goes into a NATS subject or a file name: letters, digits, ``-``, ``_``."""
    if not value or not all(c.isalnum() or c in "-_" for c in value):
        raise ConfigError(
            f"pool {what} {value!r} cannot name a subject. Fix: use letters, digits, '-' or '_' "
            "(name the unit or app with name=...)"
        )
    return value
