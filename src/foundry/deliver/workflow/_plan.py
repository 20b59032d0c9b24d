"""How a durable call is written once and run by a sync and an async workflow alike.

Each durable call (``wf.step``, ``wf.sleep``, ``wf.wait_for``, ``wf.child``) is a *plan*:
a generator that does the journal's part itself (positions, replay, records, retries)
and *yields* the two things that depend on how the workflow runs:

* :class:`Nap` — wait this long on the journal's clock (a commit after ``mark`` ends it
  early), and
* :class:`Invoke` — run one attempt of a step's code, stopping it at ``until``.

:func:`drive` carries a plan out in the calling thread (a ``def`` workflow);
:func:`adrive` on the running event loop (an ``async def`` workflow, and the branches of
a fan-out, which run on a loop of their own in a ``def`` workflow). Only these two and
the ``invoke_*`` functions below know threads and loops; the journal logic exists once.

The control-flow exceptions are ``BaseException`` subclasses so that ``except Exception``
in workflow code cannot swallow them.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import math
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from foundry.backends.journal.base import SystemClock
from foundry.retry import Backoff

if TYPE_CHECKING:
    from foundry.deliver.workflow._host import RunHost

__all__ = [
    "RUNNING",
    "Branch",
    "Invoke",
    "Nap",
    "Plan",
    "StepCall",
    "adrive",
    "drive",
    "is_async_fn",
    "name_of",
    "run_coroutine",
]

T = TypeVar("T")
FOREVER = math.inf
RUNNING = "running"  # ``detail`` of a waiting step entry: a timed attempt in flight, ``wake_at`` its end
DEFAULT_BACKOFF = Backoff()  # a step's default: 1 s doubling to 5 min, equal jitter
_SETTLE = 5.0  # seconds a cancelled step gets to run its finally blocks before it is left
_SLICE = 0.05  # how often a wait on a manual clock (tests) looks at it again


# -- control flow ------------------------------------------------------------------------


class _Control(BaseException):
    """Ends this run without recording an outcome; the journal says how to go on."""


class _Suspend(_Control):
    def __init__(self, wake_at: float, what: str) -> None:
        super().__init__(what)
        self.wake_at = wake_at
        self.what = what


class _Release(_Control):
    """The worker is stopping: give the lease back so another worker resumes at once."""


class _Lost(_Control):
    """Another run owns the workflow now (our lease lapsed); stop without writing."""


class _Infra(_Control):
    """The journal failed past our retries; stop, the lease will lapse and a run resumes."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class _SetAside(_Control):
    """A record of this workflow read from the journal is malformed (its state, an entry,
    a signal): the run ends failed with the reason, without compensating — the journal
    that says what was done can no longer be trusted."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class _EndOfHistory(_Control):
    """Replay only (``foundry workflows replay``): the code reached a position the journal
    holds no final record of. Everything from here on is new code: nothing to check."""


class _Expired(Exception):
    """An attempt ran into the ``until`` of its :class:`Invoke` (and was stopped or left)."""


# -- the calls ---------------------------------------------------------------------------

# StepCall and Invoke are made once per step (and attempt), so they are not frozen: a
# frozen dataclass sets each field through object.__setattr__, a call per field, a share
# of a no-op step worth saving. Nothing changes one once it is made.


@dataclass(slots=True)
class StepCall:
    """One ``wf.step(...)`` call: the code, its arguments and its options."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    name: str
    retries: int = 0
    backoff: Backoff | Callable[[int], float] = DEFAULT_BACKOFF
    timeout: float | None = None
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    undo: Callable[..., Any] | None = None
    undo_retries: int = 3
    transactional: bool = False

    def delay(self, retry: int) -> float:
        """Seconds before retry number ``retry`` (1-based): the shared policy, or the
        step's own ``backoff=fn(retry)``."""
        if isinstance(self.backoff, Backoff):
            return self.backoff.delay(retry)
        return max(0.0, float(self.backoff(retry)))


