"""``channels``: bounded message-passing pipelines (stage → stage, per-stage concurrency).

A :class:`Pipeline` is a chain of stages joined by bounded memory channels
(:func:`open_channel`, trio's close semantics, usable from threads and loops)::

    pipe = (
        Pipeline(rows, name="import")
        .stage(parse, concurrency=2, buffer=64)
        .stage(enrich, concurrency=8)          # an ``async def`` stage runs as tasks on a loop
        .stage(store, concurrency=1)
    )
    results = pipe.run()                        # in input order; or pipe.map(...) to stream

    with pipe.start() as run:                   # long-lived: feed items, each gets a Handle
        handle = run.submit(row)                # blocks while stage 1 is full (backpressure)
        ...
    # leaving the block closes the intake and drains: every accepted item is processed

Each stage is a function of one item returning the item for the next stage. A sync stage
runs on ``concurrency`` threads; an ``async def`` stage on ``concurrency`` tasks of one
loop thread owned by the run. Each stage reads from its own bounded channel; every worker
holds a clone of its input and of the next stage's input, so when the intake closes the
end-of-channel ripples down stage by stage only after every buffer has drained.

What the model keeps of "completes exactly once, its result observed, no failure discards
another's": every accepted item is processed by each stage at most once and its handle is
resolved exactly once — with the last stage's value, with the exception a stage raised
(noted with the stage and the item number), or with :class:`~foundry.errors.CancelledError`
when ``close(timeout)`` ran out of time before reaching it. One item's failure never stops
the pipeline. Nothing is persisted: a crash of the process loses what was in flight.

A ``@app.work(stages=N)`` unit whose function takes a ``Pipeline`` is a *pipeline
builder*: Foundry calls it once with an empty pipeline named after the unit and runs
what it returns; ``unit.submit(item)`` feeds one item and returns its handle. A unit
whose function is an ordinary per-item function becomes a one-stage pipeline with the
unit's ``concurrency``.

Metrics (labels: ``stage`` = ``"<pipeline>.<stage>"``): buffer fill and blocked senders
per channel, queue depth and oldest-item age per hand-off, and per stage the in-flight,
completed and failed counts and durations (``unit`` = ``"<pipeline>.<stage>"``,
``model`` = ``"channels"``); the pipeline as a whole is reported as ``unit`` = its name.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import dataclasses
import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from foundry.config import DEFAULT_WATCHDOG
from foundry.errors import (
    CancelledError,
    ChannelClosedError,
    ChannelError,
    ChannelFullError,
    DeclarationError,
    SubmitError,
    WorkTimeoutError,
)
from foundry.execute._memory_channel import (
    ChannelStats,
    ReceiveChannel,
    SendChannel,
    open_channel,
)
from foundry.execute.asyncio_loop import LoopThread
from foundry.execute.instrument import IdMaker, UnitMetrics, check_in_process_options
from foundry.handle import FutureSource, Handle
from foundry.observe.metrics import Registry
from foundry.runtime import RuntimeContext, SubmitOptions, UnitSpec

__all__ = [
    "ChannelStats",
    "Pipeline",
    "PipelineRun",
    "ReceiveChannel",
    "SendChannel",
    "Stage",
    "make_runner",
    "open_channel",
]

log = logging.getLogger("foundry.channels")
_new_id = IdMaker("pipe")

MODEL = "channels"
_GRACE = 2.0  # seconds workers get, after close(timeout) ran out, to fail what is left
DEFAULT_BUFFER = 64


@dataclass(frozen=True, slots=True)
class Stage:
    """One step of a pipeline: ``fn(item) -> item`` on ``concurrency`` workers, reading
    from a channel of ``buffer`` items. ``timeout`` bounds one call of an async stage."""

    fn: Callable[[Any], Any]
    name: str
    concurrency: int = 1
    buffer: int = DEFAULT_BUFFER
    timeout: float | None = None
    is_async: bool = False


def _check_count(pipeline: str, field_name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DeclarationError(
            pipeline, field_name, value, "is not an integer ≥ 1", f"give {field_name} as a whole number ≥ 1"
        )
    return value


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or getattr(fn, "is_async", None) is True


@dataclass(frozen=True, slots=True)
class Pipeline:
    """An immutable pipeline description; ``stage()`` returns a longer copy."""

    source: Iterable[Any] | None = None
    name: str = "pipeline"
    metrics: Registry | None = field(default=None, compare=False)
    send_timeout: float | None = 60.0
    """How long a stage waits on a full downstream channel before failing that item."""
    stages: tuple[Stage, ...] = ()
    watchdog: float | None = field(default=DEFAULT_WATCHDOG, compare=False)
    """The loop watchdog's threshold on the loop of ``async def`` stages (``None``: off)."""

    def stage(
        self,
        fn: Callable[[Any], Any],
        *,
        concurrency: int = 1,
        buffer: int = DEFAULT_BUFFER,
        name: str | None = None,
        timeout: float | None = None,
    ) -> Pipeline:
        """Append a stage: ``fn(item)`` (sync or ``async def``) on ``concurrency`` workers,
        reading from a channel that holds ``buffer`` items."""
        index = len(self.stages)
        if not callable(fn):
            raise DeclarationError(
                self.name, f"stages[{index}]", fn, "is not callable", "pass a function of one item"
            )
        _check_count(self.name, f"stages[{index}].concurrency", concurrency)
        _check_count(self.name, f"stages[{index}].buffer", buffer)
        if timeout is not None and timeout <= 0:
            raise DeclarationError(
                self.name, f"stages[{index}].timeout", timeout, "is not positive", "give seconds > 0, or None"
            )
        base = name or getattr(fn, "__name__", None) or f"stage{index}"
        taken = {s.name for s in self.stages}
        unique, n = base, 2
        while unique in taken:
            unique, n = f"{base}#{n}", n + 1
        new = Stage(fn, unique, concurrency, buffer, timeout, _is_async(fn))
        return dataclasses.replace(self, stages=(*self.stages, new))

    @property
    def capacity(self) -> int:
        """The most items the pipeline holds at once (buffers + workers)."""
        return sum(s.buffer + s.concurrency for s in self.stages)

    def start(self) -> PipelineRun:
        """Start the workers; the returned run accepts items until closed."""
        return PipelineRun(self)

    def _items(self, source: Iterable[Any] | None) -> Iterable[Any]:
        items = source if source is not None else self.source
        if items is None:
            raise SubmitError(
                f"pipeline {self.name!r}: no items to run. Fix: pass them to run()/map(), "
                "or build the pipeline with Pipeline(source)"
            )
        if isinstance(items, AsyncIterable):
            raise SubmitError(
                f"pipeline {self.name!r}: run()/map() take a plain iterable. Fix: from async code, "
                "`async with pipe.start() as run:` and `await run.asubmit(item)` per item"
            )
        return items

    def _handles(
        self, source: Iterable[Any] | None, ordered: bool, timeout: float | None
    ) -> Iterator[Handle]:
        """Finished handles, keeping at most ``capacity`` items in flight (bounded memory)."""
        items = iter(self._items(source))
        with self.start() as run:
            window = self.capacity
            pending: deque[tuple[Handle, cf.Future[Any]]] = deque()
            exhausted = False
            while True:
                while not exhausted and len(pending) < window:
                    try:
                        item = next(items)
                    except StopIteration:
                        exhausted = True
                        break
                    pending.append(run._submit(item, None, None))
                if not pending:
                    return
                if ordered:
                    handle, _ = pending.popleft()
                    handle.exception(timeout)  # wait; raises ResultTimeoutError past timeout
                    yield handle
                    continue
                by_future = {future: handle for handle, future in pending}
                done, _ = cf.wait(by_future, timeout, return_when=cf.FIRST_COMPLETED)
                if not done:
                    pending[0][0].exception(0)  # raises the ResultTimeoutError with the usual message
                for future in done:
                    handle = by_future[future]
                    pending.remove((handle, future))
                    yield handle

    def map(
        self, source: Iterable[Any] | None = None, *, ordered: bool = True, timeout: float | None = None
    ) -> Iterator[Any]:
        """Stream results: input order when ``ordered`` (restored at the join), else as
        they finish. A failed item raises when it is reached; the run then drains."""
        for handle in self._handles(source, ordered, timeout):
            yield handle.result(0)

    def run(
        self,
        source: Iterable[Any] | None = None,
        *,
        timeout: float | None = None,
        errors: Literal["raise", "return"] = "raise",
    ) -> list[Any]:
        """Every result in input order. ``errors="return"`` puts a failed item's exception
        in its place instead of raising the first one after the run has drained."""
        if errors not in ("raise", "return"):
            raise SubmitError(f"pipeline {self.name!r}: errors={errors!r}. Fix: use 'raise' or 'return'")
        results: list[Any] = []
        first: BaseException | None = None
        for handle in self._handles(source, True, timeout):
            error = handle.exception(0)
            if error is not None and first is None:
                first = error
            results.append(error if error is not None else handle.result(0))
        if first is not None and errors == "raise":
            raise first
        return results


