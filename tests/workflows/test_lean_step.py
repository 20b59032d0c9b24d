"""The lean path of ``wf.step`` (``Run.plain_step``): a synchronous step given no option
in a ``def`` workflow runs without the plan's generators, and must journal, replay, fail,
count and stop exactly as the general path does. Each test runs the same workflow both
ways on every journal engine — the general path forced by giving ``backoff=`` the very
policy the defaults make, which changes nothing else — and compares what the journal,
the workflow and the metrics saw. (Most other workflow tests take the lean path too:
their steps have no options; the fenced stale run of ``test_runtime`` is one.)"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from foundry.backends.journal.base import Entry, EntryKind, EntryStatus, WorkflowStatus
from foundry.deliver.workflow import WorkflowContext
from foundry.deliver.workflow.run import Run
from foundry.errors import CancelledError, RemoteError, SubmitError, WorkflowTimeoutError
from foundry.observe import names
from foundry.retry import Backoff
from tests.workflows.conftest import Crash, Env

MakeEnv = Callable[..., Env]
# the options of each path: none (lean), or the default policy given explicitly (general)
PATHS: dict[str, dict[str, Any]] = {"lean": {}, "general": {"backoff": Backoff(1.0, 300.0)}}
WHEN = dt.datetime(2026, 12, 7, 15, 0, tzinfo=dt.UTC)


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int


class Declined(Exception):
    """A step's own error type (this module's: rebuilt as itself on replay)."""


def ident(i: int) -> int:
    return i


def point(i: int) -> Point:
    return Point(i, -i)


def nothing() -> None:
    return None


def when() -> dt.datetime:
    return WHEN


def listing(n: int) -> list[int]:
    return list(range(n))


@pytest.fixture
def general_attempts(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts the general path's attempt loops (``Run._attempts``) by step name."""
    seen: Counter[str] = Counter()
    attempts = Run._attempts

    def counting(self: Run, pos: int, entry: Entry | None, call: Any, branch: bool, ref: int | None) -> Any:
        seen[call.name] += 1
        return attempts(self, pos, entry, call, branch, ref)

    monkeypatch.setattr(Run, "_attempts", counting)
    return seen


def shape(entries: list[Entry]) -> list[tuple[Any, ...]]:
    """What an entry records, but its times."""
    return [
        (e.position, e.kind, e.name, e.status, e.result, e.attempts, e.wake_at, e.ref, e.detail)
        for e in entries
    ]


def steps(env: Env, workflow: str, state: str) -> float:
    return env.app.metrics.value(names.WORKFLOW_STEPS, workflow=workflow, state=state)


def test_the_lean_path_journals_and_returns_what_the_general_path_does(
    make_env: MakeEnv, general_attempts: Counter[str]
) -> None:
    env = make_env()
    returned: dict[str, list[tuple[str, Any]]] = {}

    @env.app.workflow()
    def flow(wf: WorkflowContext, path: str) -> None:
        opts = PATHS[path]
        got = [
            wf.step(ident, 1, **opts),
            wf.step(point, 2, **opts),
            wf.step(nothing, **opts),
            wf.step(when, **opts),
            wf.step(listing, 3, **opts),
            wf.step(ident, 4, name="named", **opts),
            wf.step(functools.partial(ident, 5), **opts),
        ]
        returned[path] = [(type(v).__name__, v) for v in got]

    # When the same workflow runs once down each path
    flow.run("lean", id="lean")
    assert sum(general_attempts.values()) == 0  # (no option: no step took the general path)
    flow.run("general", id="general")
    assert sum(general_attempts.values()) == 7
    # Then each step returned the same value of the same declared type
    assert returned["lean"] == returned["general"]
    assert [t for t, _ in returned["lean"]] == ["int", "Point", "NoneType", "datetime", "list", "int", "int"]
    # and the journals hold the same entries, each finished after it started
    _, lean_entries = env.journal.load("lean")
    _, general_entries = env.journal.load("general")
    assert shape(lean_entries) == shape(general_entries)
    assert [e.name for e in lean_entries][-2:] == ["named", "ident"]
    assert all(e.started_at <= (e.finished_at or 0.0) for e in lean_entries)
    assert steps(env, "flow", "completed") == 14