@dataclass(frozen=True, slots=True)
class Branch:
    """One branch of a fan-out (``wf.branch`` / ``wf.child_branch``): a step or a child
    workflow, described, not yet run."""

    kind: str  # "step" or "child"
    name: str  # the step's or the child workflow's name
    call: StepCall | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] | None = None
    child_id: str | None = None


@dataclass(frozen=True, slots=True)
class Nap:
    """Wait ``seconds`` on the journal's clock; with ``mark`` (``changes.mark()``, taken
    before a look at the journal), a commit after it ends the wait early."""

    mark: int | None
    seconds: float


@dataclass(slots=True)
class Invoke:
    """Run one attempt of ``call``; stop it (or leave its thread) at ``until`` (journal
    clock; ``None``: no limit), raising :class:`_Expired`."""

    call: StepCall
    until: float | None
    what: str
    # the loop watchdog around an ``async def`` step run on a loop of its own (def workflows)
    watch: Callable[[Coroutine[Any, Any, Any]], Coroutine[Any, Any, Any]] | None = None
    # the attempt's trace span (``None``: not traced), current while the step's code runs
    span: Callable[[], AbstractContextManager[Any]] | None = None


Plan = Generator[Nap | Invoke, Any, T]


def name_of(fn: Any) -> str:
    target = getattr(fn, "func", fn)  # functools.partial
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    return str(name or type(target).__name__)


def is_async_fn(fn: Any) -> bool:
    code = getattr(getattr(fn, "func", fn), "__code__", None)
    if code is not None:
        return bool(code.co_flags & inspect.CO_COROUTINE)
    return inspect.iscoroutinefunction(fn)


# -- drivers -----------------------------------------------------------------------------


def drive(plan: Plan[T], rt: RunHost) -> T:
    """Carry ``plan`` out in this thread."""
    send: Any = None
    throw: Exception | None = None
    while True:
        try:
            effect = plan.send(send) if throw is None else plan.throw(throw)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        send = throw = None
        if isinstance(effect, Nap):
            rt.nap(effect.mark, effect.seconds)
            continue
        try:
            send = invoke_sync(effect, rt)
        except Exception as exc:  # the step's failure (or _Expired): the plan decides
            throw = exc


class Tracker:
    """What a fan-out needs to know of one running branch: whether it is inside a
    synchronous attempt (which cannot be interrupted: the fan-out waits for it)."""

    __slots__ = ("in_sync_call",)

    def __init__(self) -> None:
        self.in_sync_call = False


async def adrive(plan: Plan[T], rt: RunHost, tracker: Tracker | None = None) -> T:
    """Carry ``plan`` out on the running loop; a synchronous step runs on a thread."""
    send: Any = None
    throw: Exception | None = None
    while True:
        try:
            effect = plan.send(send) if throw is None else plan.throw(throw)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        send = throw = None
        if isinstance(effect, Nap):
            await rt.anap(effect.mark, effect.seconds)
            continue
        sync = not is_async_fn(effect.call.fn)
        if tracker is not None:
            tracker.in_sync_call = sync
        try:
            send = await invoke_async(effect, rt)
        except Exception as exc:
            throw = exc
        finally:
            if tracker is not None:
                tracker.in_sync_call = False


# -- running one attempt -----------------------------------------------------------------


def _left(until: float, rt: RunHost) -> Callable[[], float]:
    """How long to wait next for a limit at ``until`` on the journal's clock. On the real
    clock that is the time left. On a manual clock (tests) the limit holds in real time
    too — as many real seconds as were left when it began — and the clock is looked at
    every few milliseconds, so that moving it past ``until`` ends the wait."""
    clock = rt.clock
    if isinstance(clock, SystemClock):
        return lambda: until - clock.time()
    real_end = time.monotonic() + (until - clock.time())
    return lambda: 0.0 if clock.time() >= until else min(real_end - time.monotonic(), _SLICE)


def invoke_sync(effect: Invoke, rt: RunHost) -> Any:
    """One attempt in this thread. An ``async def`` step runs on a loop of its own (under
    the loop watchdog); a synchronous step with a limit runs on a daemon thread that is
    left behind (it cannot be stopped) when the limit passes. The step's code runs in
    this thread's context (its trace span) wherever it runs."""
    if effect.span is None:
        return _invoke_sync(effect, rt)
    with effect.span():
        return _invoke_sync(effect, rt)


