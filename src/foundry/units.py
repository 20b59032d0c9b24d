"""Declared units: ``WorkUnit`` (``@app.work``). Workflows and streams live in
``foundry.workflow_decl`` and ``foundry.stream_decl``.

A unit is validated and decided at declaration time: a bad trait raises there, and
the decision (with its warnings) exists before any work is submitted.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypeVar, overload

from foundry.decide import Decision, Host, decide
from foundry.errors import DeclarationError, SubmitError
from foundry.execute.phase import Phase
from foundry.execute.structured import current_scope
from foundry.handle import Handle
from foundry.limits_decl import check_limits
from foundry.runtime import Runner, SubmitOptions, UnitSpec
from foundry.serialize import ErrorTypes
from foundry.traits import Traits, parse_duration, traits_from_kwargs

if TYPE_CHECKING:
    from typing_extensions import ParamSpec as _ParamSpec
    from typing_extensions import TypeVar as _TypeVar

    from foundry.declaring import DeclaringApp
    from foundry.schedules import Schedule

    # a bare ``WorkUnit`` is ``WorkUnit[..., Any]`` (PEP 696; the runtime needs no defaults)
    P = _ParamSpec("P", default=...)
    R = _TypeVar("R", default=Any)
else:
    P = ParamSpec("P")
    R = TypeVar("R")
A = TypeVar("A")
Q = ParamSpec("Q")

__all__ = [
    "BoundOptions",
    "WorkDecorator",
    "WorkUnit",
    "check_adaptive",
    "check_callable",
    "check_phase_name",
    "decide_phases",
    "phase_traits",
    "refuse_adaptive",
    "refuse_result_ttl",
    "unit_error_types",
]


def unit_error_types(app: DeclaringApp, fn: Any, traits: Traits) -> ErrorTypes:
    """The exception types a unit's error records may be rebuilt as: the app's
    (``app.errors``) plus the classes of the unit's own module and the types it names in
    ``errors=`` and ``retry_on=`` (``foundry.serialize.ErrorTypes``)."""
    named = tuple(t for t in traits.retry_on if isinstance(t, type))
    module = getattr(fn, "__module__", None)
    return app.errors.scoped(types=(*traits.errors, *named), modules=(module,) if module else ())


def check_callable(unit: str, fn: Any) -> Callable[..., Any]:
    if not callable(fn):
        raise DeclarationError(
            unit,
            "fn",
            fn,
            "is not callable",
            "decorate a function (@app.work above `def`), or pass a callable",
        )
    return fn  # type: ignore[no-any-return]


def decide_phases(
    name: str,
    traits: Traits,
    phases: Mapping[str, Mapping[str, Any]] | None,
    host: Host | None = None,
) -> tuple[Decision, dict[str, Decision]]:
    """Decide the unit and each declared phase (a phase inherits the unit's traits).

    ``host`` is the machine the app runs on (cores, GIL); ``None`` lets the engine
    assume a typical one and say so."""
    main = decide(traits, phase="main", host=host)
    return main, {p: decide(t, phase=p, host=host) for p, t in phase_traits(name, traits, phases).items()}


def check_phase_name(unit: str, name: object, field_name: str = "phases") -> str:
    if not isinstance(name, str) or not name or name == "main":
        raise DeclarationError(
            unit,
            field_name,
            name,
            "is not a usable phase name",
            'name phases with non-empty strings other than "main", e.g. phases={"sign": {...}}',
        )
    return name


def phase_traits(
    name: str, traits: Traits, phases: Mapping[str, Mapping[str, Any]] | None
) -> dict[str, Traits]:
    """Each declared phase's own traits: the unit's, without its ``model=``, with the
    phase's on top."""
    parsed: dict[str, Traits] = {}
    for phase_name, raw in (phases or {}).items():
        check_phase_name(name, phase_name)
        if not isinstance(raw, Mapping):
            raise DeclarationError(
                name,
                f"phases[{phase_name!r}]",
                raw,
                "is not a mapping of traits",
                'write phases={"sign": {"est": "35ms", "bound": "cpu"}}',
            )
        # A phase inherits the unit's answers but not its explicit model override.
        parsed[phase_name] = traits_from_kwargs(f"{name}.{phase_name}", raw, base=traits.merged(model=None))
    return parsed


def check_adaptive(unit: WorkUnit) -> None:
    """``adaptive=True`` moves phases off the event loop this process runs the unit on:
    refused where there is no such loop."""
    if not unit.is_async:
        raise DeclarationError(
            unit.name,
            "adaptive",
            True,
            "moves phases off the event loop an `async def` unit runs on, and this unit is a plain "
            "function (it runs in its caller's thread or on a pool, never on a loop)",
            "declare the unit `async def` (and its computing step with @unit.phase), or drop adaptive=True",
        )
    if unit.decision.delivery != "direct":
        raise DeclarationError(
            unit.name,
            "adaptive",
            True,
            f"moves phases in the process that runs the unit, and this unit is delivered by "
            f"{unit.decision.delivery} (it runs in other processes)",
            "drop adaptive=True: the watchdog in the process that runs it still reports the phase "
            "and the decision it should have",
        )


def refuse_adaptive(name: str, traits: Traits, what: str) -> None:
    """Workflows and streams have no phase hooks to move."""
    if traits.adaptive:
        raise DeclarationError(
            name,
            "adaptive",
            True,
            f"moves phases of an `async def` @app.work unit off its event loop (@unit.phase), and {what} "
            "has none",
            "drop adaptive=True: the watchdog still names the step or handler that holds its loop",
        )


def refuse_result_ttl(name: str, traits: Traits, what: str, fix: str) -> None:
    """``result_ttl=`` is a queue job's retention: refused where another one applies."""
    if traits.result_ttl is not None:
        raise DeclarationError(
            name,
            "result_ttl",
            traits.result_ttl,
            f"is how long a queue job's result is kept, and {what}",
            fix,
        )


class WorkUnit(Generic[P, R]):
    """A function declared with ``@app.work(...)``: call it, submit it, map it.

    ``WorkUnit[P, R]``: ``P`` its parameters, ``R`` what it returns (an ``async def``'s
    awaited value), so ``unit.submit(...)`` is checked against ``P`` and gives a
    ``Handle[R]`` for a type checker (``tests/typing/``)."""

    if TYPE_CHECKING:

        def __call__(self, *args: Any, **kwargs: Any) -> Any:  # (a parallel unit takes the whole input)
            """Run on the unit's model and return the result (``await`` it for async units
            called from a loop: calling an async unit returns a coroutine)."""
            ...

    else:
        # ``unit(...)`` calls whatever this instance holds in its ``__call__`` slot (see
        # _install_call): CPython looks ``__call__`` up on the type, finds the slot's
        # descriptor and calls the stored callable from C, so a sequential unit's call is
        # its runner's ``direct`` closure and no method frame of ours.
        __slots__ = ("__call__", "__dict__", "__weakref__")

    schedule: Schedule | None = None  # schedule=: its ticks enqueued by `foundry run` (foundry.schedules)

    def __init__(
        self,
        app: DeclaringApp,
        fn: Callable[..., Any],
        name: str,
        traits: Traits,
        phases: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.app = app
        self.fn = fn
        self.name = name
        self.traits = traits
        self.phase_traits = phase_traits(name, traits, phases)
        self.decision = decide(traits, phase="main", host=app.host)
        self.phases = {p: decide(t, phase=p, host=app.host) for p, t in self.phase_traits.items()}
        if traits.deadline is not None and self.decision.delivery != "pool":
            raise DeclarationError(
                name,
                "deadline",
                traits.deadline,
                f"bounds a work-pool request, and this unit runs on {self.decision.model}, which would "
                "ignore it",
                'use timeout= (it bounds one run), or declare model="pool"',
            )
        check_limits(name, fn, traits, self.decision)
        if self.decision.delivery != "queue":
            refuse_result_ttl(
                name,
                traits,
                f"this unit runs on {self.decision.model}, which keeps its result in the handle only",
                "declare durable=True (a queue job), or drop result_ttl=",
            )
        self.is_async = inspect.iscoroutinefunction(fn)
        if traits.adaptive or any(t.adaptive for t in self.phase_traits.values()):
            check_adaptive(self)
        self.hooks: dict[str, Phase] = {}  # the phases marked with @unit.phase, by name
        functools.update_wrapper(self, fn)
        self._runner: Runner | None = None
        _install_call(self, self._first_call)
        self.error_types = unit_error_types(app, fn, traits)

    @property
    def spec(self) -> UnitSpec:
        return UnitSpec(
            name=self.name,
            fn=self.fn,
            traits=self.traits,
            decision=self.decision,
            phases=dict(self.phases),
            phase_traits=dict(self.phase_traits),
            is_async=self.is_async,
            module=getattr(self.fn, "__module__", "") or "",
            qualname=getattr(self.fn, "__qualname__", "") or "",
            errors=self.error_types,
        )

    @property
    def runner(self) -> Runner:
        runner = self._runner
        if runner is None:
            runner = self._runner = self.app.runner_for(self.spec)
        return runner

    def forget_runner(self) -> None:
        """Drop the cached runner (the app closed it): the next call asks the app again."""
        self._runner = None
        _install_call(self, self._first_call)

    def phase(self, name: str, **traits: Any) -> Callable[[Callable[..., Any]], Phase]:
        """Mark the function that does phase ``name`` of this ``async def`` unit:

        ``@handle_payment.phase("sign")`` above ``def sign(body): ...``; the unit's body
        then runs it with ``await sign(body)`` — in its task while the phase's decision
        keeps it in the caller, on a pool once it is decided (or, with ``adaptive=True``,
        moved) off the loop. Traits here (or in ``phases=``) are the phase's own; it
        inherits the rest from the unit (``foundry.execute.phase``)."""
        from foundry.phase_decl import declare_phase

        return lambda fn: declare_phase(self, name, fn, traits)

    # -- running -------------------------------------------------------------

    def _first_call(self, *args: Any, **kwargs: Any) -> Any:
        """The first ``unit(...)`` (and the first after :meth:`forget_runner`): make the
        runner, install the fastest way to call it in the ``__call__`` slot, make this call."""
        call = self._call_for(self.runner)
        _install_call(self, call)
        return call(*args, **kwargs)

    def _call_for(self, runner: Runner) -> Callable[..., Any]:
        """What ``unit(...)`` is on ``runner``: its ``direct`` callable where it runs the
        work inline (sequential: no frame of ours between the caller and the function but
        that one), the loop-aware call for ``async def`` units, else ``runner.call``."""
        if self.is_async:
            return self._async_call
        direct: Callable[..., Any] | None = getattr(runner, "direct", None)
        if direct is not None:
            return direct
        return _via_call(runner.call)

    def _async_call(self, *args: Any, **kwargs: Any) -> Any:
        """``unit(...)`` of an ``async def`` unit: from a loop, a coroutine to await (run in
        the caller's task where the model allows); without one, run to completion."""
        runner = self._runner or self.runner
        if _in_loop():
            acall = getattr(runner, "acall", None)
            if acall is not None:  # the model runs it in the caller's own task (async)
                return acall(args, kwargs)
            return self._acall(args, kwargs)
        return runner.call(args, kwargs)

    async def _acall(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        handle = _tracked(await self.runner.asubmit(args, kwargs, _DEFAULT_OPTIONS))
        return await handle

    def submit(self, *args: P.args, **kwargs: P.kwargs) -> Handle[R]:
        return _tracked(self.runner.submit(args, kwargs, _DEFAULT_OPTIONS))

    async def asubmit(self, *args: P.args, **kwargs: P.kwargs) -> Handle[R]:
        return _tracked(await self.runner.asubmit(args, kwargs, _DEFAULT_OPTIONS))

    def submit_many(self, items: Iterable[Any], *, star: bool = False) -> list[Handle[R]]:
        """Submit one call per item and return the handles, in order.

        Each item is the unit's one argument, as in :meth:`map`; with ``star=True`` each
        item is a tuple of positional arguments. On a durable queue the jobs go in
        chunks of 500 per transaction (and per batch of broker messages), so a bulk load
        pays the store's round trip once per chunk rather than once per job; a bad item
        raises with the earlier chunks in and none of its own. Other models submit one
        by one (those before a bad item are in).
        """
        return _submit_many(self, items, star, _DEFAULT_OPTIONS)

    def options(
        self,
        *,
        key: str | None = None,
        delay: str | float | None = None,
        eta: float | None = None,
        priority: int = 0,
        timeout: str | float | None = None,
        deadline: str | float | None = None,
    ) -> BoundOptions[P, R]:
        """Per-submission options: ``unit.options(key="job-42", delay="5m").submit(...)``.

        ``deadline`` (work pool) bounds the whole request: waiting for a free worker and
        every attempt; ``timeout`` bounds one attempt (one run)."""
        opts = SubmitOptions(
            key=key,
            delay=None if delay is None else parse_duration(delay, unit=self.name, field_name="delay"),
            eta=eta,
            priority=priority,
            timeout=None
            if timeout is None
            else parse_duration(timeout, unit=self.name, field_name="timeout"),
            deadline=None
            if deadline is None
            else parse_duration(deadline, unit=self.name, field_name="deadline"),
        )
        if key is not None and (not isinstance(key, str) or not key):
            raise SubmitError(f"unit {self.name!r}: key={key!r} must be a non-empty string")
        if deadline is not None and self.decision.delivery != "pool":
            raise SubmitError(
                f"unit {self.name!r}: deadline={deadline!r} bounds a work-pool request, and this unit runs "
                f"on {self.decision.model}, which would ignore it. Fix: use timeout= (it bounds one run), or "
                'declare the unit model="pool"'
            )
        return BoundOptions(self, opts)

    def map(
        self, iterable: Iterable[Any], *, ordered: bool = True, timeout: float | None = None
    ) -> Iterator[R]:
        """Submit one call per item and yield results (input order when ``ordered``).

        Lazy and bounded: at most the model's window of items (its workers plus its
        intake) is in flight, the next item is submitted as a result is taken, and the
        model's overflow policy applies to each submission. ``timeout`` bounds each
        wait for a result. A failure is raised when its item is reached (ordered) or
        when it completes (unordered); when the consumer stops early (``break``, an
        exception, the generator closed), every outstanding handle is cancelled.
        """
        runner = self.runner
        own_map = getattr(runner, "map", None)
        if own_map is not None:  # models that map as a whole (parallel)
            return iter(own_map(iterable, ordered=ordered, timeout=timeout))
        from foundry.execute.mapping import bounded_map

        window = getattr(runner, "map_window", None) or DEFAULT_MAP_WINDOW
        return bounded_map(self.submit, iterable, ordered=ordered, timeout=timeout, window=window)

    def explain(self) -> str:
        from foundry.explain import render_text

        return render_text(self.name, self.decision, self.phases)

    def __repr__(self) -> str:
        return f"<WorkUnit {self.name} {self.decision.model}>"


class BoundOptions(Generic[P, R]):
    """A unit with per-submission options bound (see :meth:`WorkUnit.options`)."""

    __slots__ = ("_opts", "_unit")

    def __init__(self, unit: WorkUnit[P, R], opts: SubmitOptions) -> None:
        self._unit = unit
        self._opts = opts

    def submit(self, *args: P.args, **kwargs: P.kwargs) -> Handle[R]:
        return _tracked(self._unit.runner.submit(args, kwargs, self._opts))

    async def asubmit(self, *args: P.args, **kwargs: P.kwargs) -> Handle[R]:
        return _tracked(await self._unit.runner.asubmit(args, kwargs, self._opts))

    def submit_many(self, items: Iterable[Any], *, star: bool = False) -> list[Handle[R]]:
        """:meth:`WorkUnit.submit_many` with these options (not ``key=``: it names one job)."""
        if self._opts.key is not None:
            raise SubmitError(
                f"unit {self._unit.name!r}: key={self._opts.key!r} names one submission, and submit_many "
                "makes many. Fix: submit each keyed job with .options(key=...).submit(...), or declare the "
                "unit idempotent=True to key each call by its arguments"
            )
        return _submit_many(self._unit, items, star, self._opts)


def _submit_many(
    unit: WorkUnit[..., A], items: Iterable[Any], star: bool, opts: SubmitOptions
) -> list[Handle[A]]:
    runner = unit.runner

    def arguments(i: int, item: Any) -> tuple[Any, ...]:
        if not star:
            return (item,)
        if isinstance(item, tuple | list):
            return tuple(item)
        raise SubmitError(
            f"unit {unit.name!r}: submit_many(star=True) item {i} is a {type(item).__name__}, not a tuple "
            "of arguments; nothing of its chunk was submitted (on a durable queue the earlier chunks of 500 "
            "were). Fix: pass (arg1, arg2, ...) per item"
        )

    calls: Iterator[tuple[tuple[Any, ...], dict[str, Any]]] = (
        (arguments(i, item), {}) for i, item in enumerate(items)
    )
    many = getattr(runner, "submit_many", None)
    if many is not None:
        handles: list[Handle] = many(calls, opts)
    else:
        handles = [runner.submit(args, kwargs, opts) for args, kwargs in calls]
    for handle in handles:
        _tracked(handle)
    return handles


class WorkDecorator(Protocol):
    """What ``@app.work(...)`` with traits returns: a decorator that keeps the types of the
    function it declares (``WorkUnit[P, R]``; ``R`` awaited for an ``async def``)."""

    @overload
    def __call__(self, fn: Callable[Q, Coroutine[Any, Any, A]], /) -> WorkUnit[Q, A]: ...

    @overload
    def __call__(self, fn: Callable[Q, A], /) -> WorkUnit[Q, A]: ...


_DEFAULT_OPTIONS = SubmitOptions()
DEFAULT_MAP_WINDOW = 64


def _install_call(unit: WorkUnit[Any, Any], call: Callable[..., Any]) -> None:
    """Make ``unit(...)`` call ``call`` (the slot declared in ``WorkUnit.__slots__``)."""
    setattr(unit, "__call__", call)  # noqa: B010 (the slot, which mypy sees as the method)


def _via_call(call: Callable[[tuple[Any, ...], dict[str, Any]], Any]) -> Callable[..., Any]:
    """``unit(...)`` on a runner whose ``call(args, kwargs)`` hands the work on."""

    def unit_call(*args: Any, **kwargs: Any) -> Any:
        return call(args, kwargs)

    return unit_call


def _tracked(handle: Handle[A]) -> Handle[A]:
    """Attach ``handle`` to the innermost structured scope, if one is active."""
    scope = current_scope()
    if scope is not None:
        scope.track(handle)
    return handle


def _in_loop() -> bool:
    return asyncio._get_running_loop() is not None  # asyncio's C helper: no exception when outside
