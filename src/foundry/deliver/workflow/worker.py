"""``Worker``: runs the workflows of an app from the journal, on any machine.

It claims pending workflows, the orphans of dead workers (their lease lapsed) and
parked workflows that are due (a timer passed, a signal or a child woke them), runs
each on a bounded thread pool with a heartbeated lease, and hands them back on stop.
Start as many as you like, on as many hosts: the lease token fences them apart.

An idle worker looks again every ``poll`` seconds, and at once when the journal says a
commit may have made something claimable (``journal.changes``: a workflow enqueued, a
signal, a child finished, a cancellation, a hand-back — in any process when the journal
can tell, as SQLite on Linux can). The poll remains what finds timers that came due and
leases that lapsed.

**One run's failure is that run's.** A row the journal cannot decode is set aside by the
journal (the workflow ends failed, the reason naming the field); an exception the
runtime raises while running one workflow ends that workflow failed with it
(``WorkflowRuntime._charge``). Neither stops the worker or touches another workflow.

**A suspect runs alone.** A claim whose previous run ended without an outcome (its
worker died or hung holding it: ``Claim.suspect``) may be what killed that worker, or may
merely have shared it. So this worker runs it with nothing else: it hands back the rest
of that claim, stops resuming its own parked workflows, lets the runs in flight end
(at most half a lease), marks the run alone in the journal (``mark_alone``), runs it and
waits for it to end; only then does it claim again. If the worker dies now,
the journal charges that workflow alone, and sets it aside after ``MAX_CRASHES`` such
deaths; a healthy workflow that shared a worker with a poison one is never charged, and
is not killed with it again and again. Ordinary claims pay nothing for this.

**No zombie.** An exception the claim loop or the keeper thread (heartbeats, wake-ups)
cannot handle stops the whole worker: it hands back what it can, records a
:class:`~foundry.errors.WorkerFailedError` in ``failure`` and raises it from ``run()``
(``foundry workflows worker`` prints it and exits 1) — never a process that looks alive
while nothing claims or heartbeats. An outage of the journal is not such an error: the
loop backs off and tries again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Mapping
from typing import Any, Protocol

from foundry.backends.journal import Clock, JournalBackend
from foundry.backends.journal.base import Claim
from foundry.deliver.workflow.runtime import WorkflowRuntime, journal_from
from foundry.errors import BackendError, FoundryError, NotFoundError, WorkerFailedError
from foundry.runtime import RuntimeContext

__all__ = ["Worker"]

log = logging.getLogger("foundry.workflow.worker")


class AppLike(Protocol):
    """What a worker needs of an app (``foundry.Foundry`` has it)."""

    @property
    def workflows(self) -> Mapping[str, Any]: ...

    def context(self) -> RuntimeContext: ...


class Worker:
    """A workflow worker for ``app``. ``run()`` blocks; ``start()`` runs it in a thread."""

    def __init__(
        self,
        app: AppLike,
        *,
        journal: str | JournalBackend | None = None,
        names: Collection[str] | None = None,
        concurrency: int = 8,
        lease: float = 30.0,
        poll: float = 0.5,
        inline_wait: float = 1.0,
        clock: Clock | None = None,
    ) -> None:
        ctx = app.context()
        self.names = frozenset(names if names is not None else app.workflows)
        if not self.names:
            raise NotFoundError(
                f"app {ctx.app_name!r} declares no workflows, so this worker has nothing to run. "
                "Fix: point the worker at the module that declares them (module:app)"
            )
        backend, own = journal_from(journal, ctx.settings.journal, clock)
        self.concurrency = concurrency
        self.poll = poll
        self.runtime = WorkflowRuntime(
            backend,
            ctx.lookup,
            metrics=ctx.metrics,
            names_=self.names,
            lease=lease,
            inline_wait=inline_wait,
            poll=poll,
            concurrency=concurrency,
            own_journal=own,
            errors=ctx.errors,
            watchdog=ctx.settings.watchdog,
            tracing=ctx.tracing,
        )
        self.claimed = 0
        self.failure: WorkerFailedError | None = None  # why the worker stopped by itself, if it did
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.runtime.on_failure = lambda exc: self.fail("keeper", exc)

    @property
    def owner(self) -> str:
        return self.runtime.owner

    def run_once(self, limit: int | None = None) -> int:
        """Claim what is claimable now (up to ``limit``) and run it in this thread."""
        rt = self.runtime
        claims = rt.journal.claim(rt.owner, lease=rt.lease, limit=limit or self.concurrency, names=self.names)
        for claim in claims:
            try:
                rt.execute(claim)
            except FoundryError as exc:
                log.warning("workflow %s (%s) stopped: %s", claim.name, claim.id, exc)
        self.claimed += len(claims)
        return len(claims)

    def drain(self, max_rounds: int = 1000) -> int:
        """``run_once`` until nothing is claimable; how many runs it made (tests, scripts)."""
        total = 0
        for _ in range(max_rounds):
            n = self.run_once()
            if n == 0:
                break
            total += n
        return total

    def run(self) -> None:
        """Claim and run until :meth:`stop`. Raises :class:`WorkerFailedError` when the
        worker stopped because a thread of its own failed (see ``failure``)."""
        try:
            self._claim_loop()
        except Exception as exc:
            self.fail("claim", exc)
        if self.failure is not None:
            self.stop()  # hand back what it can now, whoever called run()
            raise self.failure

    def fail(self, role: str, exc: BaseException) -> None:
        """Stop the worker because its ``role`` thread cannot go on (the first reason is
        kept in ``failure``; ``run()`` raises it)."""
        if self.failure is None:
            error = WorkerFailedError(
                f"workflow worker {self.owner}: its {role} thread failed ({type(exc).__name__}: {exc}); the "
                "worker stopped, handing back the workflows it could (the others' leases lapse and "
                "another worker resumes them). Fix: a bug in Foundry or the workflow, see the traceback "
                "logged above; restart the worker"
            )
            error.__cause__ = exc
            self.failure = error
            log.critical("%s", error, exc_info=exc)
        self._stop.set()
        self.runtime.journal.changes.notify()  # the claim loop may be waiting for a change

    def _claim_loop(self) -> None:
        rt = self.runtime
        changes = rt.journal.changes
        backoff = self.poll
        while not self._stop.is_set():
            mark = changes.mark()  # before the claim: a commit after it wakes the wait below
            free = self.concurrency - rt.active()
            got = 0
            if free > 0:
                try:
                    claims = rt.journal.claim(rt.owner, lease=rt.lease, limit=free, names=self.names)
                except BackendError as exc:
                    log.warning("worker %s: claim failed (%s); retrying in %.1fs", rt.owner, exc, backoff)
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, 30.0)
                    continue
                backoff = self.poll
                suspect = next((c for c in claims if c.suspect), None)
                for claim in claims:
                    if suspect is None:
                        rt.submit(claim)
                    elif claim is not suspect:  # another worker may have it while the suspect runs
                        self._hand_back(claim)
                if suspect is not None:
                    self._run_alone(suspect)
                got = len(claims)
                self.claimed += got
            if got == 0:
                changes.wait(mark, self.poll)
            elif got == free:
                self._stop.wait(0.01)

    def _hand_back(self, claim: Claim) -> None:
        try:
            self.runtime.journal.release(claim.id, claim.token, suspect=claim.suspect)
        except BackendError as exc:  # its lease lapses instead
            log.warning("worker %s: could not hand back %s (%s)", self.owner, claim.id, exc)

    def _run_alone(self, claim: Claim) -> None:
        """Run a suspect with nothing else running in this worker (see the module docstring)."""
        rt = self.runtime
        patience = rt.lease / 2  # its lease is not extended before it runs
        rt.solo = True
        try:
            alone = rt.wait_idle(patience)
            if self._stop.is_set():
                self._hand_back(claim)
                return
            if alone:
                try:
                    marked = rt.journal.mark_alone(claim.id, claim.token)
                except BackendError as exc:
                    log.warning("worker %s: could not mark %s alone (%s)", self.owner, claim.id, exc)
                    self._hand_back(claim)
                    return
                if not marked:
                    return  # taken over meanwhile
                log.info(
                    "workflow %s (%s): its last run ended without an outcome; it runs alone",
                    claim.name,
                    claim.id,
                )
            else:
                log.warning(
                    "workflow %s (%s): its last run ended without an outcome, but the runs beside it did "
                    "not end within %.0fs; it runs beside them (a death now is not charged to it)",
                    claim.name,
                    claim.id,
                    patience,
                )
            run = rt.submit(claim)  # on the pool, as any run: a stop hands it back the same way
            while not self._stop.is_set():
                try:
                    run.result(timeout=0.1)
                    break
                except TimeoutError:
                    continue
        finally:
            rt.solo = False

    def start(self) -> Worker:
        """Run in a thread; a failure of its own is kept in ``failure`` (and logged)."""
        self._thread = threading.Thread(
            target=self._run_quietly, name=f"foundry-worker-{self.owner}", daemon=True
        )
        self._thread.start()
        return self

    def _run_quietly(self) -> None:
        try:
            self.run()
        except WorkerFailedError:
            pass  # recorded in ``failure`` and logged by ``fail``

    def stop(self, timeout: float = 10.0) -> None:
        """Stop claiming; runs in flight hand back their workflows at their next durable
        call (another worker resumes them at once) or finish within ``timeout``."""
        self._stop.set()
        self.runtime.journal.changes.notify()  # the run loop may be waiting for a change
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self.runtime.close(timeout)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
