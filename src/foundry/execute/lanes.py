"""Per-key lanes: ``ordered=True, key=...`` on a concurrent in-process model.

::

    @app.work(bound="io", rate="900/s", est="2ms", ordered=True, key="account")
    def post(entry: dict) -> None: ...        # entry["account"] orders it

    post.submit({"account": "a", "amount": 3})   # a1
    post.submit({"account": "b", "amount": 1})   # b1 runs beside a1
    post.submit({"account": "a", "amount": -2})  # a2 starts only when a1 has finished

Order is a constraint, not a model: the decision picks the model for the load (a pool,
processes, an event loop, a channel) and this wrapper keeps the order on it. Units with
the same key run **one at a time, in submission order**; units with different keys run
at once on the model's workers. A unit's key is the argument the unit's ``key`` names —
passed by keyword or by position, or a field (or attribute) of the first argument, as a
stream's key is a field of its event.

How: a lane per key that has work accepted. The first unit of a key goes to the model
(through its non-blocking ``try_submit``); the rest wait in the lane, and the next one
is handed over when the one before it finishes (succeeded, failed, timed out or
cancelled: a failure does not stall its key). A unit the model had no room for waits at
the head of its lane and is handed over at the model's next completion, so the model's
own intake never blocks a worker.

Bounded: at most ``max_pending`` units (default: what the model itself holds, workers +
intake) wait in the lanes; past that the unit's ``overflow`` applies — ``"reject"``
raises :class:`~foundry.errors.OverloadError`, ``"block"`` waits for room up to
``latency`` (or 30 s). ``"caller_runs"`` blocks too: running a unit in the caller would
overtake the units of its key that wait. The lanes' depth and oldest age are
``foundry_queue_depth`` / ``foundry_queue_oldest_age_seconds`` with
``queue="<unit>:lanes"``.

Guarantees: each accepted unit runs at most once, after every earlier unit of its key
has finished; its handle resolves exactly once. Nothing is persisted.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Protocol

from foundry.errors import CancelledError, OverloadError, SubmitError
from foundry.execute._task import QUEUED, SUCCEEDED, Task
from foundry.execute.instrument import IdMaker, drain_at_exit, forget
from foundry.handle import Handle, Status
from foundry.observe import names
from foundry.runtime import Runner, RuntimeContext, SubmitOptions, UnitSpec

__all__ = ["KeyedRunner", "TrySubmit"]

DEFAULT_BLOCK_TIMEOUT = 30.0


class TrySubmit(Runner, Protocol):
    """A model that can accept work without blocking: ``None`` when its intake is full."""

    def try_submit(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions
    ) -> Handle | None: ...


class LaneTask(Task):
    """A unit in a lane: a :class:`Task` until it is handed to the model, then a view of
    the model's handle."""

    __slots__ = ("cancel_asked", "inner", "key", "options")

    def __init__(
        self,
        owner: KeyedRunner,
        key: Hashable,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: SubmitOptions,
    ) -> None:
        super().__init__(owner, _never, args, kwargs, options.timeout)
        self.key = key
        self.options = options
        self.inner: Handle | None = None
        self.cancel_asked = False

    def status(self) -> Status:
        if self.state >= SUCCEEDED or self.inner is None:
            return super().status()
        inner = self.inner.status
        # Finished on the model but not yet settled here (its callback is on its way):
        # still running, so done() never runs ahead of result().
        return Status.RUNNING if inner.finished else inner


