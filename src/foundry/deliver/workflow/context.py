"""The ``wf`` a workflow function receives: its only door to the outside world.

``def`` workflows get a :class:`WorkflowContext`, ``async def`` workflows an
:class:`AsyncWorkflowContext` whose durable calls are awaited; both record into the same
journal in the same way (``run``). Everything that must happen once, or that is not
deterministic (I/O, time, random numbers), goes through a durable call; the rest of the
function must be deterministic, because a resumed run re-executes it against the journal.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from foundry.backends.journal.base import EntryKind
from foundry.deliver.workflow._plan import Branch, StepCall, adrive, drive, name_of, run_coroutine
from foundry.deliver.workflow.gather import gather as _gather
from foundry.deliver.workflow.run import MISSING
from foundry.errors import DeclarationError, SubmitError
from foundry.retry import Backoff
from foundry.traits import parse_duration

if TYPE_CHECKING:
    from foundry.deliver.workflow.run import Run

__all__ = ["AsyncWorkflowContext", "WorkflowContext"]

BackoffLike = float | str | Callable[[int], float] | Backoff

# The defaults of a step's options, named so that ``WorkflowContext.step`` can tell by
# identity that none was given (that step takes the lean path, ``Run.plain_step``).
_RETRIES = 0
_BACKOFF = 1.0
_MAX_BACKOFF = 300.0
_ANY_ERROR: tuple[type[BaseException], ...] = (Exception,)
_UNDO_RETRIES = 3


class _Context:
    """What both contexts share: identity, queries of the run, versioning, published
    state and the descriptions of fan-out branches."""

    def __init__(self, run: Run) -> None:
        self._run = run

    @property
    def id(self) -> str:
        """The workflow id (its idempotency key)."""
        return self._run.claim.id

    @property
    def name(self) -> str:
        return self._run.claim.name

    @property
    def parent_id(self) -> str | None:
        return self._run.claim.parent_id

    @property
    def run_number(self) -> int:
        """1 for the first run, +1 for each resumption (recovery, wake-up)."""
        return self._run.claim.claims

    @property
    def is_replaying(self) -> bool:
        """True while the code is re-walking positions the journal already has."""
        return self._run.pos < self._run.history_end

    @property
    def cancel_requested(self) -> bool:
        return self._run.cancel_requested

    @property
    def deadline(self) -> float | None:
        """When the workflow times out (unix seconds; its ``timeout=``), or ``None``."""
        return self._run.deadline

    # -- versioning --------------------------------------------------------------------

    def patched(self, name: str) -> bool:
        """``True`` when this run takes the new code path of patch ``name``.

        A run that reaches this point with nothing recorded here yet (a new run, or an old
        one resuming past its last record) records a marker and takes the new path; a run
        recorded by the code from before the patch, whose journal has something else here,
        takes the old path (``False``) and records nothing. Ask once per patch: the answer
        is remembered for the rest of the run::

            if wf.patched("new-pricing"):
                price = wf.step(price_v2, order)
            else:
                price = wf.step(price_v1, order)

        Once no run recorded before the patch is in flight, drop the old branch and call
        :meth:`deprecate_patch` where ``patched`` was, then remove that too.
        """
        _check_name(self, "patched", name)
        return self._run.patched(name)

    def deprecate_patch(self, name: str) -> None:
        """Where ``patched(name)`` was: step over its marker in the runs that recorded one,
        record nothing in the others. The code after it is the new path only."""
        _check_name(self, "deprecate_patch", name)
        self._run.deprecate_patch(name)

    # -- queries -------------------------------------------------------------------------

    def publish(self, **values: Any) -> None:
        """Merge ``values`` (JSON) into the state anyone can read without changing the run:
        ``unit.query(id)``, ``runtime.query(id)``, ``foundry workflows query ID``, the
        dashboard. Written to the journal at once (not while replaying what it has)."""
        self._run.publish(values)

    @property
    def published(self) -> dict[str, Any]:
        """What this run published so far."""
        return dict(self._run.published)

    # -- fan-out branches -----------------------------------------------------------------

    def branch(
        self,
        fn: Callable[..., Any],
        *args: Any,
        name: str | None = None,
        retries: int = 0,
        backoff: BackoffLike = 1.0,
        max_backoff: float = 300.0,
        timeout: float | str | None = None,
        retry_on: tuple[type[BaseException], ...] = (Exception,),
        undo: Callable[..., Any] | None = None,
        undo_retries: int = 3,
    ) -> Branch:
        """A step for :meth:`gather`, described, not run: the options of ``step``."""
        call = _step_call(
            self, fn, args, name, retries, backoff, max_backoff, timeout, retry_on, undo, undo_retries, False
        )
        return Branch(EntryKind.STEP, call.name, call=call)

    def child_branch(self, workflow: Any, *args: Any, id: str | None = None, **kwargs: Any) -> Branch:
        """A child workflow for :meth:`gather` (its id defaults to ``"<parent id>/<position>"``)."""
        name = workflow if isinstance(workflow, str) else str(workflow.name)
        return Branch(EntryKind.CHILD, name, args=args, kwargs=kwargs, child_id=id)

    def _map_branches(
        self, fn: Callable[..., Any], items: Iterable[Any], options: dict[str, Any]
    ) -> list[Branch]:
        return [self.branch(fn, item, **options) for item in items]

    def __repr__(self) -> str:
        return f"<wf {self.name} {self.id} position={self._run.pos}>"


class WorkflowContext(_Context):
    """The ``wf`` of a ``def`` workflow function (see the module docstring)."""

    def step(
        self,
        fn: Callable[..., Any],
        *args: Any,
        name: str | None = None,
        retries: int = _RETRIES,
        backoff: BackoffLike = _BACKOFF,
        max_backoff: float = _MAX_BACKOFF,
        timeout: float | str | None = None,
        retry_on: tuple[type[BaseException], ...] = _ANY_ERROR,
        undo: Callable[..., Any] | None = None,
        undo_retries: int = _UNDO_RETRIES,
        transactional: bool = False,
    ) -> Any:
        """Run ``fn(*args)`` once for this workflow and return its (journaled) result.

        ``retries`` more attempts follow a failure in ``retry_on``, ``backoff`` seconds
        apart (the shared policy, ``foundry.retry``: doubling up to ``max_backoff``, with
        jitter; or ``backoff=fn(retry) -> seconds``; a long back-off parks the workflow in
        the journal instead of holding a worker). ``timeout`` bounds one attempt; its timer
        is journaled, so it holds across a crash of the worker that started it. When a
        later step fails for good, ``undo(result)`` runs (reverse order, journaled, retried
        ``undo_retries`` times; bind more arguments with ``functools.partial``). With
        ``transactional=True`` the step is called ``fn(tx, *args)`` with a
        :class:`~foundry.backends.journal.base.Tx` on the journal's database and its
        writes commit in the same transaction as its record — exactly once; its undo is
        called ``undo(tx, result)`` the same way. Every other step is at-least-once: a
        crash after its code ran and before its record committed runs it again.
        """
        if (
            retries is _RETRIES
            and timeout is None
            and undo is None
            and transactional is False
            and retry_on is _ANY_ERROR
            and backoff is _BACKOFF
            and max_backoff is _MAX_BACKOFF
            and undo_retries is _UNDO_RETRIES
            and callable(fn)
        ):  # no option given: the lean path, the same journal entries (Run.plain_step)
            return self._run.plain_step(fn, args, name)
        call = _step_call(
            self,
            fn,
            args,
            name,
            retries,
            backoff,
            max_backoff,
            timeout,
            retry_on,
            undo,
            undo_retries,
            transactional,
        )
        return drive(self._run.step(call), self._run.rt)

    def sleep(self, duration: float | str) -> None:
        """Durable sleep: the wake-up time is journaled; a long sleep frees the worker."""
        drive(self._run.sleep(parse_duration(duration, unit=self.name, field_name="sleep")), self._run.rt)

    def wait_for(self, signal: str, timeout: float | str | None = None, default: Any = MISSING) -> Any:
        """Wait for the next signal ``signal`` (``app.signal(id, signal, payload)``) and
        return its payload. Signals sent earlier wait in the durable inbox. On timeout,
        return ``default`` or raise :class:`~foundry.errors.ResultTimeoutError`."""
        seconds = None if timeout is None else parse_duration(timeout, unit=self.name, field_name="timeout")
        return drive(self._run.wait_for(signal, seconds, default), self._run.rt)

    def child(self, workflow: Any, *args: Any, id: str | None = None, **kwargs: Any) -> Any:
        """Start another declared workflow as a run of its own and wait for its result (or
        raise its error). The child has its own journal and compensation, runs on this
        process's pool or on any worker, is cancelled with this workflow, and its id
        defaults to ``"<parent id>/<position>"`` so a resumed parent finds the same child.
        A long wait parks this workflow until the child ends."""
        name = workflow if isinstance(workflow, str) else str(workflow.name)
        return drive(self._run.child(name, args, kwargs, id), self._run.rt)

    def gather(self, *branches: Branch, concurrency: int | None = None, name: str = "gather") -> list[Any]:
        """Run ``branches`` (``wf.branch(...)``, ``wf.child_branch(...)``) concurrently, at
        most ``concurrency`` at once, and return their results in order. Each branch is
        journaled; a resumed run runs only the unfinished ones. The first branch to fail
        for good stops the others and the gather raises its error; the completed branches
        are compensated (reverse order of completion) with the rest of the workflow."""
        return run_coroutine(_gather(self._run, branches, concurrency=concurrency, name=name))

    def map(
        self,
        fn: Callable[..., Any],
        items: Iterable[Any],
        *,
        concurrency: int | None = None,
        name: str | None = None,
        **step_options: Any,
    ) -> list[Any]:
        """``gather`` of ``fn(item)`` for each item, with the options of ``step``."""
        branches = self._map_branches(fn, items, step_options)
        return self.gather(*branches, concurrency=concurrency, name=name or f"map {name_of(fn)}")

    def now(self) -> float:
        """The current time, journaled (the same value on every replay)."""
        return float(self.step(self._run.rt.clock.time, name="wf.now"))

    def uuid(self) -> str:
        """A random id, journaled (the same value on every replay)."""
        return str(self.step(_new_uuid, name="wf.uuid"))


class AsyncWorkflowContext(_Context):
    """The ``wf`` of an ``async def`` workflow function: the durable calls are awaited.

    One durable call at a time: positions must come in the same order on every replay,
    so run calls concurrently with :meth:`gather` / :meth:`map`, never by handing several
    of them to ``asyncio.gather`` yourself (that is refused with a :class:`SubmitError`).
    """

    def __init__(self, run: Run) -> None:
        super().__init__(run)
        self._busy: str | None = None

    @contextmanager
    def _one(self, what: str) -> Iterator[None]:
        if self._busy is not None:
            raise SubmitError(
                f"workflow {self.name!r}: {what} started while {self._busy} is still running; durable "
                "calls of one workflow must come one at a time (their positions are replayed in "
                "order). Fix: run them concurrently with `await wf.gather(wf.branch(...), ...)`"
            )
        self._busy = what
        try:
            yield
        finally:
            self._busy = None

    async def step(
        self,
        fn: Callable[..., Any],
        *args: Any,
        name: str | None = None,
        retries: int = 0,
        backoff: BackoffLike = 1.0,
        max_backoff: float = 300.0,
        timeout: float | str | None = None,
        retry_on: tuple[type[BaseException], ...] = (Exception,),
        undo: Callable[..., Any] | None = None,
        undo_retries: int = 3,
        transactional: bool = False,
    ) -> Any:
        """:meth:`WorkflowContext.step`, awaited: an ``async def`` step runs on this loop, a
        synchronous one on a thread (a transactional one on the loop: keep it short)."""
        call = _step_call(
            self,
            fn,
            args,
            name,
            retries,
            backoff,
            max_backoff,
            timeout,
            retry_on,
            undo,
            undo_retries,
            transactional,
        )
        with self._one(f"step {call.name!r}"):
            return await adrive(self._run.step(call), self._run.rt)

    async def sleep(self, duration: float | str) -> None:
        seconds = parse_duration(duration, unit=self.name, field_name="sleep")
        with self._one("sleep"):
            await adrive(self._run.sleep(seconds), self._run.rt)

    async def wait_for(self, signal: str, timeout: float | str | None = None, default: Any = MISSING) -> Any:
        seconds = None if timeout is None else parse_duration(timeout, unit=self.name, field_name="timeout")
        with self._one(f"wait_for {signal!r}"):
            return await adrive(self._run.wait_for(signal, seconds, default), self._run.rt)

    async def child(self, workflow: Any, *args: Any, id: str | None = None, **kwargs: Any) -> Any:
        name = workflow if isinstance(workflow, str) else str(workflow.name)
        with self._one(f"child {name!r}"):
            return await adrive(self._run.child(name, args, kwargs, id), self._run.rt)

    async def gather(
        self, *branches: Branch, concurrency: int | None = None, name: str = "gather"
    ) -> list[Any]:
        with self._one(f"gather {name!r}"):
            return await _gather(self._run, branches, concurrency=concurrency, name=name)

    async def map(
        self,
        fn: Callable[..., Any],
        items: Iterable[Any],
        *,
        concurrency: int | None = None,
        name: str | None = None,
        **step_options: Any,
    ) -> list[Any]:
        branches = self._map_branches(fn, items, step_options)
        return await self.gather(*branches, concurrency=concurrency, name=name or f"map {name_of(fn)}")

    async def now(self) -> float:
        return float(await self.step(self._run.rt.clock.time, name="wf.now"))

    async def uuid(self) -> str:
        return str(await self.step(_new_uuid, name="wf.uuid"))


@functools.lru_cache(maxsize=256)
def _policy(base: float, cap: float) -> Backoff:
    """The checked policy of a step's ``backoff=``/``max_backoff=`` (one per pair: a
    step's options are read on every call, replayed or not)."""
    return Backoff(base, cap)


