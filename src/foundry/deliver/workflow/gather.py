"""Fan-out and fan-in inside a workflow: ``wf.gather(...)`` and ``wf.map(...)``.

A gather at position *p* with *k* branches journals a ``gather`` entry at *p* (its branch
count, written before any branch runs) and each branch at *p + 1 + i* (``ref`` = *p*), as
the step or child it is; the workflow's next durable call is at *p + 1 + k*. The header
is resolved once all branches are: ``ok``, or ``error`` with the error the gather raised
(``ref`` = the branch that failed).

* **Replay.** A resumed run replays every branch that has a final entry and runs only the
  others. A resolved header replays the whole gather without running anything.
* **Failure.** The first branch that fails for good stops the fan-out: no further branch
  starts; branches waiting (an ``async def`` step, a back-off, a child) are cancelled (a
  child is asked to cancel and compensates itself); a synchronous step that is running
  cannot be interrupted and is waited for. The completed branches' undos are then
  registered in the order the branches completed, so compensation runs them in reverse.
  A cancellation of the workflow or its deadline stops the fan-out the same way.
* **Crash.** After a crash the journal says what happened: a branch with a final entry is
  replayed; if the fan-out had stopped already (a branch failed, a cancellation, the
  deadline), only the branches that may have been running when the run ended (their
  code may have had its effect) run again — so that they are recorded and undone — and
  branches that had not started never run.

The branches run on an event loop: the workflow's own in an ``async def`` workflow, one
made for the gather in a ``def`` workflow. ``async def`` steps run on it as tasks,
synchronous steps on the runtime's step threads, children as runs of their own.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from foundry.backends.journal.base import Entry, EntryKind, EntryStatus
from foundry.deliver.workflow._plan import Branch, Tracker, _Control, _Suspend, adrive
from foundry.errors import CancelledError, NonDeterminismError, RecordError, SubmitError
from foundry.serialize import ErrorTypes

if TYPE_CHECKING:
    from foundry.deliver.workflow.run import Run

__all__ = ["MAX_BRANCHES", "gather"]

MAX_BRANCHES = 10_000


def check_branches(run: Run, branches: Sequence[Any], name: str) -> list[Branch]:
    if not branches:
        raise SubmitError(
            f"workflow {run.claim.name!r}: gather {name!r} has no branches. Fix: pass at least one "
            "wf.branch(...) (or call wf.map with a non-empty list)"
        )
    if len(branches) > MAX_BRANCHES:
        raise SubmitError(
            f"workflow {run.claim.name!r}: gather {name!r} has {len(branches)} branches, more than "
            f"{MAX_BRANCHES}; each is a journal entry of this workflow. Fix: fan out to child workflows "
            "that each gather a slice"
        )
    bad = [b for b in branches if not isinstance(b, Branch)]
    if bad:
        raise SubmitError(
            f"workflow {run.claim.name!r}: gather {name!r} got {type(bad[0]).__name__} {bad[0]!r}, "
            "not a branch. Fix: describe each with wf.branch(fn, *args, ...) or "
            "wf.child_branch(workflow, ...)"
        )
    return list(branches)


async def gather(run: Run, branches: Sequence[Branch], *, concurrency: int | None, name: str) -> list[Any]:
    """Run ``branches`` concurrently (at most ``concurrency`` at once) as one durable call."""
    branches = check_branches(run, branches, name)
    if concurrency is not None and (
        isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
    ):
        raise SubmitError(
            f"workflow {run.claim.name!r}: gather {name!r} concurrency={concurrency!r} is not a positive "
            "integer. Fix: e.g. concurrency=8, or None for all branches at once"
        )
    pos, header = run.next(EntryKind.GATHER, name)
    k = len(branches)
    if header is not None and header.detail != str(k):
        raise NonDeterminismError(
            f"{run.where(pos)}: gather {name!r} now has {k} branches, but the journal recorded "
            f"{header.detail} there. Fix: keep the old fan-out behind `if wf.patched(...)` until its runs "
            "finish"
        )
    first = pos + 1
    run.pos = first + k
    entries: dict[int, Entry] = {}
    for i, b in enumerate(branches):
        entry = run.history.get(first + i)
        if entry is None:
            continue
        if entry.kind != b.kind or entry.name != b.name or entry.ref != pos:
            raise run.mismatch(first + i, f"branch {i} of gather {name!r}: {b.kind} {b.name!r}", entry)
        entries[i] = entry
    fanout = Fanout(run, pos, name, branches, entries, concurrency or k)
    if header is not None and header.final:
        return fanout.replayed(header)
    run.live()
    if header is None:
        now = run.rt.clock.time()
        run.record(Entry(pos, EntryKind.GATHER, name, EntryStatus.WAITING, started_at=now, detail=str(k)))
    return await fanout.run()


class Fanout:
    """One gather in flight (see the module docstring)."""

    def __init__(
        self,
        run: Run,
        pos: int,
        name: str,
        branches: list[Branch],
        entries: dict[int, Entry],
        concurrency: int,
    ) -> None:
        self.run_ = run
        self.rt = run.rt
        self.pos = pos
        self.name = name
        self.branches = branches
        self.first = pos + 1
        self.limit = concurrency
        self.done: dict[int, Entry] = {i: e for i, e in entries.items() if e.final}
        self.waiting: dict[int, Entry] = {i: e for i, e in entries.items() if not e.final}
        self.values: dict[int, Any] = {}
        self.failure: tuple[int, BaseException] | None = None
        failed = [
            (e.finished_at or 0.0, e.position, i)
            for i, e in self.done.items()
            if e.status == EntryStatus.ERROR
        ]
        if failed:
            i = min(failed)[2]
            self.failure = (i, self._raised(i))
        pending = [i for i in range(len(branches)) if i not in self.done]
        if self.stopping():  # resumed after it stopped: only what may have been running runs
            started = len(self.done) + self.limit
            pending = [i for i in pending if i < started or i in self.waiting]
        self.pending = deque(pending)
        self.tasks: dict[asyncio.Task[Any], int] = {}
        self.trackers: dict[int, Tracker] = {}
        self.parked: dict[int, float] = {}
        self.cancelled: set[int] = set()
        self.control: BaseException | None = None

    # -- helpers -----------------------------------------------------------------

    def errors(self, i: int) -> ErrorTypes:
        b = self.branches[i]
        if b.kind == EntryKind.STEP and b.call is not None:
            return self.run_.step_errors(b.call)
        return self.rt.error_types(b.name)

    def _raised(self, i: int) -> BaseException:
        try:
            self.run_.replay(self.done[i], self.errors(i))
        except Exception as exc:
            return exc
        return RecordError(f"{self.run_.where(self.first + i)}: a failed branch recorded no error")

    def stopping(self) -> bool:
        return self.failure is not None or self.run_.cancel_requested or self.run_.expired()

    def _register(self) -> None:
        """The completed steps' undos, in the order the branches completed."""
        oks = sorted(
            (e.finished_at or 0.0, e.position, i) for i, e in self.done.items() if e.status == EntryStatus.OK
        )
        for _, position, i in oks:
            call = self.branches[i].call
            if call is not None:
                self.run_.remember(position, call, self._value(i))

    def _value(self, i: int) -> Any:
        if i not in self.values:
            call = self.branches[i].call
            types = self.run_.step_types(call) if self.branches[i].kind == EntryKind.STEP and call else None
            self.values[i] = self.run_.replay(self.done[i], self.errors(i), types)
        return self.values[i]

    def replayed(self, header: Entry) -> list[Any]:
        """The gather as its resolved header recorded it; nothing runs."""
        if header.status == EntryStatus.OK:
            if len(self.done) != len(self.branches) or any(
                e.status != EntryStatus.OK for e in self.done.values()
            ):
                raise RecordError(
                    f"{self.run_.where(self.pos)}: gather {self.name!r} is recorded as done, but not every "
                    "branch has a result; the journal was altered. Fix: cancel this run and start a new one"
                )
            for _ in self.done:
                self.rt.count_step(self.run_.claim.name, "replayed")
            self._register()
            return [self._value(i) for i in range(len(self.branches))]
        self._register()
        errors = self.errors(header.ref - self.first) if header.ref is not None else None
        return self.run_.replay(header, errors)  # type: ignore[no-any-return]  # raises

    # -- running -----------------------------------------------------------------

    async def run(self) -> list[Any]:
        run, clock = self.run_, self.rt.clock
        try:
            while True:
                if self.control is not None or self.stopping():
                    self._stop_running()
                else:
                    self._start_more()
                if not self.tasks:
                    if self.control is not None or self.stopping() or not self.parked:
                        break
                    wake = min(self.parked.values())
                    left = wake - clock.time()
                    if left > self.rt.inline_wait:
                        raise _Suspend(run.capped(wake), f"gather {self.name}")
                    if left > 0:
                        await self.rt.anap(None, min(left, self.rt.poll_slice))
                    self._requeue()
                    continue
                wait = 1.0
                if self.parked:
                    wait = max(0.0, min(wait, min(self.parked.values()) - clock.time()))
                # a commit that may concern it (a cancellation, from any process the journal
                # hears) wakes the wait too: then look at the flag
                changes = self.rt.journal.changes
                watcher = asyncio.get_running_loop().create_task(changes.wait_async(changes.mark(), wait))
                done, _ = await asyncio.wait(
                    {*self.tasks, watcher}, timeout=wait, return_when=asyncio.FIRST_COMPLETED
                )
                if watcher in done:
                    if watcher.result() and not run.cancel_requested:
                        state = run.journal(self.rt.journal.get, run.claim.id)
                        run.cancel_requested = state is not None and state.cancel_requested
                else:
                    watcher.cancel()
                for task in done - {watcher}:
                    self._collect(task)
                self._requeue()
        finally:
            if self.tasks:  # left by an error of our own: nothing may outlive the gather
                for task in self.tasks:
                    task.cancel()
                await asyncio.wait(self.tasks, timeout=1.0)
        if self.control is not None:
            raise self.control
        return self._fan_in()

    def _start_more(self) -> None:
        loop = asyncio.get_running_loop()
        while self.pending and len(self.tasks) < self.limit:
            i = self.pending.popleft()
            tracker = self.trackers[i] = Tracker()
            self.tasks[loop.create_task(self._branch(i, tracker))] = i

    def _requeue(self) -> None:
        now = self.rt.clock.time()
        due = sorted(i for i, at in self.parked.items() if at <= now)
        for i in due:
            del self.parked[i]
        self.pending.extendleft(reversed(due))

    def _patience(self, i: int) -> Callable[[], bool]:
        """A child branch waits inline while a step branch still runs, or for
        ``inline_wait`` after that; then it parks (and the workflow with it)."""
        clock = self.rt.clock
        since = [clock.time()]

        def patient() -> bool:
            if any(self.branches[j].kind == EntryKind.STEP for j in self.tasks.values() if j != i):
                since[0] = clock.time()
                return True
            return clock.time() - since[0] < self.rt.inline_wait

        return patient

    async def _branch(self, i: int, tracker: Tracker) -> Any:
        b, run, pos = self.branches[i], self.run_, self.first + i
        entry = self.waiting.pop(i, None)
        if entry is None:
            entry = run.history.get(pos)
            entry = entry if entry is not None and not entry.final else None
        if b.kind == EntryKind.STEP and b.call is not None:
            plan = run.step_body(pos, entry, b.call, branch=True, ref=self.pos)
        else:
            plan = run.child_body(
                pos,
                entry,
                b.name,
                b.args,
                b.kwargs or {},
                b.child_id,
                self._patience(i),
                ref=self.pos,
                branch=True,
            )
        return await adrive(plan, self.rt, tracker)

    def _collect(self, task: asyncio.Task[Any]) -> None:
        i = self.tasks.pop(task)
        self.trackers.pop(i, None)
        if task.cancelled():
            return  # stopped by the fan-out: nothing recorded
        exc = task.exception()
        if exc is None:
            self.done[i] = self.run_.history[self.first + i]
            self.values[i] = task.result()
            return
        if isinstance(exc, _Suspend):
            self.parked[i] = exc.wake_at
            return
        if isinstance(exc, _Control) or not isinstance(exc, Exception):
            # the run stops (its lease, the worker) or its thread dies (a BaseException a
            # step raised, as a sequential step would let it through): no outcome recorded
            self.control = self.control or exc
            return
        entry = self.run_.history.get(self.first + i)
        if entry is not None and entry.final and entry.status == EntryStatus.ERROR:
            self.done[i] = entry
        elif self.stopping() and isinstance(exc, CancelledError | TimeoutError):
            return  # a branch that stopped because the workflow was cancelled or timed out
        if self.failure is None:
            self.failure = (i, exc)

    def _stop_running(self) -> None:
        for task, i in self.tasks.items():
            if i in self.cancelled or self.trackers[i].in_sync_call:
                continue  # a synchronous step cannot be interrupted: it is waited for
            self.cancelled.add(i)
            task.cancel()
            entry = self.run_.history.get(self.first + i)
            if self.branches[i].kind == EntryKind.CHILD and entry is not None and entry.detail:
                self.run_.journal(self.rt.journal.request_cancel, entry.detail)
        self.pending.clear()
        self.parked.clear()

    def _fan_in(self) -> list[Any]:
        run, now = self.run_, self.rt.clock.time()
        k = len(self.branches)
        header = run.history[self.pos]
        oks = [i for i, e in self.done.items() if e.status == EntryStatus.OK]
        if self.failure is None and len(oks) == k:
            run.record(
                Entry(
                    self.pos,
                    EntryKind.GATHER,
                    self.name,
                    EntryStatus.OK,
                    started_at=header.started_at,
                    finished_at=now,
                    detail=str(k),
                )
            )
            self._register()
            return [self._value(i) for i in range(k)]
        ref: int | None = None
        if self.failure is not None:
            i, raised = self.failure
            entry = self.done.get(i)
            ref = self.first + i if entry is not None else None
            record = entry.error if entry is not None and entry.error else run.encode_error(raised)
        else:
            raised = (
                CancelledError(
                    f"{run.where(self.pos)}: the workflow was cancelled during gather {self.name!r}"
                )
                if run.cancel_requested
                else run.timeout_error(self.pos)
            )
            record = run.encode_error(raised)
        run.record(
            Entry(
                self.pos,
                EntryKind.GATHER,
                self.name,
                EntryStatus.ERROR,
                error=record,
                started_at=header.started_at,
                finished_at=now,
                ref=ref,
                detail=str(k),
            )
        )
        self._register()
        raise raised