def _never(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - a lane task runs on its model
    raise AssertionError("a lane task runs on its model")


class KeyedRunner:
    """Wraps a concurrent runner so that units with the same key run one at a time, in
    submission order (see the module docstring)."""

    def __init__(self, inner: TrySubmit, spec: UnitSpec, ctx: RuntimeContext) -> None:
        traits = spec.traits
        assert traits.key is not None
        self.inner = inner
        self.spec = spec
        self.name = spec.name
        self.key_name: str = traits.key
        self.max_pending = traits.max_pending or max(1, int(getattr(inner, "map_window", 64)))
        self.block_timeout = traits.latency if traits.latency is not None else DEFAULT_BLOCK_TIMEOUT
        self.reject = traits.overflow == "reject"
        self.map_window = self.max_pending
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._lanes: dict[Hashable, deque[LaneTask]] = {}  # key -> successors of its active unit
        self._ready: deque[LaneTask] = deque()  # active units the model had no room for yet
        self._waiting = 0  # units in _ready and in the lanes (the bounded intake)
        self._kicks = 0  # completions so far: a pump that met a full model retries if it moved
        self._closed = False
        self._ids = IdMaker("lane")
        try:
            self._signature: inspect.Signature | None = inspect.signature(spec.fn)
        except (TypeError, ValueError):
            self._signature = None
        labels = {"queue": f"{spec.name}:lanes"}
        self._unregister = [
            ctx.metrics.collect(
                names.QUEUE_DEPTH,
                "Items accepted and not started, per hand-off",
                lambda: [(labels, float(self._waiting))],
            ),
            ctx.metrics.collect(
                names.QUEUE_OLDEST_AGE,
                "Seconds the oldest waiting item has waited",
                lambda: [(labels, self._oldest_age())],
            ),
        ]
        drain_at_exit(self)

    # -- the key ---------------------------------------------------------------------

    def key_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hashable:
        """The value of the unit's ``key`` in this call."""
        name = self.key_name
        found, value = False, None
        if name in kwargs:
            found, value = True, kwargs[name]
        elif self._signature is not None and name in self._signature.parameters:
            try:
                bound = self._signature.bind_partial(*args, **kwargs)
            except TypeError as exc:
                raise SubmitError(f"unit {self.name!r}: {exc}. Fix: pass the arguments it takes") from exc
            if name in bound.arguments:
                found, value = True, bound.arguments[name]
        elif args and isinstance(args[0], Mapping) and name in args[0]:
            found, value = True, args[0][name]
        elif args and hasattr(args[0], name):
            found, value = True, getattr(args[0], name)
        if not found:
            raise SubmitError(
                f"unit {self.name!r}: key={name!r} is neither an argument of this call nor a field of its "
                f"first argument, so its order cannot be kept. Fix: pass {name}=..., or an item with a "
                f"{name!r} field"
            )
        try:
            hash(value)
        except TypeError:
            raise SubmitError(
                f"unit {self.name!r}: the key {name}={value!r} is not hashable. Fix: key by an id "
                "(a string or a number)"
            ) from None
        return value

    # -- accepting -----------------------------------------------------------------

    def _new(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> LaneTask:
        return LaneTask(self, self.key_of(args, kwargs), args, kwargs, options)

    def _admit(self, task: LaneTask, wait: bool) -> bool:
        """Put ``task`` in its lane (or at the ready end when its key is idle). ``False``
        when the lanes are full and ``wait`` is off; raises on overflow."""
        deadline = time.monotonic() + self.block_timeout
        with self._lock:
            while True:
                if self._closed:
                    raise SubmitError(
                        f"unit {self.name!r}: its runner is closed. Fix: submit before app.close()"
                    )
                if self._waiting < self.max_pending:
                    break
                if self.reject:
                    raise OverloadError(
                        f"unit {self.name!r}: {self._waiting} units already wait in its per-key lanes "
                        f"(max_pending={self.max_pending}) and overflow='reject'. Fix: retry later, or "
                        "raise max_pending"
                    )
                if not wait:
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    raise OverloadError(
                        f"unit {self.name!r}: its per-key lanes stayed full ({self.max_pending} waiting) "
                        f"for {self.block_timeout}s. Fix: raise max_pending, spread the keys, or slow "
                        "the producer"
                    )
                self._room.wait(left)
            task.enqueued = time.perf_counter()
            self._waiting += 1
            lane = self._lanes.get(task.key)
            if lane is None:
                self._lanes[task.key] = deque()
                self._ready.append(task)
            else:
                lane.append(task)
        return True

    def submit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        task = self._new(args, kwargs, options)
        self._admit(task, wait=True)
        self._pump()
        return Handle(self._ids(), self.name, task)

    async def asubmit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        task = self._new(args, kwargs, options)
        if not self._admit(task, wait=False):
            # full: waiting for room would hold the loop; wait in a thread instead
            await asyncio.to_thread(self._admit, task, True)
        self._pump()
        return Handle(self._ids(), self.name, task)

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.submit(args, kwargs, _NO_OPTIONS).result()

    # -- handing units to the model ----------------------------------------------------

    def _pump(self) -> None:
        """Hand ready units to the model while it has room."""
        while True:
            with self._lock:
                if not self._ready:
                    return
                task = self._ready.popleft()
                if task.state != QUEUED:  # cancelled while ready: its lane moved on then
                    continue
                self._waiting -= 1
                self._room.notify()
                kicks = self._kicks
            try:
                handle = self.inner.try_submit(task.args, task.kwargs, task.options)
            except BaseException as exc:
                # the model refused it (arguments it cannot carry, closed): it fails alone
                self._done(task, None, exc, pump=False)
                if not isinstance(exc, Exception):
                    raise
                continue
            if handle is None:  # the model is full: wait at the head for its next completion
                with self._lock:
                    self._ready.appendleft(task)
                    self._waiting += 1
                    if self._kicks == kicks:
                        return
                continue  # something finished meanwhile: there may be room now
            with self._lock:
                task.inner = handle
                cancel = task.cancel_asked
            if cancel:
                handle.cancel()
            _when_done(handle, functools.partial(self._inner_done, task, handle))

    def _inner_done(self, task: LaneTask, handle: Handle) -> None:
        try:
            outcome = handle._source.outcome()
        except BaseException as exc:  # pragma: no cover - a source that cannot say how it ended
            self._done(task, None, exc)
            return
        self._done(task, outcome.value, outcome.error)

    def _done(self, task: LaneTask, value: Any, error: BaseException | None, pump: bool = True) -> None:
        """``task`` ended on the model: settle it and let the next of its key go."""
        task.finish(value, error)
        with self._lock:
            self._kicks += 1
            self._advance(task.key)
        if pump:
            self._pump()

    def _advance(self, key: Hashable) -> None:
        """Under the lock: the active unit of ``key`` is gone; the next becomes active."""
        lane = self._lanes.get(key)
        if lane:
            self._ready.append(lane.popleft())
        else:
            self._lanes.pop(key, None)
            if not self._lanes:
                self._room.notify_all()  # close() waits for every lane to empty

    # -- cancelling and closing --------------------------------------------------------------

    def cancel_task(self, task: Task) -> bool:
        assert isinstance(task, LaneTask)
        callbacks: list[Callable[[], None]] | None = None
        with self._lock:
            if task.state >= SUCCEEDED:
                return task.status() == Status.CANCELLED
            inner = task.inner
            if inner is None and task in self._ready:  # active, not handed over: drop it
                self._ready.remove(task)
                self._waiting -= 1
                self._room.notify()
                self._advance(task.key)
            elif inner is None and task in self._lanes.get(task.key, ()):
                self._lanes[task.key].remove(task)
                self._waiting -= 1
                self._room.notify()
            elif inner is None:  # being handed over right now: cancel it once it has a handle
                task.cancel_asked = True
                return True
            if inner is None:
                error = CancelledError(f"unit {self.name!r}: cancelled before it started")
                callbacks = task.finish_locked(None, error)
        if inner is not None:
            return inner.cancel()
        for callback in callbacks or ():
            callback()
        if not self._closed:  # closing cancels what waits: hand nothing more to the model
            self._pump()
        return True

    def _oldest_age(self) -> float:
        now = time.perf_counter()
        with self._lock:
            oldest = [lane[0].enqueued for lane in self._lanes.values() if lane]
            oldest += [t.enqueued for t in self._ready]
        return max(0.0, now - min(oldest)) if oldest else 0.0

    def close(self, timeout: float = 10.0) -> None:
        """Stop accepting; let every lane drain within ``timeout``; cancel what is left
        waiting; then close the model with the time that remains."""
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._room.notify_all()
            while self._lanes:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._room.wait(min(left, 0.05))
            leftovers = [*self._ready, *(t for lane in self._lanes.values() for t in lane)]
        for task in leftovers:
            self.cancel_task(task)
        self.inner.close(max(0.0, deadline - time.monotonic()))
        for unregister in self._unregister:
            unregister()
        forget(self)


_NO_OPTIONS = SubmitOptions()


def _when_done(handle: Handle, callback: Callable[[], None]) -> None:
    """Run ``callback()`` once ``handle`` is final (now, if it already is)."""
    source: Any = handle._source
    if isinstance(source, Task):
        source.add_done_callback(callback)
        return
    future = getattr(source, "future", None)
    if future is not None:
        future.add_done_callback(lambda _: callback())
        return
    if handle.done():  # pragma: no cover - every in-process source is one of the above
        callback()
        return
    raise TypeError(f"cannot follow the completion of {type(source).__name__}")  # pragma: no cover
