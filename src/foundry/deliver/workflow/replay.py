"""Replay recorded histories against the code you are about to deploy.

A workflow's code may change while its runs are in flight, as long as a resumed run makes
the same durable calls at the positions its journal recorded (``wf.patched`` keeps an old
path for old runs). :func:`replay` checks that *before* the deploy: it runs each
workflow function against a recorded history — from a journal, or from histories
exported with ``foundry workflows export`` — without running a step or writing anything,
and reports, per workflow, whether the code matches the history and, if not, the first
position where it does not (``foundry workflows replay APP``; :func:`assert_replays` in a
test suite).

A replay walks the history as a resumed run would: a recorded call is checked (kind and
name, a fan-out's branches, the compensation's undos) and its recorded value or error is
given to the code; it stops where the history ends (whatever the code does after that is
new, and safe). It does not compare arguments or results.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from foundry.backends.journal import open_journal
from foundry.backends.journal.base import (
    Claim,
    Entry,
    EntryKind,
    JournalBackend,
    WorkflowState,
    WorkflowStatus,
)
from foundry.deliver.workflow._plan import _Control, _EndOfHistory
from foundry.deliver.workflow.run import Run
from foundry.deliver.workflow.runtime import WorkflowRuntime
from foundry.deliver.workflow.worker import AppLike
from foundry.errors import NonDeterminismError, NotFoundError, RecordError, SubmitError
from foundry.observe.metrics import Registry
from foundry.runtime import RuntimeContext

__all__ = ["ReplayReport", "assert_replays", "export_history", "load_histories", "replay", "replay_history"]

_AT = re.compile(r"at position (\d+)")


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """The verdict on one recorded history."""

    workflow_id: str
    name: str
    recorded: str  # the status the recorded run had
    ok: bool
    checked: int  # positions of the history the code went through
    position: int | None = None  # the first position where the code and the history part
    problem: str = ""

    def __str__(self) -> str:
        if self.ok:
            return (
                f"{self.workflow_id} ({self.name}, {self.recorded}): ok, {self.checked} position(s) replayed"
            )
        where = f"{self.workflow_id} ({self.name}, {self.recorded})"
        return f"{where}: DIVERGES at position {self.position}: {self.problem}"


class _Replayer:
    """A runtime that only replays (its journal is never touched)."""

    def __init__(self, ctx: RuntimeContext) -> None:
        self.rt = WorkflowRuntime(
            open_journal("memory://"),
            ctx.lookup,
            metrics=Registry(),
            errors=ctx.errors,
            watchdog=None,
        )

    def close(self) -> None:
        self.rt.close(1.0)

    def check(self, state: WorkflowState, entries: list[Entry]) -> ReplayReport:
        def report(ok: bool, checked: int, position: int | None = None, problem: str = "") -> ReplayReport:
            return ReplayReport(state.id, state.name, state.status.value, ok, checked, position, problem)

        try:
            spec = self.rt.spec(state.name)
        except NotFoundError as exc:
            return report(False, 0, 0, str(exc))
        claim = Claim(
            id=state.id,
            name=state.name,
            token=0,
            lease_until=0.0,
            status=WorkflowStatus.RUNNING,
            args=state.args,
            codec=state.codec,
            parent_id=state.parent_id,
            parent_position=state.parent_position,
            cancel_requested=False,
            wakeups=0,
            claims=state.claims,
        )
        run = Run(self.rt, claim, spec, replay_only=True)
        run.load(entries)
        try:
            args, kwargs = self.rt.decode_args(claim, spec)
        except RecordError as exc:
            return report(False, 0, 0, str(exc))
        try:
            run.call_workflow(args, kwargs)
        except _EndOfHistory:
            return report(True, run.pos)
        except NonDeterminismError as exc:
            return report(False, run.pos, _position(exc, run.pos - 1), str(exc))
        except _Control as exc:  # pragma: no cover - a replay never parks or stops
            return report(False, run.pos, run.pos, f"the replay stopped ({type(exc).__name__})")
        except Exception as exc:
            if state.status == WorkflowStatus.SUCCEEDED:
                return report(
                    False,
                    run.pos,
                    run.pos,
                    f"the recorded run succeeded, but the code now raises {type(exc).__name__}: {exc}",
                )
            try:  # the recorded failure: its compensation must match too
                run._compensate()
            except _EndOfHistory:
                return report(True, run.pos)
            except NonDeterminismError as mismatch:
                return report(False, run.pos, _position(mismatch, run.pos - 1), str(mismatch))
            return report(True, run.pos)
        later = sorted(p for p in run.history if p >= run.pos)
        if later and run.history[later[0]].kind not in (EntryKind.CANCEL, EntryKind.TIMEOUT):
            entry = run.history[later[0]]
            return report(
                False,
                run.pos,
                entry.position,
                f"the code now returns at position {run.pos}, but the journal recorded {entry.kind} "
                f"{entry.name!r} at position {entry.position}",
            )
        return report(True, run.pos)


def _position(exc: Exception, default: int) -> int:
    found = _AT.search(str(exc))
    return int(found.group(1)) if found else default


def replay_history(ctx: RuntimeContext, state: WorkflowState, entries: list[Entry]) -> ReplayReport:
    """Check one recorded history against the code of ``ctx`` (``app.context()``)."""
    replayer = _Replayer(ctx)
    try:
        return replayer.check(state, entries)
    finally:
        replayer.close()


def replay(
    app: AppLike,
    *,
    journal: str | JournalBackend | None = None,
    histories: str | Path | Sequence[Mapping[str, Any]] | None = None,
    ids: Iterable[str] = (),
    name: str | None = None,
    status: str | None = None,
    limit: int = 100,
) -> list[ReplayReport]:
    """Replay recorded histories against ``app``'s code: those exported to ``histories``
    (a file of ``foundry workflows export``, or its parsed JSON), else those in
    ``journal`` (a URL or an open backend; default: the app's) — the ``ids`` given, or
    the newest ``limit`` of ``name`` (default: every workflow the app declares) and
    ``status``."""
    ctx = app.context()
    if histories is not None:
        recorded = load_histories(histories)
    else:
        backend = journal if journal is not None and not isinstance(journal, str) else None
        owned = backend is None
        backend = backend or open_journal(journal or ctx.settings.journal)  # type: ignore[arg-type]
        try:
            recorded = _from_journal(backend, app, list(ids), name, status, limit)
        finally:
            if owned:
                backend.close()
    wanted = set(ids)
    replayer = _Replayer(ctx)
    try:
        return [replayer.check(s, e) for s, e in recorded if not wanted or s.id in wanted]
    finally:
        replayer.close()


def _from_journal(
    journal: JournalBackend, app: AppLike, ids: list[str], name: str | None, status: str | None, limit: int
) -> list[tuple[WorkflowState, list[Entry]]]:
    if ids:
        return [journal.load(i) for i in ids]
    names = [name] if name is not None else sorted(app.workflows)
    out: list[tuple[WorkflowState, list[Entry]]] = []
    for one in names:
        for state in journal.workflows(name=one, status=status, limit=limit):
            out.append(journal.load(state.id))
    return out


def assert_replays(app: AppLike, **options: Any) -> list[ReplayReport]:
    """:func:`replay`, raising :class:`NonDeterminismError` (listing every history that
    diverges) unless all replay; for a test suite, before a deploy."""
    reports = replay(app, **options)
    bad = [r for r in reports if not r.ok]
    if bad:
        raise NonDeterminismError(
            f"{len(bad)} of {len(reports)} recorded histories no longer replay against this code:\n"
            + "\n".join(f"  {r}" for r in bad)
            + "\nFix: keep the old paths behind `if wf.patched(...)` until those runs finish"
        )
    return reports


# -- exported histories ----------------------------------------------------------------


def _decoded(data: bytes | None) -> Any:
    return None if data is None else json.loads(data)


def _encoded(value: Any) -> bytes | None:
    return None if value is None else json.dumps(value, separators=(",", ":")).encode()


def export_history(state: WorkflowState, entries: list[Entry]) -> dict[str, Any]:
    """One history as JSON (what ``foundry workflows export`` writes, one per workflow)."""
    return {
        "id": state.id,
        "name": state.name,
        "status": state.status.value,
        "codec": state.codec,
        "args": _decoded(state.args),
        "parent_id": state.parent_id,
        "parent_position": state.parent_position,
        "runs": state.claims,
        "created_at": state.created_at,
        "finished_at": state.finished_at,
        "history": [
            {
                "position": e.position,
                "kind": e.kind,
                "name": e.name,
                "status": e.status,
                "attempts": e.attempts,
                "started_at": e.started_at,
                "finished_at": e.finished_at,
                "wake_at": None if e.wake_at is None or e.wake_at == float("inf") else e.wake_at,
                "waits_forever": e.wake_at == float("inf"),
                "ref": e.ref,
                "detail": e.detail,
                "result": _decoded(e.result),
                "error": _decoded(e.error),
            }
            for e in entries
        ],
    }


def load_histories(
    source: str | Path | Sequence[Mapping[str, Any]],
) -> list[tuple[WorkflowState, list[Entry]]]:
    """Histories exported by :func:`export_history` (a file of a list of them, or one)."""
    if isinstance(source, str | Path):
        path = Path(source)
        try:
            docs: Any = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise SubmitError(
                f"replay: cannot read histories from {str(path)!r} ({exc}). Fix: write them with "
                "`foundry workflows export ... > histories.json`"
            ) from exc
    else:
        docs = source
    if isinstance(docs, Mapping):
        docs = [docs]
    out = []
    for i, doc in enumerate(docs):
        try:
            out.append(_history(doc))
        except (KeyError, TypeError, ValueError) as exc:
            raise SubmitError(
                f"replay: history #{i} is not one `foundry workflows export` writes ({type(exc).__name__}: "
                f"{exc}). Fix: export it again"
            ) from exc
    return out


def _history(doc: Mapping[str, Any]) -> tuple[WorkflowState, list[Entry]]:
    state = WorkflowState(
        id=str(doc["id"]),
        name=str(doc["name"]),
        status=WorkflowStatus(doc["status"]),
        codec=str(doc.get("codec", "json")),
        args=_encoded(doc.get("args")) or b"",
        result=None,
        error=None,
        parent_id=doc.get("parent_id"),
        parent_position=doc.get("parent_position"),
        owner=None,
        token=0,
        lease_until=0.0,
        wake_at=0.0,
        cancel_requested=False,
        compensation="",
        claims=int(doc.get("runs", 1)),
        position=len(doc["history"]),
        current_step=None,
        step_started_at=None,
        wakeups=0,
        created_at=float(doc.get("created_at", 0.0)),
        updated_at=float(doc.get("created_at", 0.0)),
        finished_at=doc.get("finished_at"),
    )
    entries = [
        Entry(
            position=int(e["position"]),
            kind=str(e["kind"]),
            name=str(e["name"]),
            status=str(e["status"]),
            result=_encoded(e.get("result")),
            error=_encoded(e.get("error")),
            attempts=int(e.get("attempts", 0)),
            started_at=float(e.get("started_at", 0.0)),
            finished_at=e.get("finished_at"),
            wake_at=float("inf") if e.get("waits_forever") else e.get("wake_at"),
            ref=e.get("ref"),
            detail=e.get("detail"),
        )
        for e in doc["history"]
    ]
    return state, entries
