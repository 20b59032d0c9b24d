"""Per-unit metrics shared by the in-process models, with a hot path that costs an append.

Every model reports, per unit (labels ``unit``, ``model``): ``foundry_unit_in_flight``,
``foundry_unit_completed_total`` (with its rolling rate), ``foundry_unit_failed_total``
and ``foundry_unit_duration_seconds``; per hand-off (label ``unit``)
``foundry_queue_depth`` and ``foundry_queue_oldest_age_seconds``; per pool
``foundry_pool_busy`` and ``foundry_pool_rejected_total``; per process pool
``foundry_child_exits_total`` (by ``code``) and ``foundry_child_restarts_total``.

Cost model. Taking the registry's locks for every completion (a counter, a histogram and
a gauge: five lock round trips and a clock read) costs more than the whole bookkeeping
of a thread pool, and more than the 5 % budget of a sequential call on a 10 µs function.
So a success appends its duration to a lock-free deque; the deque is drained into the
counter and the histogram in one batch when it reaches :data:`FLUSH_EVERY` entries, when
:data:`FLUSH_SECONDS` have passed since the last drain, when a pool worker goes idle,
and — always — right before anyone reads the registry (``Registry.on_read``). A reader
therefore never sees stale values; the per-second ``rate`` is bucketed at drain time,
which is at most half a second late under load. Failures are rare and take the direct,
locked path.
"""

from __future__ import annotations

import atexit
import itertools
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from foundry.errors import SubmitError
from foundry.observe import names
from foundry.observe.metrics import Counter, Registry
from foundry.runtime import SubmitOptions

__all__ = [
    "FLUSH_EVERY",
    "FLUSH_SECONDS",
    "IdMaker",
    "PoolGauges",
    "UnitMetrics",
    "check_in_process_options",
    "count_value",
    "describe",
    "drain_at_exit",
    "forget",
    "usable_cpus",
]

FLUSH_EVERY = 256
FLUSH_SECONDS = 0.5

_LABELS = ("unit", "model")


class _Closable(Protocol):
    def close(self, timeout: float = 10.0) -> None: ...


_exit_hooks: dict[int, Callable[[], None]] = {}


def drain_at_exit(pool: _Closable) -> None:
    """Close ``pool`` (draining its accepted work) when the interpreter exits, unless
    :func:`forget` was called first: accepted work is not dropped because the program
    reached its end. The hook is registered now, so it runs before the exit hooks of
    anything imported earlier (``atexit`` runs last-in first-out) — multiprocessing's,
    which would otherwise terminate a process pool's children before it drained."""
    ref = weakref.ref(pool)

    def close() -> None:
        alive = ref()
        if alive is not None:
            alive.close(timeout=10.0)

    _exit_hooks[id(pool)] = close
    atexit.register(close)


def forget(pool: _Closable) -> None:
    hook = _exit_hooks.pop(id(pool), None)
    if hook is not None:
        atexit.unregister(hook)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask on Linux)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def count_value(counter: itertools.count[int]) -> int:
    """The next value an ``itertools.count`` would return, without advancing it."""
    return int(repr(counter)[6:-1])


