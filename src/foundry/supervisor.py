"""``Supervisor``: everything an app declares, run in one process — ``foundry run``.

Each component is the machinery its own command runs, unchanged:

=================  ==============================  =========================================
component          the command that runs it alone  what it is
=================  ==============================  =========================================
queue worker       ``foundry worker``              :class:`foundry.deliver.worker.Worker`
workflow worker    ``foundry workflows worker``    :class:`foundry.deliver.workflow.Worker`
stream consumers   ``foundry streams consume``     each stream's ``run(groups)``
pool server        ``foundry pool serve``          :class:`foundry.deliver.pool.serve.PoolServer`
scheduler          (only here)                     :class:`foundry.deliver.scheduler.Scheduler`
=================  ==============================  =========================================

They share the app's metrics registry (one ``/metrics`` endpoint shows them all) and
run as they always do: threads, and child processes for the pool's workers and for
``isolate=True`` jobs. The pool server runs here when the app's pool URL is
``local://served`` or NATS; on ``local://`` each submitting process starts its own
pool workers, so there is nothing to serve.

:meth:`Supervisor.stop` drains everything at once: the scheduler stops enqueuing, then
every other component gets ``grace`` seconds in parallel (the queue worker gives back
what has not started and lets running jobs finish; the workflow worker hands back runs
at their next durable call; consumers finish the event in hand and commit; pool workers
finish their request). :meth:`Supervisor.hurry` ends the grace (the queue worker releases
running jobs for immediate redelivery). A component that stops *by itself* — a queue
worker thread failed, a stream consumer died, the scheduler failed — makes
:meth:`Supervisor.watch` return a :class:`Failure` naming it: the process is no longer
what it was started as, so ``foundry run`` drains the rest and exits non-zero for its
supervisor (systemd, Kubernetes) to restart it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from foundry.errors import FoundryError

if TYPE_CHECKING:
    from foundry.app import Foundry
    from foundry.deliver.worker import JobEvent

__all__ = ["KINDS", "Failure", "Options", "Supervisor", "describe_app", "serves_pool"]

log = logging.getLogger("foundry.run")

KINDS = ("queue", "workflows", "streams", "pool", "schedules")


@dataclass(frozen=True, slots=True)
class Failure:
    """A component that stopped by itself: which (``kind``: one of :data:`KINDS`;
    ``component``: its name, e.g. ``"queue worker"``) and why."""

    kind: str
    component: str
    reason: str


class _Component:
    kind: str = ""
    name: str = ""

    def start(self) -> None:
        raise NotImplementedError

    def failure(self) -> str | None:
        return None

    def drain(self, grace: float) -> None:
        raise NotImplementedError

    def hurry(self) -> None:
        pass

    def describe(self) -> str:
        raise NotImplementedError

    def details(self) -> dict[str, Any]:
        return {}

    def summary(self) -> str:
        return ""


class _Queue(_Component):
    kind, name = "queue", "queue worker"

    def __init__(self, app: Foundry, queues: dict[str, int] | None, options: dict[str, Any]) -> None:
        from foundry.deliver.worker import Worker

        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()
        user = options.pop("on_event", None)

        def count(event: JobEvent) -> None:
            with self._lock:
                self.counts[event.kind] = self.counts.get(event.kind, 0) + 1
            if user is not None:
                user(event)

        self.worker = Worker(app, queues=queues, on_event=count, **options)

    def start(self) -> None:
        self.worker.start()

    def failure(self) -> str | None:
        return None if self.worker.failure is None else str(self.worker.failure)

    def drain(self, grace: float) -> None:
        self.worker.stop(grace)

    def hurry(self) -> None:
        self.worker.hurry()

    def describe(self) -> str:
        plan = ", ".join(f"{q.queue}x{q.concurrency} (prefetch {q.prefetch})" for q in self.worker.loops)
        return f"queue worker {self.worker.name}: {plan} on {self.worker.backend.url}"

    def details(self) -> dict[str, Any]:
        return {"queues": self.worker.queues}

    def summary(self) -> str:
        with self._lock:
            done = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
        return f"jobs: {done or 'none'}"


class _Workflows(_Component):
    kind, name = "workflows", "workflow worker"

    def __init__(self, app: Foundry, concurrency: int, lease: float) -> None:
        from foundry.deliver.workflow import Worker

        self.worker = Worker(app, concurrency=concurrency, lease=lease)
        self.concurrency = concurrency
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False

    def start(self) -> None:
        def guarded() -> None:
            try:
                self.worker.run()
            except BaseException as exc:
                self._error = exc
                log.critical("workflow worker %s failed", self.worker.owner, exc_info=exc)

        self._thread = threading.Thread(target=guarded, name="foundry-run-workflows", daemon=True)
        self._thread.start()

    def failure(self) -> str | None:
        if self._error is not None:
            return f"its claim loop failed ({type(self._error).__name__}: {self._error})"
        if self._thread is not None and not self._thread.is_alive() and not self._stopping:
            return "its claim loop ended"
        return None

    def drain(self, grace: float) -> None:
        self._stopping = True
        self.worker.stop(timeout=grace)

    def describe(self) -> str:
        return (
            f"workflow worker {self.worker.owner}: {', '.join(sorted(self.worker.names))} "
            f"x{self.concurrency} on {self.worker.runtime.journal.url}"
        )

    def details(self) -> dict[str, Any]:
        return {"workflows": sorted(self.worker.names)}

    def summary(self) -> str:
        return f"workflow runs claimed: {self.worker.claimed}"


class _Streams(_Component):
    kind, name = "streams", "stream consumers"

    def __init__(self, app: Foundry, consumers: int) -> None:
        self.app = app
        self.consumers = consumers
        self.running: list[Any] = []

    def start(self) -> None:
        for decl in self.app.streams.values():
            if decl.groups:
                self.running.append(decl.run(list(decl.groups), consumers=self.consumers))

    def failure(self) -> str | None:
        failures = [f for c in self.running for f in c.failures]
        if not failures:
            return None
        name, error = failures[0]
        return (
            f"consumer {name} died ({type(error).__name__}: {error}; {len(failures)} died in all; its "
            "partitions went to the group's other members)"
        )

    def drain(self, grace: float) -> None:
        until = time.monotonic() + grace
        for c in self.running:
            c.stop(max(0.1, until - time.monotonic()))

    def describe(self) -> str:
        groups = "; ".join(
            f"{c.runtime.name}: {', '.join(sorted({m.group for m in c.members}))}" for c in self.running
        )
        from foundry.config import safe_url

        url = self.app.settings.stream
        return f"stream consumers x{self.consumers} per group: {groups} on {safe_url(url)}"

    def details(self) -> dict[str, Any]:
        return {
            "streams": [
                {"stream": c.runtime.name, "group": m.group, "consumer": m.name, "owned": sorted(m.owned)}
                for c in self.running
                for m in c.members
            ]
        }


class _Pool(_Component):
    kind, name = "pool", "pool server"

    def __init__(self, app: Foundry, units: list[str], minimum: int | None, maximum: int | None) -> None:
        self.app = app
        self.units = units
        self.bounds = (minimum, maximum)
        self.server: Any = None

    def start(self) -> None:
        from foundry.deliver.pool.serve import PoolServer

        specs = [self.app.spec(name) for name in self.units]
        minimum, maximum = self.bounds
        self.server = PoolServer(
            self.app.settings.pool, specs, self.app.context(), minimum=minimum, maximum=maximum
        )

    def drain(self, grace: float) -> None:
        if self.server is not None:
            self.server.close(timeout=grace)

    def describe(self) -> str:
        rows = self.server.status() if self.server is not None else []
        return "pool server: " + ", ".join(
            f"{r['unit']} on {r['where']} with {r['bounds'][0]}..{r['bounds'][1]} workers" for r in rows
        )

    def details(self) -> dict[str, Any]:
        rows = self.server.status() if self.server is not None else []
        return {
            "pool": [r["unit"] for r in rows],
            "workers": {r["unit"]: {"live": r["live"], "busy": r["busy"]} for r in rows},
        }

    def summary(self) -> str:
        rows = self.server.status() if self.server is not None else []
        return "pool requests served: " + (", ".join(f"{r['unit']} {r['served']}" for r in rows) or "none")


class _Schedules(_Component):
    kind, name = "schedules", "scheduler"

    def __init__(self, app: Foundry, clock: Callable[[], float]) -> None:
        from foundry.deliver.scheduler import Scheduled, Scheduler
        from foundry.schedules.schedule import takes_tick

        units = []
        for name, unit in app.units.items():
            if unit.schedule is not None:
                tick = takes_tick(name, unit.fn, unit.schedule.expression)
                units.append(Scheduled(unit.spec, unit.schedule, tick))
        self.scheduler = Scheduler(units, app.context(), clock=clock)

    def start(self) -> None:
        self.scheduler.start()

    def failure(self) -> str | None:
        return None if self.scheduler.failure is None else str(self.scheduler.failure)

    def drain(self, grace: float) -> None:
        self.scheduler.stop(timeout=max(grace, 1.0))

    def describe(self) -> str:
        rows = self.scheduler.status()
        when = "; ".join(f"{r['unit']} {r['schedule']} missed={r['missed']}" for r in rows)
        return f"scheduler {self.scheduler.name}: {when} on {self.scheduler.runtime.backend.url}"

    def details(self) -> dict[str, Any]:
        return {"schedules": self.scheduler.status()}

    def summary(self) -> str:
        return f"ticks enqueued: {sum(r['enqueued'] for r in self.scheduler.status())}"


def serves_pool(app: Foundry) -> bool:
    """Whether the app's pool units are served by a separate process (``local://served``
    or NATS) rather than by workers each submitting process starts (``local://``)."""
    from foundry.backends.pool import engine_name

    return engine_name(app.settings.pool) != "local"


def describe_app(app: Foundry) -> str:
    """What an app declares, in one line: ``queue units a, b; workflows w; ...``."""
    by: dict[str, list[str]] = {}
    for name, unit in app.units.items():
        delivery = unit.decision.delivery
        kind = {"queue": "queue units", "pool": "pool units"}.get(delivery, "in-process units")
        by.setdefault(kind, []).append(name)
        if unit.schedule is not None:
            by.setdefault("schedules", []).append(f"{name} ({unit.schedule.describe()})")
    if app.workflows:
        by["workflows"] = sorted(app.workflows)
    consumers = [f"{n} (groups {', '.join(d.groups) or 'none'})" for n, d in app.streams.items()]
    if consumers:
        by["streams"] = consumers
    order = ("queue units", "schedules", "workflows", "streams", "pool units", "in-process units")
    parts = [f"{kind} {', '.join(by[kind])}" for kind in order if kind in by]
    return "; ".join(parts) or "nothing"


@dataclass(frozen=True, slots=True)
class Options:
    """How each component runs (``foundry run``'s flags; the defaults are theirs)."""

    queues: dict[str, int] | None = None  # queue -> concurrency (default: the app's queues)
    concurrency: int = 8  # jobs run at once per queue
    prefetch: int | None = None  # jobs held per queue (2 x concurrency)
    lease: float = 30.0  # seconds, per job and per workflow run
    grace: float = 30.0  # seconds running work gets on stop()
    backoff: float = 1.0  # first retry delay of units that declare none
    workflow_concurrency: int = 8
    consumers: int = 1  # per stream group
    pool_min: int | None = None  # pool workers per unit (the unit's min_workers)
    pool_max: int | None = None


class Supervisor:
    """The components of ``app`` that ``only`` names (default: every one it declares),
    run with ``options``. ``on_event`` sees the queue worker's job events; ``clock`` is the
    scheduler's."""

    def __init__(
        self,
        app: Foundry,
        options: Options | None = None,
        *,
        only: Iterable[str] | None = None,
        on_event: Callable[[JobEvent], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.app = app
        self.options = options = options or Options()
        wanted = set(KINDS if only is None else only)
        unknown = sorted(wanted - set(KINDS))
        if unknown:
            raise ValueError(f"unknown component kinds {unknown}; known: {', '.join(KINDS)}")
        self.notes: list[str] = []
        self.components: list[_Component] = []
        self._stopped: list[_Component] = []
        self._hurried = False
        try:
            self._plan(wanted, only is not None, on_event, clock)
        except BaseException:
            self.stop(0.0)
            raise

    def _plan(
        self,
        wanted: set[str],
        explicit: bool,
        on_event: Callable[[JobEvent], None] | None,
        clock: Callable[[], float],
    ) -> None:
        app, o = self.app, self.options
        queued = [n for n, u in app.units.items() if u.decision.delivery == "queue"]
        pooled = [n for n, u in app.units.items() if u.decision.delivery == "pool"]
        scheduled = [n for n, u in app.units.items() if u.schedule is not None]
        if pooled and "pool" in wanted and not serves_pool(app) and not explicit:
            self.notes.append(
                f"pool units {', '.join(pooled)} are served by each submitting process's own workers "
                "(pool=local://); set pool=local://served or nats://… to serve them here"
            )
            wanted.discard("pool")
        if "pool" in wanted and pooled:
            self.components.append(_Pool(app, pooled, o.pool_min, o.pool_max))
        if "queue" in wanted and (queued or o.queues):
            worker = {
                "concurrency": o.concurrency,
                "prefetch": o.prefetch,
                "lease": o.lease,
                "grace": o.grace,
                "backoff": o.backoff,
                "on_event": on_event,
            }
            self.components.append(_Queue(app, o.queues, worker))
        if "workflows" in wanted and app.workflows:
            self.components.append(_Workflows(app, o.workflow_concurrency, o.lease))
        if "streams" in wanted and any(d.groups for d in app.streams.values()):
            self.components.append(_Streams(app, o.consumers))
        if "schedules" in wanted and scheduled:
            self.components.append(_Schedules(app, clock))

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Supervisor:
        """Start every component (the scheduler last: its first ticks find the workers up).
        If one cannot start, those already started are stopped and the error raised."""
        try:
            for component in self.components:
                component.start()
        except BaseException:
            self.stop(0.0)  # those not started yet hold connections too
            raise
        return self

    def watch(self, until: threading.Event, poll: float = 0.2) -> Failure | None:
        """Wait until ``until`` is set (``None``) or a component stops by itself (its
        :class:`Failure`)."""
        while not until.wait(poll):
            failure = self.failure()
            if failure is not None:
                return failure
        return self.failure()

    def failure(self) -> Failure | None:
        for component in self.components:
            reason = component.failure()
            if reason is not None:
                return Failure(component.kind, component.name, reason)
        return None

    def hurry(self) -> None:
        """End the grace of a stop in progress (or the next one)."""
        self._hurried = True
        for component in [*self._stopped, *self.components]:  # a drain in progress too
            component.hurry()

    def stop(self, grace: float | None = None) -> None:
        """Drain every component (see the module docstring); idempotent."""
        components, self.components = self.components, []
        self._stopped += components
        self._drain(components, self.options.grace if grace is None else grace)

    def _drain(self, components: list[_Component], grace: float) -> None:
        if self._hurried:
            grace = 0.0
        first = [c for c in components if c.kind == "schedules"]  # no new ticks while the rest drain
        for c in first:
            _safely(c, grace)
        threads = [
            threading.Thread(target=_safely, args=(c, grace), name=f"foundry-run-drain-{c.kind}", daemon=True)
            for c in components
            if c not in first
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + grace + 60.0
        for t in threads:
            while t.is_alive() and time.monotonic() < deadline:
                t.join(0.2)  # short joins: a second signal's handler runs in between

    # -- what it shows -----------------------------------------------------------------

    def describe(self) -> list[str]:
        return [c.describe() for c in self.components]

    def details(self) -> dict[str, Any]:
        """The fleet record's ``details``: what every component serves."""
        out: dict[str, Any] = {
            "components": [c.name for c in self.components],
            "units": sorted(self.app.units),
        }
        for component in self.components:
            out.update(component.details())
        return out

    def summary(self) -> str:
        done = self._stopped or self.components
        return "; ".join(s for s in (c.summary() for c in done) if s)


def _safely(component: _Component, grace: float) -> None:
    try:
        component.drain(grace)
    except FoundryError as exc:
        log.warning("%s did not drain cleanly: %s", component.name, exc)
    except Exception:
        log.exception("%s did not drain cleanly", component.name)