def _new_uuid() -> str:
    return uuid.uuid4().hex


def _check_name(ctx: _Context, what: str, name: object) -> None:
    if not isinstance(name, str) or not name or not name.isprintable() or len(name) > 200:
        raise SubmitError(
            f"workflow {ctx.name!r}: {what}({name!r}) needs a patch name: a short printable string. "
            'Fix: e.g. wf.patched("new-pricing")'
        )


def _step_call(
    ctx: _Context,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    name: str | None,
    retries: int,
    backoff: BackoffLike,
    max_backoff: float,
    timeout: float | str | None,
    retry_on: tuple[type[BaseException], ...],
    undo: Callable[..., Any] | None,
    undo_retries: int,
    transactional: bool,
) -> StepCall:
    """A checked :class:`StepCall`; bad options are a :class:`SubmitError` naming them."""
    step = name or name_of(fn)
    if not callable(fn):
        raise SubmitError(f"workflow {ctx.name!r}: step {step!r} is given {fn!r}, which is not callable")
    for field, value in (("retries", retries), ("undo_retries", undo_retries)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SubmitError(
                f"workflow {ctx.name!r}: step {step!r} {field}={value!r} is not a whole number ≥ 0. "
                f"Fix: e.g. {field}=3"
            )
    if undo is not None and not callable(undo):
        raise SubmitError(f"workflow {ctx.name!r}: step {step!r} undo={undo!r} is not callable")
    seconds = None if timeout is None else parse_duration(timeout, unit=ctx.name, field_name="timeout")
    policy: Backoff | Callable[[int], float]
    if isinstance(backoff, Backoff) or callable(backoff):
        policy = backoff
    else:
        base = (
            parse_duration(backoff, unit=ctx.name, field_name="backoff")
            if isinstance(backoff, str)
            else backoff
        )
        try:
            policy = _policy(base, max_backoff)
        except (DeclarationError, TypeError):  # again, to name the step in the error
            policy = Backoff(base, max_backoff, owner=f"{ctx.name} step {step}")
    return StepCall(fn, args, step, retries, policy, seconds, retry_on, undo, undo_retries, transactional)
