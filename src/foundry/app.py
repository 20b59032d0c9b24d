"""``Foundry``: where units are declared, decided, and routed to their runtime.

The app owns the registry of units and one runtime per delivery model. Runtimes are
imported lazily, so ``import foundry`` needs no broker client and starts nothing.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any, overload

from foundry.config import Settings, load_settings
from foundry.decide import Decision, Host
from foundry.errors import DeclarationError, NotFoundError
from foundry.observe.metrics import Registry
from foundry.profile import current_host
from foundry.runtime import Runner, RuntimeContext, UnitSpec
from foundry.traits import traits_from_kwargs
from foundry.units import WorkUnit, check_callable

__all__ = ["Foundry"]

# delivery model -> module with ``make_runner(spec: UnitSpec, ctx: RuntimeContext) -> Runner``
_RUNTIMES: dict[str, str] = {
    "direct": "foundry.execute",
    "pool": "foundry.execute",
    "queue": "foundry.deliver.queue",
    "workflow": "foundry.deliver.workflow",
    "stream": "foundry.deliver.stream",
}


class Foundry:
    """An application: a set of declared units and the runtimes that carry them.

    ``Foundry()`` uses the embedded default: in-process execution, SQLite under
    ``./.foundry``. Pass URLs (``queue="amqp://guest:guest@localhost/"``) or set
    ``FOUNDRY_QUEUE`` / ``foundry.toml`` to run durable work on real engines.
    """

    def __init__(
        self,
        name: str = "foundry",
        *,
        home: str | os.PathLike[str] | None = None,
        queue: str | None = None,
        stream: str | None = None,
        journal: str | None = None,
        host: Host | None = None,
    ) -> None:
        self.name = name
        # The machine decisions are made for: this one, unless told (a plan for another
        # machine, or a test that pins the answers).
        self.host: Host = host if host is not None else current_host()
        self._settings_args: dict[str, Any] = {
            "home": home,
            "queue": queue,
            "stream": stream,
            "journal": journal,
        }
        self._settings: Settings | None = None
        self.units: dict[str, WorkUnit] = {}
        self.workflows: dict[str, Any] = {}
        self.streams: dict[str, Any] = {}
        self._runners: dict[str, Runner] = {}
        self._lock = threading.Lock()
        self._metrics: Registry | None = None
        # Validate URLs now so a typo fails at construction, not at first submit.
        if any(v is not None for v in (queue, stream, journal)):
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
    def work(self, fn: Callable[..., Any], /) -> WorkUnit: ...

    @overload
    def work(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        phases: Mapping[str, Mapping[str, Any]] | None = None,
        **traits: Any,
    ) -> Callable[[Callable[..., Any]], WorkUnit]: ...

    def work(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        phases: Mapping[str, Mapping[str, Any]] | None = None,
        **traits: Any,
    ) -> WorkUnit | Callable[[Callable[..., Any]], WorkUnit]:
        """Declare a unit of work with its traits (see ``foundry.traits.Traits``)."""

        def register(target: Callable[..., Any]) -> WorkUnit:
            unit_name = name or getattr(target, "__name__", None) or repr(target)
            check_callable(unit_name, target)
            parsed = traits_from_kwargs(unit_name, traits)
            unit = WorkUnit(self, target, self._unique(unit_name), parsed, phases)
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
            app_name=self.name, settings=self.settings, metrics=self.metrics, lookup=self.spec
        )

    def runner_for(self, spec: UnitSpec) -> Runner:
        """The runner for ``spec``, made once per unit and kept until ``close()``."""
        with self._lock:
            runner = self._runners.get(spec.name)
            if runner is None:
                module = importlib.import_module(_RUNTIMES[spec.decision.delivery])
                runner = module.make_runner(spec, self.context())
                self._runners[spec.name] = runner
            return runner

    def signal(self, workflow_id: str, name: str, payload: Any = None) -> None:
        """Send signal ``name`` with a JSON ``payload`` into a workflow's durable inbox
        (``wf.wait_for(name)`` receives it), from any process."""
        from foundry.deliver.workflow import runtime_of

        runtime_of(self).signal(workflow_id, name, payload)

    def workflow_handle(self, workflow_id: str) -> Any:
        """A :class:`~foundry.handle.Handle` on a workflow run, whoever started it."""
        from foundry.deliver.workflow import runtime_of

        return runtime_of(self).handle(workflow_id)

    def job(self, job_id: str) -> Any:
        """A :class:`~foundry.handle.Handle` on a durable queue job, whoever submitted it
        (``app.job(job_id).result(timeout=60)`` from any process)."""
        from foundry.deliver.queue import handle_for

        return handle_for(self, job_id)

    def close(self, timeout: float = 10.0) -> None:
        """Drain and stop every runtime this app started."""
        with self._lock:
            runners, self._runners = list(self._runners.values()), {}
        for runner in runners:
            runner.close(timeout)
        queue_module = sys.modules.get("foundry.deliver.queue")
        if queue_module is not None:  # handles made by app.job() hold a connection
            queue_module.close_handles(self)
        for decl in self.streams.values():  # their consumers and log connections
            decl.close(timeout)
        for unit in self.units.values():
            unit._runner = None

    def __enter__(self) -> Foundry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