def _invoke_sync(effect: Invoke, rt: RunHost) -> Any:
    fn, args, until = effect.call.fn, effect.call.args, effect.until
    if is_async_fn(fn):
        work: Coroutine[Any, Any, Any] = fn(*args)
        if until is not None:
            work = _bounded(work, until, rt)
        return run_coroutine(work if effect.watch is None else effect.watch(work))
    if until is None:
        return fn(*args)
    box: list[tuple[bool, Any]] = []
    done = threading.Event()

    def target() -> None:
        try:
            box.append((True, fn(*args)))
        except BaseException as exc:
            box.append((False, exc))
        finally:
            done.set()

    _thread(target, f"foundry-step-{effect.what}", daemon=True).start()
    left = _left(until, rt)
    while True:
        wait = left()
        if wait <= 0:
            raise _Expired()
        if done.wait(wait):
            break
    ok, value = box[0]
    if ok:
        return value
    raise value


async def invoke_async(effect: Invoke, rt: RunHost) -> Any:
    """One attempt on the running loop: an ``async def`` step in a task, a synchronous
    one on a thread (a daemon thread, left behind at the limit, when it has one), in the
    task's context (its trace span) either way."""
    if effect.span is None:
        return await _invoke_async(effect, rt)
    with effect.span():  # each branch of a fan-out is a task of its own: its own context
        return await _invoke_async(effect, rt)


async def _invoke_async(effect: Invoke, rt: RunHost) -> Any:
    fn, args, until = effect.call.fn, effect.call.args, effect.until
    if is_async_fn(fn):
        work: Awaitable[Any] = fn(*args)
    elif until is None:
        call = functools.partial(contextvars.copy_context().run, fn, *args)  # an executor does not
        work = asyncio.get_running_loop().run_in_executor(rt.step_threads(), call)
    else:
        work = _in_daemon_thread(fn, args, effect.what)
    if until is None:
        return await work
    return await _bounded(work, until, rt)


def _in_daemon_thread(fn: Callable[..., Any], args: tuple[Any, ...], what: str) -> asyncio.Future[Any]:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def target() -> None:
        try:
            outcome = (True, fn(*args))
        except BaseException as exc:
            outcome = (False, exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop is gone: nobody waits for it any more
            pass

    _thread(target, f"foundry-step-{what}", daemon=True).start()
    return future


async def _bounded(work: Awaitable[T], until: float, rt: RunHost) -> T:
    """Await ``work`` until ``until`` on the journal's clock, then cancel it (a thread's
    future is merely left) and raise :class:`_Expired`."""
    task = asyncio.ensure_future(work)
    left = _left(until, rt)
    try:
        while True:
            wait = left()
            if wait <= 0:
                break
            done, _ = await asyncio.wait({task}, timeout=wait)
            if done:
                return task.result()
    except asyncio.CancelledError:
        task.cancel()
        await asyncio.wait({task}, timeout=_SETTLE)
        raise
    task.cancel()
    await asyncio.wait({task}, timeout=_SETTLE)  # let it run its finally blocks (not for ever)
    raise _Expired()


def _thread(target: Callable[[], None], name: str, *, daemon: bool = False) -> threading.Thread:
    """A thread that runs ``target`` in a copy of the caller's context (a new thread starts
    with an empty one: the step's code would not see the run's trace span)."""
    return threading.Thread(target=contextvars.copy_context().run, args=(target,), name=name, daemon=daemon)


def run_coroutine(work: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(work)``, also from a thread that already runs a loop (then on a
    thread of its own, joined)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work)
    box: list[tuple[bool, Any]] = []

    def target() -> None:
        try:
            box.append((True, asyncio.run(work)))
        except BaseException as exc:
            box.append((False, exc))

    thread = _thread(target, "foundry-workflow-loop")
    thread.start()
    thread.join()
    ok, value = box[0]
    if ok:
        return value  # type: ignore[no-any-return]
    raise value


def new_step_threads(size: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max(1, size), thread_name_prefix="foundry-step")
