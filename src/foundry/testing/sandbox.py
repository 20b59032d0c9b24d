"""``Sandbox``: one app, for one test, with its own stores, eager durable units and a
manual clock.

While a sandbox holds an app (``with Sandbox(app, home=tmp_path): ...``, or the pytest
fixtures of :mod:`foundry.testing.plugin`):

* **its state lives in ``home``**: the queue, the workflow journal and the stream log are
  SQLite files there, whatever ``FOUNDRY_*``, ``foundry.toml`` or the app's arguments
  say; nothing is written to the working directory;
* **queue units run at submit** (``eager=True``, the default), in the caller's thread,
  through the same encode/decode as the real path (:mod:`foundry.testing._jobs`), so no
  worker is needed and a payload the JSON codec refuses fails here too;
* **workflows** run in this process, as they always do, on a journal in ``home`` and on
  :attr:`clock`; ``submit`` returns once the run has finished or parked (on a
  ``wf.sleep``, a ``wf.wait_for``, a retry back-off), and :meth:`ManualClock.advance
  <foundry.testing.ManualClock.advance>` wakes each timer at its time;
* **schedules** tick on :attr:`clock`: the real scheduler looks at every tick
  ``clock.advance`` passes, enqueues the tick's job in ``home``, and the job runs there
  and then, eagerly (a tick job that fails raises from ``advance``);
* **streams** (``app.stream``) publish to the log in ``home``, and (``eager=True``)
  ``publish`` returns once the stream's consumer groups have handled the events, on the
  real consumers in this process; a handler that fails an event for good (retried, then
  dead-lettered) raises its exception from ``publish``.

Leaving it closes everything it started and gives the app back its own settings.
Nothing here is global: an app no sandbox holds runs as it always does.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from foundry.backends.queue import NewJob
from foundry.config import Settings
from foundry.deliver.queue import queue_of
from foundry.errors import SubmitError
from foundry.handle import Handle
from foundry.runtime import RuntimeContext, UnitSpec
from foundry.serialize import encode_error, get_codec
from foundry.testing._jobs import job_handle, run_job, settle
from foundry.testing.clock import ManualClock

if TYPE_CHECKING:
    from foundry.app import Foundry
    from foundry.deliver.scheduler import Scheduler
    from foundry.deliver.workflow import WorkflowRuntime

__all__ = ["Sandbox", "sandbox_of"]

# foundry.app's runtime modules while a sandbox holds the app (queue: with eager=True)
QUEUE_ROUTE = "foundry.testing._queue"
STREAM_ROUTE = "foundry.testing._stream"  # declared streams (app.stream): publish drains the consumers
WORKFLOW_ROUTE = "foundry.testing._workflow"

_SANDBOXES: dict[int, Sandbox] = {}  # id(app.metrics) -> the sandbox holding that app
_LOCK = threading.Lock()


def sandbox_of(ctx: RuntimeContext) -> Sandbox:
    """The sandbox holding the app whose runtime context ``ctx`` is."""
    with _LOCK:
        sandbox = _SANDBOXES.get(id(ctx.metrics))
    if sandbox is None:
        raise SubmitError(
            f"app {ctx.app_name!r}: an eager runner was asked for outside a foundry.testing.Sandbox. "
            "Fix: enter the sandbox (with Sandbox(app, home=...)) before submitting"
        )
    return sandbox


class _Held:
    """A job waiting for the clock (``delay=``/``eta=``)."""

    __slots__ = ("future", "job", "spec")

    def __init__(self, spec: UnitSpec, job: NewJob, future: cf.Future[Any]) -> None:
        self.spec, self.job, self.future = spec, job, future


class Sandbox:
    """``app`` held for a test (see the module docstring). ``home``: where its stores go
    (required: a test's temporary directory); ``clock``: a shared
    :class:`~foundry.testing.ManualClock` (default: a new one); ``eager=False`` keeps the
    real queue delivery (jobs wait for a :class:`~foundry.deliver.worker.Worker` you run)."""

    def __init__(
        self,
        app: Foundry,
        *,
        home: str | os.PathLike[str],
        clock: ManualClock | None = None,
        eager: bool = True,
        timeout: float = 30.0,
    ) -> None:
        self.app = app
        self.home = Path(home).absolute()
        self.clock = clock if clock is not None else ManualClock()
        self.eager = eager
        self.timeout = timeout  # the longest a settle (workflows, tick jobs) may take
        self._saved: tuple[Settings | None, dict[str, str]] | None = None
        self._keys: dict[str, Handle] = {}  # idempotency key -> the first job's handle
        self._held: list[_Held] = []
        self._lock = threading.Lock()
        self._workflows: WorkflowRuntime | None = None
        self._scheduler: Scheduler | None = None
        self._next_tick: float | None = None

    # -- entering and leaving ---------------------------------------------------------

    def __enter__(self) -> Sandbox:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> Sandbox:
        app = self.app
        key = id(app.metrics)
        with _LOCK:
            if key in _SANDBOXES:
                raise SubmitError(
                    f"app {app.name!r} is already held by a foundry.testing.Sandbox. Fix: use that one "
                    "(one sandbox per app at a time)"
                )
            _SANDBOXES[key] = self
        try:
            app.close()  # runners made before it held the app stop; new ones are made for it
            self._saved = (app._settings, dict(app._routes))
            self.home.mkdir(parents=True, exist_ok=True)
            old = app._settings
            app._settings = Settings(
                home=self.home,
                queue=f"sqlite:///{self.home / 'queue.db'}",
                stream=f"sqlite:///{self.home / 'stream.db'}",
                journal=f"sqlite:///{self.home / 'journal.db'}",
                source="foundry.testing.Sandbox",
                watchdog=old.watchdog if old is not None else None,
            )
            app._routes["workflow"] = WORKFLOW_ROUTE  # on this journal and clock, eager or not
            if self.eager:
                app._routes["queue"] = QUEUE_ROUTE
                app._routes["stream_log"] = STREAM_ROUTE
            if app.workflows:
                self.ensure_workflows()
            self._ensure_scheduler()
            self.clock.attach(self)
        except BaseException:
            self.close()
            raise
        return self

    def ensure_workflows(self) -> WorkflowRuntime:
        """The app's workflow runtime on the sandbox's journal and clock, made on first use
        (timers park at once: ``inline_wait=0``, so only ``clock.advance`` ends them)."""
        with self._lock:
            if self._workflows is None or self._workflows.closed:
                from foundry.deliver.workflow import configure

                self._workflows = configure(
                    self.app, journal=self.app.settings.journal, clock=self.clock, inline_wait=0.0, poll=0.05
                )
            return self._workflows

    def _ensure_scheduler(self) -> None:
        """The real scheduler on the sandbox's clock, for the units declared with a
        schedule (made when the first one is seen: its first look misses nothing)."""
        if self._scheduler is not None or self._saved is None:
            return
        if not any(unit.schedule is not None for unit in self.app.units.values()):
            return
        from foundry.deliver.scheduler import Scheduled, Scheduler
        from foundry.schedules.schedule import takes_tick

        units = [
            Scheduled(unit.spec, unit.schedule, takes_tick(name, unit.fn, unit.schedule.expression))
            for name, unit in self.app.units.items()
            if unit.schedule is not None
        ]
        self._scheduler = Scheduler(units, self.app.context(), clock=self.clock.time)
        self._next_tick = self._scheduler.look()  # first sight: nothing was missed

    def close(self) -> None:
        """Stop what the sandbox started and give the app back its own settings."""
        app = self.app
        self.clock.detach(self)
        with self._lock:
            held, self._held = self._held, []
        for item in held:
            item.future.cancel()
        if self._scheduler is not None:
            self._scheduler.close()
            self._scheduler = None
        app.close()
        if self._workflows is not None:
            self._workflows.close(self.timeout)
            self._workflows = None
        if self._saved is not None:
            app._settings, routes = self._saved
            app._routes.clear()
            app._routes.update(routes)
            self._saved = None
        with _LOCK:
            if _SANDBOXES.get(id(app.metrics)) is self:
                del _SANDBOXES[id(app.metrics)]

    # -- eager jobs -------------------------------------------------------------------

    def take_job(self, spec: UnitSpec, job: NewJob) -> Handle:
        """A job an eager runner would have enqueued: run now, or held for the clock."""
        with self._lock:
            if job.key is not None and job.key in self._keys:
                return self._keys[job.key]  # the queue's contract: a duplicate key returns the first
            future: cf.Future[Any] = cf.Future()
            handle = job_handle(spec, job, future)
            if job.key is not None:
                self._keys[job.key] = handle
            if job.eta is not None and job.eta > self.clock.time():
                self._held.append(_Held(spec, job, future))
                return handle
        future.set_running_or_notify_cancel()
        settle(future, run_job(spec, job))
        return handle

    def _run_held(self) -> None:
        now = self.clock.time()
        with self._lock:
            due = sorted((h for h in self._held if h.job.eta is not None and h.job.eta <= now), key=_order)
            self._held = [h for h in self._held if h not in due]
        for item in due:
            if item.future.set_running_or_notify_cancel():  # False: cancelled while it waited
                settle(item.future, run_job(item.spec, item.job))

    # -- the clock's stops ------------------------------------------------------------

    def next_due(self) -> float | None:
        """The next instant something of this sandbox is due on its clock."""
        self._ensure_scheduler()
        times = [self._next_tick] if self._next_tick is not None else []
        with self._lock:
            times += [h.job.eta for h in self._held if h.job.eta is not None and not h.future.done()]
        if self._workflows is not None:
            wake = self._workflows.next_wake()
            if wake is not None:
                times.append(wake)
        return min(times, default=None)

    def fire(self) -> None:
        """Run what is due at the clock's time: schedule ticks, held jobs, workflow timers."""
        if self._scheduler is not None:
            before = self._scheduler.status()
            self._next_tick = self._scheduler.look()
            if self.eager and self._scheduler.status() != before:  # else they wait for your Worker
                self._drain_ticks()
        self._run_held()
        self.settle()

    def _drain_ticks(self) -> None:
        """Run the tick jobs the scheduler enqueued in ``home``, eagerly like any job (the
        store then holds their outcomes); a tick job that failed raises here."""
        scheduler = self._scheduler
        assert scheduler is not None
        backend = scheduler.runtime.backend
        failed: BaseException | None = None
        for queue in sorted({queue_of(unit.spec) for unit in scheduler.units}):
            while claimed := backend.claim(queue, "foundry.testing", lease=3600.0, limit=100, timeout=0.0):
                for c in claimed:
                    spec = self.app.spec(c.unit)
                    job = NewJob(c.id, c.queue, c.unit, c.payload, c.codec, max_retries=c.max_retries)
                    outcome = run_job(spec, job)
                    if outcome.error is None:
                        result = get_codec(spec.traits.codec).encode(
                            outcome.value, unit=c.unit, what="the result"
                        )
                        backend.complete(c.id, c.token, result)
                    else:
                        backend.fail(c.id, c.token, json.dumps(encode_error(outcome.error)).encode())
                        failed = failed or outcome.error
        if failed is not None:
            raise failed

    def settle(self) -> None:
        """Wait until this app's workflows have run what is due (a signal sent, a timer
        passed) and are finished or parked again."""
        if self._workflows is not None and not self._workflows.settle(self.timeout):
            raise SubmitError(
                f"app {self.app.name!r}: its workflows were still running {self.timeout}s after the clock "
                "moved. Fix: look for a step that blocks (on real time, a lock, a network call)"
            )

    @property
    def workflows(self) -> WorkflowRuntime | None:
        """The app's workflow runtime in this sandbox (``None``: it declares none)."""
        return self._workflows

    def __repr__(self) -> str:
        return f"<Sandbox {self.app.name} home={self.home} eager={self.eager} {self.clock!r}>"


def _order(item: _Held) -> tuple[float, int]:
    return (item.job.eta or 0.0, -item.job.priority)
