"""Orchestrated workflows: durable steps, compensation, recovery — over a journal.

``@app.workflow`` functions receive a :class:`WorkflowContext` (``wf``) and make every
side effect a durable call (``wf.step``, ``wf.sleep``, ``wf.wait_for``, ``wf.child``).
Each call's outcome is journaled (``foundry.backends.journal``); a run that dies is
resumed by any process from the journal, replaying completed calls without re-running
them. See ``docs/workflows.md`` for the model and its guarantees.

Public surface: :class:`WorkflowContext`, :class:`Worker`, :class:`WorkflowRuntime`,
:func:`configure` (options of an app's runtime), and
:func:`make_runner` (the ``runner_for`` route of ``foundry.app``).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from foundry.backends.journal import Clock, JournalBackend, ManualClock, open_journal
from foundry.deliver.workflow.context import AsyncWorkflowContext, WorkflowContext
from foundry.deliver.workflow.runtime import WorkflowRuntime, WorkflowSource, journal_from
from foundry.deliver.workflow.worker import AppLike, Worker
from foundry.errors import SubmitError
from foundry.handle import Handle
from foundry.runtime import RuntimeContext, SubmitOptions, UnitSpec

__all__ = [
    "AsyncWorkflowContext",
    "ManualClock",
    "Worker",
    "WorkflowContext",
    "WorkflowRuntime",
    "WorkflowSource",
    "configure",
    "make_runner",
    "runtime_for",
]

# One runtime per app (keyed by its metrics registry, which is per app) per process.
_SHARED: dict[int, list[Any]] = {}  # key -> [runtime, refs, pinned]
_LOCK = threading.Lock()


def _key(ctx: RuntimeContext) -> int:
    return id(ctx.metrics)


def _register(key: int, rt: WorkflowRuntime, *, pinned: bool) -> None:
    def forget() -> None:
        with _LOCK:
            if key in _SHARED and _SHARED[key][0] is rt:
                del _SHARED[key]

    rt.on_close = forget
    _SHARED[key] = [rt, 0, pinned]


def runtime_for(ctx: RuntimeContext) -> WorkflowRuntime:
    """The app's shared runtime (made on first use from ``ctx.settings.journal``); each
    call takes a reference that :func:`release` gives back."""
    with _LOCK:
        entry = _SHARED.get(_key(ctx))
        if entry is None:
            rt = WorkflowRuntime(
                open_journal(ctx.settings.journal),
                ctx.lookup,
                metrics=ctx.metrics,
                errors=ctx.errors,
                watchdog=ctx.settings.watchdog,
                tracing=ctx.tracing,
            )
            _register(_key(ctx), rt, pinned=False)
            entry = _SHARED[_key(ctx)]
        entry[1] += 1
        return entry[0]  # type: ignore[no-any-return]


def release(rt: WorkflowRuntime, timeout: float = 10.0) -> None:
    """Give back a reference; the last one closes an unpinned runtime."""
    close = False
    with _LOCK:
        for entry in _SHARED.values():
            if entry[0] is rt:
                entry[1] -= 1
                close = entry[1] <= 0 and not entry[2]
                break
    if close:
        rt.close(timeout)


def configure(
    app: AppLike,
    *,
    journal: str | JournalBackend | None = None,
    clock: Clock | None = None,
    **options: Any,
) -> WorkflowRuntime:
    """Set the options of ``app``'s workflow runtime in this process, before its first
    use: ``journal`` (a URL or an open backend), ``clock``, ``lease``, ``inline_wait``,
    ``poll``, ``concurrency``, ``max_pending``. Close it with ``runtime.close()``."""
    ctx = app.context()
    with _LOCK:
        if _key(ctx) in _SHARED:
            raise SubmitError(
                f"app {ctx.app_name!r}: its workflow runtime is already running. Fix: call "
                "configure() before starting any workflow of this app"
            )
        backend, own = journal_from(journal, ctx.settings.journal, clock)
        options.setdefault("watchdog", ctx.settings.watchdog)
        options.setdefault("tracing", ctx.tracing)
        rt = WorkflowRuntime(
            backend, ctx.lookup, metrics=ctx.metrics, own_journal=own, errors=ctx.errors, **options
        )
        _register(_key(ctx), rt, pinned=True)
        return rt


class UnitRunner:
    """The :class:`~foundry.runtime.Runner` of one workflow unit over the shared runtime."""

    def __init__(self, spec: UnitSpec, ctx: RuntimeContext) -> None:
        self.spec = spec
        self._ctx = ctx
        self._runtime = runtime_for(ctx)
        self._closed = False

    @property
    def runtime(self) -> WorkflowRuntime:
        """The app's runtime; a new one if the previous was closed (``runtime.close()``)."""
        if self._runtime.closed and not self._closed:
            self._runtime = runtime_for(self._ctx)
        return self._runtime

    def submit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        if options.delay is not None or options.eta is not None or options.priority:
            raise SubmitError(
                f"workflow {self.spec.name!r}: delay/eta/priority are not workflow options. Fix: call "
                "wf.sleep(...) as the workflow's first durable call"
            )
        return self.runtime.start(self.spec, args, kwargs, id=options.key)

    async def asubmit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        return await asyncio.to_thread(self.submit, args, kwargs, options)

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.runtime.run(self.spec, args, kwargs)

    def close(self, timeout: float = 10.0) -> None:
        if not self._closed:
            self._closed = True
            release(self._runtime, timeout)


def make_runner(spec: UnitSpec, ctx: RuntimeContext) -> UnitRunner:
    return UnitRunner(spec, ctx)