@pytest.mark.parametrize("path", PATHS)
def test_a_resumed_run_replays_the_recorded_steps_without_running_them(make_env: MakeEnv, path: str) -> None:
    env = make_env()
    calls: Counter[str] = Counter()
    opts = PATHS[path]

    def first(n: int) -> Point:
        calls["first"] += 1
        return Point(n, n + 1)

    def second(p: Point) -> int:
        calls["second"] += 1
        if calls["second"] == 1:
            raise Crash("the process died here")
        return p.x + p.y

    @env.app.workflow()
    def flow(wf: WorkflowContext, n: int) -> int:
        p = wf.step(first, n, **opts)
        assert type(p) is Point  # live and replayed alike
        return int(wf.step(second, p, **opts))

    # Given a run that dies inside its second step
    with pytest.raises(Crash):
        flow.run(1, id="r")
    _, entries = env.journal.load("r")
    assert [(e.position, e.status) for e in entries] == [(0, EntryStatus.OK)]
    # When its lease lapses and a worker resumes it
    env.expire_leases()
    assert env.worker().drain() == 1
    # Then the first step was replayed, not run again, and each step ran to one entry
    assert flow.handle("r").result(5) == 3
    assert calls == {"first": 1, "second": 2}
    _, entries = env.journal.load("r")
    assert [(e.position, e.status, e.attempts) for e in entries] == [(0, "ok", 1), (1, "ok", 1)]
    assert steps(env, "flow", "completed") == 2
    assert steps(env, "flow", "replayed") == 1


@pytest.mark.parametrize("path", PATHS)
def test_a_step_that_raises_is_journaled_and_raised_the_same_way(make_env: MakeEnv, path: str) -> None:
    env = make_env()
    opts = PATHS[path]
    seen: list[tuple[str, str]] = []
    died: list[bool] = []

    class Unknown(Exception):
        """A type no replay can rebuild (local to this test): raised as a RemoteError."""

    def decline(n: int) -> int:
        raise Declined(f"no {n}")

    def obscure() -> int:
        raise Unknown("odd")

    def crash_once() -> int:
        if not died:
            died.append(True)
            raise Crash("the process died here")
        return 7

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> int:
        for fn, arg in ((decline, (3,)), (obscure, ())):
            try:
                wf.step(fn, *arg, **opts)
            except Exception as exc:
                seen.append((type(exc).__name__, str(exc)))
        return int(wf.step(crash_once, **opts))

    # Given a run whose first two steps fail and whose process dies in the third
    with pytest.raises(Crash):
        flow.run(id="f")
    # When a worker resumes it, replaying the two failures from the journal
    env.expire_leases()
    assert env.worker().drain() == 1
    assert flow.handle("f").result(5) == 7
    # Then the workflow saw each failure as the same error when run and when replayed: its
    # own type when the step's module has it, else a RemoteError (on its first run too)
    assert seen == [("Declined", "no 3"), ("RemoteError", seen[1][1])] * 2
    assert "Unknown" in seen[1][1]
    assert "odd" in seen[1][1]
    _, entries = env.journal.load("f")
    assert [(e.position, e.status, e.attempts) for e in entries] == [
        (0, EntryStatus.ERROR, 1),
        (1, EntryStatus.ERROR, 1),
        (2, EntryStatus.OK, 1),
    ]
    errors = [env.rt.json.decode(e.error or b"") for e in entries[:2]]
    assert [(r["type"].rsplit(".", 1)[-1], r["message"]) for r in errors] == [
        ("Declined", "no 3"),
        ("Unknown", "odd"),
    ]
    assert steps(env, "flow", "failed") == 2
    assert steps(env, "flow", "replayed") == 2
    assert steps(env, "flow", "completed") == 1


def test_a_result_that_cannot_be_journaled_fails_the_step_with_the_same_error(make_env: MakeEnv) -> None:
    env = make_env()

    def live() -> object:
        return object()  # not JSON

    def wrong() -> int:
        return "seven"  # type: ignore[return-value]  # not what it declares

    @env.app.workflow()
    def flow(wf: WorkflowContext, which: str, path: str) -> None:
        wf.step(ident, 1, **PATHS[path])
        wf.step(live if which == "live" else wrong, **PATHS[path])

    for which, words in (("live", "is a object, which is not JSON-compatible"), ("wrong", "declared int")):
        messages = {}
        for path in PATHS:
            # When a step returns what the journal cannot carry
            with pytest.raises(SubmitError) as raised:
                flow.run(which, path, id=f"{which}-{path}")
            messages[path] = str(raised.value).replace(f"{which}-{path}", "ID")
            state, entries = env.journal.load(f"{which}-{path}")
            assert state.status == WorkflowStatus.FAILED
            assert [(e.position, e.status) for e in entries] == [(0, EntryStatus.OK), (1, EntryStatus.ERROR)]
        # Then the error is the same down both paths: it names the step, the workflow and
        # the position, and says why
        assert messages["lean"] == messages["general"]
        assert f"the result of step '{live.__qualname__[: -len('live')]}{which}'" in messages["lean"]
        assert "workflow 'flow' (ID) at position 1" in messages["lean"]
        assert words in messages["lean"]
    assert steps(env, "flow", "failed") == 4


