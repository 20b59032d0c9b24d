"""The queue worker's side of ``rate_limit=``, ``max_concurrency=`` and ``per=``
(``docs/limits.md``): ask the engine for a grant before a job starts, give its slot back
after, and park the jobs that must wait.

**The policy: a job over its limit waits in the worker that claimed it, beside the
runners, never on them.** ``Limiter.ask`` asks the limits engine
(``foundry.backends.limits``, the queue's own store) for a token and a slot. Refused, the
job goes to its queue loop's :class:`ParkingRoom`: still leased to this worker (the
heartbeat keeps its lease), not started, not failed, not retried, no attempt spent, and
not counted against ``prefetch`` — so the claimer goes on claiming and the runners go on
running other units' (and other keys') jobs: no head-of-line blocking across units or
keys. A parked scope is asked again when the engine said a token refills, every
:data:`~foundry.backends.limits.SLOT_POLL` seconds for a slot, and at once when a job of
the same scope finishes in this worker. Jobs of one scope are asked in the order they
were claimed. The room holds at most ``cap`` jobs per queue (``max(64, 4 × prefetch)``);
beyond that parked jobs count against ``prefetch`` again, so a worker never leases an
unbounded backlog of one limited unit (put such a unit on a queue of its own).

A worker that dies holding parked jobs loses nothing: their leases lapse and they are
delivered again (as after any death, they are suspects and run alone next time: see
``foundry.deliver.worker``); a graceful stop gives them back. A slot is a lease in the
engine renewed by the worker's heartbeat with its job's lease, so a SIGKILLed worker's
slot comes back when that lease would lapse.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from foundry.backends.limits import Limit, LimitsBackend, open_limits, scope_key
from foundry.backends.queue import Claimed
from foundry.errors import BackendError, RecordError
from foundry.observe import names
from foundry.observe.metrics import Registry
from foundry.runtime import UnitSpec
from foundry.serialize import decode_call

__all__ = ["Limiter", "ParkingRoom", "Scope", "limit_of"]

log = logging.getLogger("foundry.queue.limits")

J = TypeVar("J")
Scope = tuple[str, str]  # (unit, key)
_OUTAGE_WAIT = 0.5  # seconds a job waits when the limits engine cannot be reached


def limit_of(spec: UnitSpec) -> Limit | None:
    """The unit's :class:`Limit`, or ``None`` when it declares none."""
    t = spec.traits
    if t.rate_limit is None and t.max_concurrency is None:
        return None
    rate = t.rate_limit
    return Limit(
        spec.name,
        rate=rate.rate if rate is not None else None,
        burst=rate.count if rate is not None else None,
        slots=t.max_concurrency,
    )


@dataclass(eq=False)
class _Parked(Generic[J]):
    job: J
    since: float  # monotonic time it first waited


class ParkingRoom(Generic[J]):
    """The jobs of one queue loop that wait for a limit, FIFO per scope. Not thread-safe:
    its owner calls it under its own lock."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._scopes: dict[Scope, deque[_Parked[J]]] = {}
        self._due: dict[Scope, float] = {}  # monotonic time to ask for the scope's head again
        self.count = 0

    def waiting(self, scope: Scope) -> bool:
        """Jobs of ``scope`` wait here (or its head is being asked for)."""
        return scope in self._due

    def park(
        self, scope: Scope, job: J, wait: float, since: float, *, front: bool = False, keep_turn: bool = False
    ) -> None:
        """Park ``job``: ask again in ``wait`` seconds; ``front``: it was the head (asked,
        refused again); ``keep_turn``: behind the others of its scope, their turn unchanged."""
        line = self._scopes.setdefault(scope, deque())
        item = _Parked(job, since)
        if front:
            line.appendleft(item)
        else:
            line.append(item)
        if not (keep_turn and scope in self._due):
            self._due[scope] = time.monotonic() + max(wait, 0.001)
        self.count += 1

    def take_due(self) -> tuple[Scope, J, float] | None:
        """The head of a scope whose time to ask again has come: ``(scope, job, since)``."""
        now = time.monotonic()
        for scope, due in self._due.items():
            if due <= now and self._scopes.get(scope):
                item = self._scopes[scope].popleft()
                self.count -= 1
                self._due[scope] = float("inf")  # until this head is answered (re-parked or run)
                return scope, item.job, item.since
        return None

    def answered(self, scope: Scope, wait: float) -> None:
        """The head taken from ``scope`` was granted: its followers' turn in ``wait`` s."""
        if scope in self._due:
            if self._scopes.get(scope):
                self._due[scope] = time.monotonic() + max(wait, 0.0)
            else:
                self._scopes.pop(scope, None)
                del self._due[scope]

    def wake(self, scope: Scope) -> None:
        """A slot of ``scope`` was freed here: ask for its head now."""
        if scope in self._due and self._due[scope] != float("inf"):
            self._due[scope] = 0.0

    def next_due(self) -> float | None:
        """Seconds until the next scope is due (``None``: nothing parked is due)."""
        dues = [due for scope, due in self._due.items() if self._scopes.get(scope)]
        if not dues or min(dues) == float("inf"):
            return None
        return max(0.0, min(dues) - time.monotonic())

    def remove(self, job: J) -> float | None:
        """Take ``job`` out (cancelled); when it waited since, or ``None`` if not here."""
        for scope, line in list(self._scopes.items()):
            for item in line:
                if item.job == job:  # a _Job compares by identity
                    line.remove(item)
                    self.count -= 1
                    if not line and self._due.get(scope) != float("inf"):
                        del self._scopes[scope], self._due[scope]
                    return item.since
        return None

    def drain(self) -> Iterator[tuple[J, float]]:
        """Every parked job (for a graceful stop), emptied."""
        items = [item for line in self._scopes.values() for item in line]
        self._scopes.clear()
        self._due.clear()
        self.count = 0
        yield from ((item.job, item.since) for item in items)