class UnitMetrics:
    """The four per-unit metrics of one unit on one model, behind a buffered hot path.

    ``ok(seconds, now)`` records a timed success (an append); ``count_ok()`` an untimed
    one (an atomic ``next()``: the sequential model times only a sample of calls that
    take microseconds); ``fail(seconds)`` a failure (a lock). ``in_flight`` is a callable
    the model supplies (its exact count of running units), read at drain time; ``begin``
    counts starts for models that have no other count of them (sequential:
    ``in_flight = begun - finished``).
    """

    __slots__ = (
        "_begun",
        "_buffer",
        "_finished",
        "_in_flight_fn",
        "_last_flush",
        "_lock",
        "_unregister",
        "_untimed",
        "_untimed_seen",
        "begin",
        "completed",
        "count_ok",
        "duration",
        "failed",
        "in_flight",
        "model",
        "unit",
    )

    def __init__(
        self,
        registry: Registry,
        unit: str,
        model: str,
        in_flight: Callable[[], float] | None = None,
    ) -> None:
        self.unit = unit
        self.model = model
        labels = (unit, model)
        self.in_flight = registry.gauge(names.UNIT_IN_FLIGHT, "Units running now", _LABELS).labels(*labels)
        self.completed = registry.counter(names.UNIT_COMPLETED, "Units completed", _LABELS).labels(*labels)
        self.failed = registry.counter(names.UNIT_FAILED, "Units that raised", _LABELS).labels(*labels)
        self.duration = registry.histogram(names.UNIT_DURATION, "Seconds per unit", _LABELS).labels(*labels)
        self._buffer: deque[float] = deque()
        self._lock = threading.Lock()
        self._last_flush = time.perf_counter()
        self._finished = 0
        self._begun = itertools.count()
        self.begin: Callable[[], int] = self._begun.__next__
        self._untimed = itertools.count()
        self._untimed_seen = 0
        self.count_ok: Callable[[], int] = self._untimed.__next__
        self._in_flight_fn = in_flight if in_flight is not None else self._begun_minus_finished
        self._unregister = registry.on_read(self.flush)

    def _begun_minus_finished(self) -> float:
        return float(max(0, count_value(self._begun) - self._finished))

    def ok(self, seconds: float, now: float) -> None:
        """A success that took ``seconds``; ``now`` is a ``perf_counter`` reading."""
        buffer = self._buffer
        buffer.append(seconds)
        if len(buffer) >= FLUSH_EVERY or now - self._last_flush >= FLUSH_SECONDS:
            self.flush()

    def fail(self, seconds: float | None) -> None:
        """A failure (or a timeout, or a crash) that took ``seconds`` (``None``: untimed)."""
        with self._lock:
            self._finished += 1
        self.failed.inc()
        if seconds is not None:
            self.duration.observe(seconds)

    def flush(self) -> None:
        """Drain buffered successes into the registry and refresh the in-flight gauge."""
        values: list[float] = []
        pop = self._buffer.popleft
        try:
            while True:
                values.append(pop())
        except IndexError:
            pass
        with self._lock:
            untimed = count_value(self._untimed)
            done = len(values) + untimed - self._untimed_seen
            self._untimed_seen = untimed
            self._finished += done
            self._last_flush = time.perf_counter()
        if done:
            self.completed.inc(done)
        if values:
            self.duration.observe_many(values)
        self.in_flight.set(self._in_flight_fn())

    def close(self) -> None:
        """Final drain; the metrics stay readable, the read hook is removed."""
        self.flush()
        self._unregister()


class PoolGauges:
    """Collected gauges of one pool: queue depth, age of the oldest queued item, busy
    workers; and its rejected counter. The callables run only when someone reads."""

    __slots__ = ("_unregister", "rejected")

    def __init__(
        self,
        registry: Registry,
        unit: str,
        *,
        depth: Callable[[], float],
        oldest_age: Callable[[], float],
        busy: Callable[[], float],
    ) -> None:
        labels: Mapping[str, str] = {"unit": unit}

        def one(read: Callable[[], float]) -> Callable[[], Iterable[tuple[Mapping[str, str], float]]]:
            return lambda: [(labels, read())]

        self._unregister = [
            registry.collect(names.QUEUE_DEPTH, "Items accepted and not started, per hand-off", one(depth)),
            registry.collect(
                names.QUEUE_OLDEST_AGE, "Seconds the oldest waiting item has waited", one(oldest_age)
            ),
            registry.collect(names.POOL_BUSY, "Busy workers", one(busy)),
        ]
        self.rejected: Counter = registry.counter(
            names.POOL_REJECTED, "Submissions refused by a full intake", ("unit",)
        ).labels(unit)

    def close(self) -> None:
        for unregister in self._unregister:
            unregister()


class IdMaker:
    """Process-unique, time-ordered handle ids at the cost of one ``next()``."""

    __slots__ = ("_prefix",)
    _numbers = itertools.count(1)

    def __init__(self, kind: str) -> None:
        self._prefix = f"{kind}-{os.getpid():x}{time.time_ns() // 1_000_000:x}-"

    def __call__(self) -> str:
        return self._prefix + str(next(self._numbers))


def check_in_process_options(unit: str, model: str, options: SubmitOptions) -> None:
    """In-process models honour ``timeout`` only; the rest needs a durable queue."""
    asked = [
        name
        for name, value in (
            ("key", options.key),
            ("delay", options.delay),
            ("eta", options.eta),
            ("priority", options.priority or None),
        )
        if value is not None
    ]
    if asked:
        raise SubmitError(
            f"unit {unit!r}: {', '.join(asked)} need(s) a durable queue, but this unit runs in-process "
            f"({model}). Fix: declare the unit durable=True (or model='queue'), or drop {', '.join(asked)}"
        )


def describe(value: Any, limit: int = 60) -> str:
    """A short repr for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
