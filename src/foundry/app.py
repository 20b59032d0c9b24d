"""``Foundry``: where units are declared, decided, and routed to their runtime.

The app owns the registry of units and one runtime per delivery model. Runtimes are
imported lazily, so ``import foundry`` needs no broker client and starts nothing.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import threading
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Literal, Never, ParamSpec, TypeVar, overload

from foundry.config import Settings, load_settings, unknown_argument_error
from foundry.decide import Decision, Host
from foundry.errors import DeclarationError, NotFoundError, UnknownTraitError
from foundry.observe.metrics import Registry
from foundry.observe.tracing import Tracing
from foundry.profile import current_host
from foundry.runtime import Closers, Runner, RuntimeContext, UnitSpec
from foundry.schedules.schedule import FIELDS as SCHEDULE_FIELDS
from foundry.schedules.schedule import Schedule, split_schedule, takes_tick
from foundry.serialize import ErrorTypes
from foundry.traits import Traits, traits_from_kwargs
from foundry.units import WorkDecorator, WorkUnit, check_callable

P = ParamSpec("P")
R = TypeVar("R")

if TYPE_CHECKING:
    from foundry.execute.adaptive import PhaseMover
    from foundry.execute.asyncio_loop import LoopThread

__all__ = ["Foundry", "loop"]

# delivery model -> module with ``make_runner(spec: UnitSpec, ctx: RuntimeContext) -> Runner``
_RUNTIMES: dict[str, str] = {
    "direct": "foundry.execute",
    "pool": "foundry.deliver.pool",
    "queue": "foundry.deliver.queue",
    "workflow": "foundry.deliver.workflow",
    "stream": "foundry.deliver.stream",
}


class Foundry:
    """An application: a set of declared units and the runtimes that carry them.

    ``Foundry()`` uses the embedded default: in-process execution, SQLite under
    ``./.foundry``. Pass URLs (``queue="amqp://guest:guest@localhost/"``) or set
    ``FOUNDRY_QUEUE`` / ``foundry.toml`` to run durable work on real engines;
    ``pool="nats://…"`` serves ``pool`` units from workers on many hosts;
    ``cluster="tcp://scheduler:8786"`` (Dask) or ``"ray://head:10001"`` computes the chunks
    of ``parallel`` units on that cluster instead of this machine's processes.

    ``watchdog``: every event loop Foundry runs (the managed loop of async units, the
    loops of queue workers, workflow steps, stream consumers and pipelines' async stages)
    has a loop-lag monitor and a starvation watchdog, on by default at 100 ms;
    ``watchdog=False`` (or ``FOUNDRY_WATCHDOG=off``, ``watchdog = false`` in
    ``foundry.toml``) turns them off, a duration (``"50ms"``) sets the threshold
    (``docs/observability.md``).

    An unknown keyword argument is a :class:`~foundry.errors.ConfigError` naming the
    closest known one (``Foundry(queues=...)``: did you mean ``queue``?), like an unknown
    key of ``foundry.toml`` or a misspelt ``FOUNDRY_*`` variable; a type checker flags it
    too (``**unknown: Never``).

    ``tracing``: OpenTelemetry spans and W3C trace context carried by queue jobs, workflow
    runs and stream events, from submit to the worker (``docs/tracing.md``). ``True`` (or
    ``FOUNDRY_TRACING=on``) needs ``opentelemetry-api``; a ``TracerProvider`` traces on it
    instead of the global one; ``False`` never imports it; the default traces once the
    application has set a global ``TracerProvider``.
    """

    def __init__(
        self,
        name: str = "foundry",
        *,
        home: str | os.PathLike[str] | None = None,
        queue: str | None = None,
        stream: str | None = None,
        journal: str | None = None,
        pool: str | None = None,
        cluster: str | None = None,
        host: Host | None = None,
        watchdog: bool | float | str | None = None,
        tracing: bool | Any = None,
        **unknown: Never,
    ) -> None:
        if unknown:
            known = [
                p for p in inspect.signature(Foundry.__init__).parameters if p not in ("self", "unknown")
            ]
            raise unknown_argument_error("Foundry()", next(iter(unknown)), known)
        self.name = name
        self.tracing = Tracing.from_setting(tracing)
        # The machine decisions are made for: this one, unless told (a plan for another
        # machine, or a test that pins the answers).
        self.host: Host = host if host is not None else current_host()
        self._settings_args: dict[str, Any] = {
            "home": home,
            "queue": queue,
            "stream": stream,
            "journal": journal,
            "pool": pool,
            "cluster": cluster,
            "watchdog": watchdog,
        }
        self._settings: Settings | None = None
        self.units: dict[str, WorkUnit] = {}
        self.workflows: dict[str, Any] = {}
        self.streams: dict[str, Any] = {}
        self._runners: dict[str, Runner] = {}
        self._closers = Closers()  # what runtimes open outside a runner; app.close() runs them
        # delivery model -> runtime module used instead of _RUNTIMES' (foundry.testing's
        # eager deliveries while a test sandbox holds the app); empty otherwise
        self._routes: dict[str, str] = {}
        self._lock = threading.Lock()
        self._metrics: Registry | None = None
        self._mover: PhaseMover | None = None
        # Exception types rebuilt from error records read back from a store, for every
        # unit of this app (besides builtins', Foundry's and each unit's own module's):
        # ``app.errors.register(MyError)``. See docs/security.md.
        self.errors = ErrorTypes()
        # Validate URLs now so a typo fails at construction, not at first submit.
        if any(v is not None for v in (queue, stream, journal, pool, cluster, watchdog)):
            self._settings = load_settings(**self._settings_args)

    # -- configuration ---------------------------------------------------------

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(**self._settings_args)
        return self._settings

    @property
    def metrics(self) -> Registry:
        """The app's metrics registry (``foundry.observe``)."""
        if self._metrics is None:
            self._metrics = Registry()
        return self._metrics

    def serve_metrics(self, port: int = 9464, host: str = "127.0.0.1") -> Any:
        """Expose this app's metrics: ``/metrics`` (Prometheus), ``/metrics.json``, ``/``
        (the dashboard). Returns the server (``.url``, ``.close()``); port 0 picks one."""
        from foundry.observe.http import serve_metrics

        return serve_metrics(self.metrics, host, port)

    # -- declaring -------------------------------------------------------------

    def _unique(self, name: str) -> str:
        if name in self.units or name in self.workflows or name in self.streams:
            raise DeclarationError(
                name,
                "name",
                name,
                "is already declared in this app",
                "give the second one another name with name=...",
            )
        return name

    @overload
    def work(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> WorkUnit[P, R]: ...

    @overload
    def work(self, fn: Callable[P, R], /) -> WorkUnit[P, R]: ...

    @overload
    def work(
        self,
        fn: None = None,
        /,
        *,
        partitionable: Literal[True],
        name: str | None = None,
        phases: Mapping[str, Mapping[str, Any]] | None = None,
        **traits: Any,
    ) -> Callable[[Callable[..., Any]], WorkUnit]: ...  # (parallel: submit takes the whole input)

    @overload
    def work(
        self,
        fn: None = None,
        /,
        *,
        model: Literal["parallel", "direct/parallel"],
        name: str | None = None,
        phases: Mapping[str, Mapping[str, Any]] | None = None,
        **traits: Any,
    ) -> Callable[[Callable[..., Any]], WorkUnit]: ...

    @overload
    def work(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        phases: Mapping[str, Mapping[str, Any]] | None = None,
        **traits: Any,
    ) -> WorkDecorator: ...

    def work(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        phases: Mapping[str, Mapping[str, Any]] | None = None,
        **traits: Any,
    ) -> WorkUnit | WorkDecorator | Callable[[Callable[..., Any]], WorkUnit]:
        """Declare a unit of work with its traits (see ``foundry.traits.Traits``)."""

        def register(target: Callable[..., Any]) -> WorkUnit:
            unit_name = name or getattr(target, "__name__", None) or repr(target)
            check_callable(unit_name, target)
            when, rest = split_schedule(unit_name, traits)
            if when and "durable" not in rest:
                rest["durable"] = True  # a schedule's ticks are queue jobs
            parsed = _traits(unit_name, rest)
            unit = WorkUnit(self, target, self._unique(unit_name), parsed, phases)
            if when:
                unit.schedule = _schedule(unit, when)
            self.units[unit.name] = unit
            return unit

        if fn is not None:
            if traits or phases or name:
                raise DeclarationError(
                    getattr(fn, "__name__", "?"),
                    "fn",
                    fn,
                    "was given together with traits",
                    "use @app.work(...) with keyword traits, or plain @app.work",
                )
            return register(fn)
        return register

    def workflow(
        self, fn: Callable[..., Any] | None = None, /, *, name: str | None = None, **traits: Any
    ) -> Any:
        """Declare a durable, multi-step workflow (``foundry.workflow_decl``)."""
        from foundry.workflow_decl import WorkflowUnit

        def register(target: Callable[..., Any]) -> Any:
            wf_name = name or getattr(target, "__name__", None) or repr(target)
            check_callable(wf_name, target)
            unit = WorkflowUnit(self, target, self._unique(wf_name), traits)
            self.workflows[wf_name] = unit
            return unit

        return register(fn) if fn is not None else register

    def stream(self, name: str, **options: Any) -> Any:
        """Declare an ordered, replayable event stream (``foundry.stream_decl``)."""
        from foundry.stream_decl import StreamDecl

        decl = StreamDecl(self, self._unique(name), **options)
        self.streams[name] = decl
        return decl

    def phase_mover(self) -> PhaseMover:
        """What attributes and moves this app's phase hooks (``@unit.phase``;
        ``foundry.execute.adaptive``): made with the first one."""
        with self._lock:
            if self._mover is None:
                from foundry.execute.adaptive import PhaseMover

                self._mover = PhaseMover(self.metrics, host=self.host)
            return self._mover

    # -- deciding --------------------------------------------------------------

    def plan(self) -> list[tuple[str, Decision, dict[str, Decision]]]:
        """Every declared unit with its main decision and its phases' decisions."""
        rows: list[tuple[str, Decision, dict[str, Decision]]] = []
        for group in (self.units, self.workflows, self.streams):
            for unit_name, unit in group.items():
                rows.append((unit_name, unit.decision, dict(getattr(unit, "phases", {}))))
        return rows

    def explain(self, unit: str | Any) -> str:
        target = self.get(unit) if isinstance(unit, str) else unit
        return str(target.explain())

    def get(self, name: str) -> Any:
        for group in (self.units, self.workflows, self.streams):
            if name in group:
                return group[name]
        known = ", ".join(sorted([*self.units, *self.workflows, *self.streams])) or "none"
        raise NotFoundError(
            f"no unit named {name!r} in app {self.name!r}. Known units: {known}. "
            "Fix: check the spelling, or import the module that declares it"
        )

    # -- running ---------------------------------------------------------------

    def spec(self, name: str) -> UnitSpec:
        unit = self.get(name)
        return unit.spec  # type: ignore[no-any-return]

    def context(self) -> RuntimeContext:
        return RuntimeContext(
            app_name=self.name,
            settings=self.settings,
            metrics=self.metrics,
            lookup=self.spec,
            errors=self.errors,
            tracing=self.tracing,
            closers=self._closers,
        )

    def runner_for(self, spec: UnitSpec) -> Runner:
        """The runner for ``spec``, made once per unit and kept until ``close()``."""
        with self._lock:
            runner = self._runners.get(spec.name)
            if runner is None:
                delivery = spec.decision.delivery
                module = importlib.import_module(self._routes.get(delivery) or _RUNTIMES[delivery])
                runner = module.make_runner(spec, self.context())
                self._runners[spec.name] = runner
            return runner

    def signal(self, workflow_id: str, name: str, payload: Any = None) -> None:
        """Send signal ``name`` with a JSON ``payload`` into a workflow's durable inbox
        (``wf.wait_for(name)`` receives it), from any process."""
        self._workflow_runtime().signal(workflow_id, name, payload)

    def workflow_handle(self, workflow_id: str) -> Any:
        """A :class:`~foundry.handle.Handle` on a workflow run, whoever started it."""
        return self._workflow_runtime().handle(workflow_id)

    def _workflow_runtime(self) -> Any:
        """The runtime behind this app's workflows (one, shared by all of them)."""
        if not self.workflows:
            raise NotFoundError(
                f"app {self.name!r} declares no workflows. Fix: declare them with @app.workflow, or use "
                "`foundry workflows` on the journal"
            )
        unit = next(iter(self.workflows.values()))
        runner: Any = self.runner_for(unit.spec)  # a workflow UnitRunner: one runtime per app
        return runner.runtime

    def job(self, job_id: str) -> Any:
        """A :class:`~foundry.handle.Handle` on a durable queue job, whoever submitted it
        (``app.job(job_id).result(timeout=60)`` from any process)."""
        from foundry.deliver.queue import handle_for

        return handle_for(self.context(), job_id)

    def close(self, timeout: float = 10.0) -> None:
        """Drain and stop every runtime this app started."""
        with self._lock:
            runners, self._runners = list(self._runners.values()), {}
        for runner in runners:
            runner.close(timeout)
        if self._mover is not None:  # moves end; the phases' pools drain
            self._mover.close(timeout)
        self._closers.close()  # what runtimes opened outside a runner (app.job()'s handles)
        for decl in self.streams.values():  # their consumers and log connections
            decl.close(timeout)
        for unit in self.units.values():
            unit.forget_runner()

    def __enter__(self) -> Foundry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _traits(unit: str, raw: Mapping[str, Any]) -> Traits:
    """``traits_from_kwargs``, with a typo of a schedule option suggested too."""
    try:
        return traits_from_kwargs(unit, raw)
    except UnknownTraitError as exc:
        close = difflib.get_close_matches(exc.field, SCHEDULE_FIELDS, n=1, cutoff=0.75)
        if close:
            raise UnknownTraitError(
                unit, exc.field, exc.value, exc.problem, f"did you mean {close[0]!r}?"
            ) from None
        raise


def _schedule(unit: WorkUnit, options: Mapping[str, Any]) -> Schedule:
    """The unit's :class:`~foundry.schedules.Schedule`, checked against how it runs."""
    value = options["schedule"]
    schedule = Schedule(
        unit.name, value, tz=options.get("tz"), missed=options.get("missed"), catch_up=options.get("catch_up")
    )
    if unit.decision.delivery != "queue":
        raise DeclarationError(
            unit.name,
            "schedule",
            value,
            f"enqueues a durable queue job per tick, and this unit runs on {unit.decision.model}",
            "drop durable=False (schedule= makes a unit durable), or a model= that is not queue/...",
        )
    takes_tick(unit.name, unit.fn, value)  # a unit a tick cannot call fails here, not at 3 a.m.
    return schedule


def loop(app: Foundry | None = None) -> LoopThread:
    """The process's managed event loop — where async units called or submitted from
    sync code run — started if needed and kept for the life of the process.

    ``.loop`` is the running ``asyncio`` loop; ``.run(coro, timeout)`` and
    ``.submit(coro)`` run a coroutine on it from another thread; ``.watchdog``,
    ``.monitor``, ``.lag()`` and ``.reports`` are its loop-lag monitor and starvation
    watchdog (on unless the ``watchdog`` setting is off). With ``app``, the loop's lag
    and stalls also show in ``app.metrics`` and stalls are attributed to its units.
    """
    from foundry.config import watchdog_setting
    from foundry.execute.asyncio_loop import managed_loop

    handle = managed_loop(pin=True)
    threshold = app.settings.watchdog if app is not None else watchdog_setting()
    if threshold is not None:
        if app is None:
            handle.watch(threshold)
        else:
            units = [unit.spec for unit in app.units.values() if unit.is_async]
            handle.watch(threshold, registry=app.metrics, units=units)
    return handle