class Limiter:
    """Grants for one worker's jobs: the scope of a job, the engine's answer, the slots
    it holds (renewed with their jobs' leases, released when they end) and the metrics."""

    def __init__(self, queue_url: str, home: Any, metrics: Registry, lease: float, owner: object) -> None:
        # One store per process and URL, shared by its workers (memory://: per queue backend,
        # ``owner``, whose workers share its private file), like the queue runtime.
        where = (queue_url, str(home), id(owner) if queue_url.startswith("memory:") else 0)
        self._open: Callable[[], LimitsBackend] = lambda: _shared(where, lambda: open_limits(queue_url, home))
        self._where = where
        self._backend: LimitsBackend | None = None
        self._lease = lease
        self._lock = threading.Lock()
        self._held: dict[str, tuple[str, str, str]] = {}  # job id -> (unit, key, holder)
        self._signatures: dict[str, inspect.Signature | None] = {}
        self._m_waiting = metrics.gauge(
            names.LIMIT_WAITING, "jobs waiting for a rate limit or slot", ("unit",)
        )
        self._m_waited = metrics.counter(
            names.LIMIT_WAIT_SECONDS, "seconds jobs waited on a limit before they started", ("unit",)
        )
        self._m_refused = metrics.counter(
            names.LIMIT_REFUSED, "grants refused (the job waited)", ("unit", "limit")
        )

    @property
    def backend(self) -> LimitsBackend:
        with self._lock:
            if self._backend is None:
                self._backend = self._open()
            return self._backend

    def scope(self, spec: UnitSpec, c: Claimed) -> Scope:
        """``(unit, key)``: the key is the ``per=`` argument's value (``""`` without
        ``per=``, or when the arguments cannot be read: the run then fails as it would)."""
        per = spec.traits.per
        if per is None:
            return (spec.name, "")
        try:
            args, kwargs = decode_call(c.payload, c.codec, spec.traits.codec, unit=c.unit, what="arguments")
        except RecordError:
            return (spec.name, "")
        if spec.name not in self._signatures:
            try:
                self._signatures[spec.name] = inspect.signature(spec.fn)
            except (TypeError, ValueError):
                self._signatures[spec.name] = None
        sig = self._signatures[spec.name]
        value: Any = kwargs.get(per)
        if sig is not None:
            try:
                bound = sig.bind(*args, **kwargs)
                bound.apply_defaults()
                value = bound.arguments.get(per, kwargs.get(per))
            except TypeError:
                pass
        return (spec.name, scope_key(value))

    def ask(self, limit: Limit, scope: Scope, c: Claimed) -> tuple[bool, float]:
        """``(True, 0)``: granted (its slot, if any, is now held for the job); ``(False,
        wait)``: refused, ask again in ``wait`` seconds."""
        holder = f"{c.id}:{c.token}"
        try:
            verdict = self.backend.acquire(limit, scope[1], holder, lease=self._lease)
        except BackendError as exc:
            log.warning("limits of unit %r unavailable (%s); job %s waits", limit.unit, exc, c.id)
            return False, _OUTAGE_WAIT
        if not verdict.granted:
            self._m_refused.labels(limit.unit, verdict.limit or "unknown").inc()
            return False, verdict.wait
        if limit.slots is not None:
            with self._lock:
                self._held[c.id] = (scope[0], scope[1], holder)
        return True, 0.0

    def parked(self, unit: str, delta: int) -> None:
        self._m_waiting.labels(unit).inc(delta)

    def waited(self, unit: str, seconds: float) -> None:
        if seconds > 0:
            self._m_waited.labels(unit).inc(seconds)

    def release(self, c: Claimed) -> Scope | None:
        """Give back the job's slot; its scope when it held one here."""
        with self._lock:
            held = self._held.pop(c.id, None)
        if held is None:
            return None
        try:
            self.backend.release(*held)
        except BackendError as exc:  # it lapses with its lease instead
            log.warning("release of the slot of job %s failed (%s); it lapses with its lease", c.id, exc)
        return (held[0], held[1])

    def renew(self) -> None:
        """Extend the slots of the jobs this worker runs (the heartbeat calls it)."""
        with self._lock:
            held = list(self._held.values())
        if not held:
            return
        try:
            self.backend.renew(held, lease=self._lease)
        except BackendError as exc:
            log.warning("renewing %d concurrency slot(s) failed (%s)", len(held), exc)

    def close(self) -> None:
        with self._lock:
            backend, self._backend = self._backend, None
        if backend is not None:
            _unshare(self._where)


_SHARED: dict[tuple[str, str, int], list[Any]] = {}  # where -> [backend, references]
_SHARED_LOCK = threading.Lock()


def _shared(where: tuple[str, str, int], open_: Callable[[], LimitsBackend]) -> LimitsBackend:
    with _SHARED_LOCK:
        entry = _SHARED.get(where)
        if entry is None:
            entry = _SHARED[where] = [open_(), 0]
        entry[1] += 1
        backend: LimitsBackend = entry[0]
        return backend


def _unshare(where: tuple[str, str, int]) -> None:
    with _SHARED_LOCK:
        entry = _SHARED.get(where)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _SHARED[where]
    entry[0].close()