class _Item:
    __slots__ = ("deadline", "index", "source", "started", "value")

    def __init__(self, index: int, value: Any, deadline: float | None) -> None:
        self.index = index
        self.value = value
        self.deadline = deadline
        self.started = time.perf_counter()
        self.source = FutureSource(on_cancel=_cancel_between_stages)


def _cancel_between_stages() -> bool:
    # A cancelled item is dropped at its next stage boundary; the stage running it now
    # finishes and its output is discarded.
    return True


class PipelineRun:
    """A started pipeline: ``submit`` items, then ``close`` to drain. Thread-safe."""

    def __init__(self, pipeline: Pipeline) -> None:
        if not pipeline.stages:
            raise DeclarationError(
                pipeline.name, "stages", 0, "is empty", "add at least one .stage(fn) before starting"
            )
        self.pipeline = pipeline
        self.name = pipeline.name
        registry = pipeline.metrics if pipeline.metrics is not None else Registry()
        self.metrics = registry
        self._lock = threading.Lock()
        self._closing = False
        self._abandoned = False
        self._count = 0
        self.accepted = 0
        self.finished = 0
        self._unit = UnitMetrics(registry, pipeline.name, MODEL, in_flight=self._in_pipeline)
        self._stage_metrics = [UnitMetrics(registry, f"{self.name}.{s.name}", MODEL) for s in pipeline.stages]
        pairs = [
            open_channel(
                s.buffer, name=f"{self.name}.{s.name}", metrics=registry, send_timeout=pipeline.send_timeout
            )
            for s in pipeline.stages
        ]
        self._channels = pairs
        self._intake: SendChannel[_Item] = pairs[0][0]
        self._threads: list[threading.Thread] = []
        self._loop: LoopThread | None = None
        self._tasks: list[cf.Future[Any]] = []
        workers: list[tuple[int, ReceiveChannel[_Item], SendChannel[_Item] | None]] = []
        for index, stage in enumerate(pipeline.stages):
            rx = pairs[index][1]
            tx = pairs[index + 1][0] if index + 1 < len(pairs) else None
            workers.extend((index, rx.clone(), tx.clone() if tx else None) for _ in range(stage.concurrency))
        for index, (tx, rx) in enumerate(pairs):  # the workers hold clones now
            rx.close()
            if index > 0:
                tx.close()
        for index, rx, tx in workers:
            stage = pipeline.stages[index]
            if stage.is_async:
                if self._loop is None:
                    self._loop = self._new_loop(pipeline, registry)
                coro = self._async_worker(index, rx, tx)
                self._tasks.append(asyncio.run_coroutine_threadsafe(coro, self._loop.loop))
            else:
                thread = threading.Thread(
                    target=self._sync_worker,
                    args=(index, rx, tx),
                    name=f"foundry-{self.name}-{stage.name}",
                    daemon=True,
                )
                self._threads.append(thread)
                thread.start()

    def _new_loop(self, pipeline: Pipeline, registry: Registry) -> LoopThread:
        """The loop of the async stages, watched unless ``pipeline.watchdog`` is off
        (``foundry_loop_lag_seconds{loop="channels:<pipeline>"}``; a stall names the stage)."""
        from foundry.observe.stall import Target

        stages = [Target(pipeline.name, s.fn, phase=s.name) for s in pipeline.stages if s.is_async]
        return LoopThread(
            f"foundry-{self.name}-loop",
            label=f"channels:{self.name}",
            watchdog=pipeline.watchdog,
            registry=registry,
            units=stages,
        )

    # -- intake -------------------------------------------------------------

    def _new_item(self, value: Any, timeout: float | None) -> _Item:
        with self._lock:
            if self._closing:
                raise ChannelClosedError(
                    f"pipeline {self.name!r} is closed (draining or stopped); the item was not accepted. "
                    "Fix: submit before close(), or start a new run"
                )
            index = self._count  # numbered from 0 in submit order
            self._count += 1
        return _Item(index, value, None if timeout is None else time.monotonic() + timeout)

    def _accepted(self, item: _Item) -> Handle:
        with self._lock:
            self.accepted += 1
        return Handle(_new_id(), self.name, item.source)

    def _submit(self, value: Any, timeout: float | None, wait: float | None) -> tuple[Handle, cf.Future[Any]]:
        item = self._new_item(value, timeout)
        self._intake.send(item, self.pipeline.send_timeout if wait is None else wait)
        return self._accepted(item), item.source.future

    def submit(self, value: Any, *, timeout: float | None = None, wait: float | None = None) -> Handle:
        """Feed one item. Blocks while the first stage is full (backpressure) up to
        ``wait`` s (default: the pipeline's ``send_timeout``), then raises
        :class:`~foundry.errors.ChannelFullError` and the item is not accepted.
        ``timeout`` is the item's own deadline, checked at every stage boundary."""
        return self._submit(value, timeout, wait)[0]

    def try_submit(self, value: Any, *, timeout: float | None = None) -> Handle | None:
        """Feed one item if the first stage has room now; ``None`` when it is full."""
        item = self._new_item(value, timeout)
        try:
            self._intake.send_nowait(item)
        except ChannelFullError:
            return None
        return self._accepted(item)

    async def asubmit(self, value: Any, *, timeout: float | None = None, wait: float | None = None) -> Handle:
        """``submit`` from async code: waits for room without blocking the loop."""
        item = self._new_item(value, timeout)
        await self._intake.asend(item, self.pipeline.send_timeout if wait is None else wait)
        return self._accepted(item)

    # -- workers ------------------------------------------------------------

    def _finish(self, item: _Item, value: Any = None, error: BaseException | None = None) -> None:
        """The item leaves the pipeline: exactly once per accepted item."""
        future = item.source.future
        try:
            if error is None:
                future.set_result(value)
            else:
                future.set_exception(error)
        except cf.InvalidStateError:  # cancelled by its caller meanwhile
            error = error or CancelledError("cancelled by its caller")
        with self._lock:
            self.finished += 1
        now = time.perf_counter()
        if error is None:
            self._unit.ok(now - item.started, now)
        else:
            self._unit.fail(now - item.started)

    def _in_pipeline(self) -> float:
        return float(self.accepted - self.finished)

    def _admit(self, item: _Item, index: int) -> bool:
        if item.source.future.done():  # its caller cancelled it
            self._finish(item)
            return False
        stage = self.pipeline.stages[index]
        if self._abandoned:
            self._finish(
                item,
                error=CancelledError(
                    f"pipeline {self.name!r}: item #{item.index} had not reached stage {stage.name!r} when "
                    "close(timeout) ran out; it was not processed. Fix: give close() more time"
                ),
            )
            return False
        if item.deadline is not None and time.monotonic() > item.deadline:
            self._finish(
                item,
                error=WorkTimeoutError(
                    f"pipeline {self.name!r}: item #{item.index} passed its timeout before stage "
                    f"{stage.name!r}; it was not processed further. Fix: raise the timeout, or add "
                    "concurrency to the slow stage"
                ),
            )
            return False
        if index == 0:
            item.source.running = True
        return True

    def _failed(self, item: _Item, index: int, error: BaseException) -> None:
        stage = self.pipeline.stages[index]
        error.add_note(
            f"pipeline {self.name!r}, stage {stage.name!r}: item #{item.index} failed here; "
            "the other items carry on"
        )
        self._finish(item, error=error)

    @staticmethod
    @contextlib.contextmanager
    def _measured(metrics: UnitMetrics) -> Iterator[None]:
        metrics.begin()
        started = time.perf_counter()
        try:
            yield
        except BaseException:
            metrics.fail(time.perf_counter() - started)
            raise
        now = time.perf_counter()
        metrics.ok(now - started, now)

    def _handed_on(self, item: _Item, index: int, value: Any, tx: SendChannel[_Item] | None) -> bool:
        """``True`` when the item goes on to the next stage (else it is finished here)."""
        if tx is None:
            self._finish(item, value)
            return False
        item.value = value
        return True

    def _forwarded(self, item: _Item, index: int, error: ChannelError) -> None:
        error.add_note(
            f"pipeline {self.name!r}: item #{item.index} could not be handed on after stage {index}"
        )
        self._finish(item, error=error)

    def _retire(self, index: int, rx: ReceiveChannel[_Item], tx: SendChannel[_Item] | None) -> None:
        for item in rx.close():  # only when the stage's last worker died abnormally
            self._finish(
                item,
                error=CancelledError(
                    f"pipeline {self.name!r}: every worker of stage {self.pipeline.stages[index].name!r} "
                    f"stopped before item #{item.index} reached it"
                ),
            )
        if tx is not None:
            tx.close()

    def _sync_worker(self, index: int, rx: ReceiveChannel[_Item], tx: SendChannel[_Item] | None) -> None:
        stage = self.pipeline.stages[index]
        metrics = self._stage_metrics[index]
        try:
            for item in rx:
                if not self._admit(item, index):
                    continue
                try:
                    with self._measured(metrics):
                        value = stage.fn(item.value)
                except BaseException as exc:
                    self._failed(item, index, exc)
                    if not isinstance(exc, Exception):
                        raise
                    continue
                if self._handed_on(item, index, value, tx):
                    assert tx is not None
                    try:
                        tx.send(item)
                    except ChannelError as exc:
                        self._forwarded(item, index, exc)
        finally:
            self._retire(index, rx, tx)

    async def _async_worker(
        self, index: int, rx: ReceiveChannel[_Item], tx: SendChannel[_Item] | None
    ) -> None:
        stage = self.pipeline.stages[index]
        metrics = self._stage_metrics[index]
        try:
            async for item in rx:
                if not self._admit(item, index):
                    continue
                limit = stage.timeout
                if item.deadline is not None:
                    left = max(0.0, item.deadline - time.monotonic())
                    limit = left if limit is None else min(limit, left)
                limiter = asyncio.timeout(limit)
                try:
                    with self._measured(metrics):
                        async with limiter:
                            value = await stage.fn(item.value)
                except TimeoutError as exc:
                    error: BaseException = exc
                    if limiter.expired():
                        error = WorkTimeoutError(
                            f"pipeline {self.name!r}, stage {stage.name!r}: item #{item.index} ran longer "
                            f"than {limit:.3g}s and was cancelled. Fix: raise the stage's timeout, "
                            "or make it faster"
                        )
                    self._failed(item, index, error)
                    continue
                except asyncio.CancelledError:
                    self._failed(item, index, CancelledError(f"pipeline {self.name!r} was stopped"))
                    raise
                except Exception as exc:
                    self._failed(item, index, exc)
                    continue
                if self._handed_on(item, index, value, tx):
                    assert tx is not None
                    try:
                        await tx.asend(item)
                    except ChannelError as exc:
                        self._forwarded(item, index, exc)
        finally:
            self._retire(index, rx, tx)

    # -- shutdown -----------------------------------------------------------

    def _alive(self) -> bool:
        return any(t.is_alive() for t in self._threads) or any(not f.done() for f in self._tasks)

    def _join(self, deadline: float) -> None:
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for task in self._tasks:
            try:
                task.exception(max(0.0, deadline - time.monotonic()))
            except (cf.TimeoutError, cf.CancelledError):
                pass

    def close(self, timeout: float = 30.0) -> None:
        """Stop accepting, let every stage drain what it accepted (up to ``timeout`` s),
        and stop. Items not reached in time are failed with ``CancelledError`` (never
        dropped silently); a sync stage already running an item is not interrupted."""
        with self._lock:
            self._closing = True
        self._intake.close()
        self._join(time.monotonic() + timeout)
        if self._alive():
            self._abandoned = True
            if self._loop is not None:
                for task in self._tasks:
                    task.cancel()
            self._join(time.monotonic() + _GRACE)
            if self._alive():
                log.warning(
                    "pipeline %r: close(%ss) left workers running (a stage call is still running); "
                    "their items will resolve when it returns",
                    self.name,
                    timeout,
                )
        if self._loop is not None and not any(not f.done() for f in self._tasks):
            self._loop.stop(timeout=2.0)
        for metrics in (self._unit, *self._stage_metrics):
            metrics.close()

    def cancel(self) -> None:
        """Stop now: items not yet started by their next stage fail with ``CancelledError``."""
        self._abandoned = True
        self.close(timeout=0.0)

    def stats(self) -> list[ChannelStats]:
        """One snapshot per stage's input channel."""
        return [rx.statistics() for _, rx in self._channels]

    def __enter__(self) -> PipelineRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> PipelineRun:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)


