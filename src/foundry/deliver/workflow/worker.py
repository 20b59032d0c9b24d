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
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Mapping
from typing import Any, Protocol

from foundry.backends.journal import Clock, JournalBackend
from foundry.deliver.workflow.runtime import WorkflowRuntime, journal_from
from foundry.errors import BackendError, FoundryError, NotFoundError
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
        )
        self.claimed = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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
        """Claim and run until :meth:`stop`."""
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
                for claim in claims:
                    rt.submit(claim)
                got = len(claims)
                self.claimed += got
            if got == 0:
                changes.wait(mark, self.poll)
            elif got == free:
                self._stop.wait(0.01)

    def start(self) -> Worker:
        self._thread = threading.Thread(target=self.run, name=f"foundry-worker-{self.owner}", daemon=True)
        self._thread.start()
        return self

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