@pytest.mark.parametrize("path", PATHS)
def test_a_cancellation_requested_during_a_step_stops_the_workflow_before_the_next(
    make_env: MakeEnv, path: str
) -> None:
    env = make_env()
    opts = PATHS[path]
    ran: list[str] = []

    def first() -> int:
        ran.append("first")
        env.journal.request_cancel("c")  # arrives while the step runs
        return 1

    def second() -> int:
        ran.append("second")
        return 2

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> int:
        return int(wf.step(first, **opts)) + int(wf.step(second, **opts))

    with pytest.raises(CancelledError):
        flow.run(id="c")
    # The first step's entry was committed; the second never ran: a cancel entry is there
    assert ran == ["first"]
    state, entries = env.journal.load("c")
    assert state.status == WorkflowStatus.CANCELLED
    assert [(e.position, e.kind, e.status) for e in entries] == [
        (0, EntryKind.STEP, EntryStatus.OK),
        (1, EntryKind.CANCEL, EntryStatus.OK),
    ]


def test_steps_with_options_and_runs_the_lean_path_cannot_carry_take_the_general_path(
    make_env: MakeEnv, general_attempts: Counter[str]
) -> None:
    env = make_env()
    undone: list[int] = []

    def undo(result: int) -> None:
        undone.append(result)

    async def later(n: int) -> int:
        return n + 1

    class Unhashable:
        __hash__ = None  # type: ignore[assignment]

        def __call__(self) -> int:
            return 9

    def options_case(wf: WorkflowContext) -> list[Any]:
        return [
            wf.step(ident, 1, name="retries", retries=1),
            wf.step(ident, 2, name="timeout", timeout=5),
            wf.step(ident, 3, name="undo", undo=undo),
            wf.step(ident, 4, name="retry_on", retry_on=(ValueError,)),
            wf.step(later, 5, name="async"),
            wf.step(Unhashable(), name="unhashable"),
            wf.step(ident, 6, name="plain"),
        ]

    flow = env.app.workflow(name="options")(options_case)
    assert flow.run() == [1, 2, 3, 4, 6, 9, 6]
    assert general_attempts == dict.fromkeys(
        ("retries", "timeout", "undo", "retry_on", "async", "unhashable"), 1
    )

    @env.app.workflow(timeout="1h")
    def bounded(wf: WorkflowContext) -> int:  # a deadline bounds every attempt: general path
        return int(wf.step(ident, 7, name="bounded"))

    assert bounded.run() == 7
    assert general_attempts["bounded"] == 1
    assert "plain" not in general_attempts
    assert undone == []


def test_a_step_past_the_workflow_deadline_times_the_workflow_out(make_env: MakeEnv) -> None:
    env = make_env()

    def slow() -> int:
        env.clock.advance(120)  # the step takes two minutes of the journal's clock
        return 1

    @env.app.workflow(timeout="1m")
    def flow(wf: WorkflowContext) -> int:
        return int(wf.step(slow)) + int(wf.step(ident, 1))

    with pytest.raises(WorkflowTimeoutError):
        flow.run(id="t")
    state, _ = env.journal.load("t")
    assert state.status == WorkflowStatus.TIMED_OUT


def test_a_remote_error_from_a_lean_step_keeps_its_cause(make_env: MakeEnv) -> None:
    env = make_env()
    caught: list[BaseException] = []

    class Local(Exception):
        pass

    def fails() -> None:
        raise Local("x")

    @env.app.workflow()
    def flow(wf: WorkflowContext) -> None:
        try:
            wf.step(fails)
        except RemoteError as exc:
            caught.append(exc)

    flow.run()
    assert len(caught) == 1
    assert isinstance(caught[0].__cause__, Local)