# -- the runner for @app.work(stages=N) units ---------------------------------------


def _is_builder(fn: Callable[..., Any]) -> bool:
    if getattr(fn, "__foundry_pipeline_builder__", False):
        return True
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    if len(params) != 1:
        return False
    annotation = params[0].annotation
    if annotation is Pipeline:
        return True
    return isinstance(annotation, str) and annotation.rsplit(".", 1)[-1] == "Pipeline"


def build_pipeline(
    spec: UnitSpec, metrics: Registry | None, watchdog: float | None = DEFAULT_WATCHDOG
) -> tuple[Pipeline, str | None]:
    """The unit's pipeline and a note saying how it was made."""
    base = Pipeline(name=spec.name, metrics=metrics, watchdog=watchdog)
    traits = spec.traits
    if _is_builder(spec.fn):
        built = spec.fn(base)
        if not isinstance(built, Pipeline) or not built.stages:
            raise DeclarationError(
                spec.name,
                "fn",
                built,
                "is a pipeline builder that did not return a Pipeline with stages",
                "return the pipeline: `def unit(p: Pipeline) -> Pipeline: return p.stage(a).stage(b)`",
            )
        if traits.stages is not None and traits.stages != len(built.stages):
            raise DeclarationError(
                spec.name,
                "stages",
                traits.stages,
                f"does not match the builder, which made {len(built.stages)} stages",
                f"declare stages={len(built.stages)}, or leave stages= out",
            )
        return built, None
    concurrency = traits.workers or spec.decision.load.concurrency or traits.concurrency or 1
    single = base.stage(spec.fn, concurrency=concurrency, buffer=traits.max_pending or DEFAULT_BUFFER)
    return single, (
        f"one-stage pipeline: {spec.name}'s function takes an item, not a Pipeline; "
        f"it runs on {concurrency} worker(s) behind a channel"
    )


class ChannelsRunner:
    """Runs a ``channels`` unit: one long-lived pipeline run, started at first submit."""

    def __init__(self, spec: UnitSpec, ctx: RuntimeContext) -> None:
        self.spec = spec
        self.pipeline, note = build_pipeline(spec, ctx.metrics, ctx.settings.watchdog)
        self.notes: list[str] = [note] if note else []
        self._run: PipelineRun | None = None
        self._lock = threading.Lock()

    @property
    def map_window(self) -> int:
        """How many items ``unit.map`` keeps in flight: what the pipeline can hold."""
        return self.pipeline.capacity

    @property
    def run(self) -> PipelineRun:
        with self._lock:
            if self._run is None:
                self._run = self.pipeline.start()
            return self._run

    def _item(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Any:
        check_in_process_options(self.spec.name, MODEL, options)
        if len(args) != 1 or kwargs:
            raise SubmitError(
                f"unit {self.spec.name!r}: a pipeline takes one item per submit, got {len(args)} positional "
                f"and {len(kwargs)} keyword arguments. Fix: pass one value (a tuple or dict if you need more)"
            )
        return args[0]

    def _timeout(self, options: SubmitOptions) -> float | None:
        return options.timeout if options.timeout is not None else self.spec.traits.timeout

    def submit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        value = self._item(args, kwargs, options)
        return self.run.submit(value, timeout=self._timeout(options))

    async def asubmit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        value = self._item(args, kwargs, options)
        return await self.run.asubmit(value, timeout=self._timeout(options))

    def try_submit(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions
    ) -> Handle | None:
        """Feed one item without blocking; ``None`` when the first stage is full (per-key lanes)."""
        value = self._item(args, kwargs, options)
        return self.run.try_submit(value, timeout=self._timeout(options))

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.submit(args, kwargs, SubmitOptions()).result()

    def close(self, timeout: float = 10.0) -> None:
        with self._lock:
            run, self._run = self._run, None
        if run is not None:
            run.close(timeout)


def make_runner(spec: UnitSpec, ctx: RuntimeContext) -> ChannelsRunner:
    """The ``channels`` runner for ``spec`` (see the module docstring)."""
    return ChannelsRunner(spec, ctx)
