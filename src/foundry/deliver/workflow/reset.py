"""Reset a finished workflow to a completed step, and read published state — from the
journal alone, so ``foundry workflows reset|query`` work without the application's code.

A reset is a fork: a new workflow (``<id>~reset-<hex>`` unless named) with the same name
and arguments whose journal starts with a copy of the old one's entries *before* the
chosen step. Its first run replays those (nothing of them runs again) and runs the chosen
step and everything after it with the code deployed now. The old run is left as it was,
for the record; the new one's ``origin`` names it.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from foundry.backends.journal.base import Entry, EntryKind, EntryStatus, JournalBackend, NewWorkflow, Started
from foundry.errors import SubmitError

__all__ = ["RESETTABLE", "fork_run", "published_state", "reset_point"]

# What a run can be reset to: a completed step, child or fan-out (by name or position).
RESETTABLE = (EntryKind.STEP, EntryKind.CHILD, EntryKind.GATHER)
# What must not come before the reset point: the marks of how the old run ended.
_ENDINGS = (EntryKind.UNDO, EntryKind.CANCEL, EntryKind.TIMEOUT)


def published_state(state: Any) -> dict[str, Any]:
    """The published state of a ``WorkflowState`` as a dict (``{}`` when none)."""
    if not state.published:
        return {}
    try:
        value = json.loads(state.published)
    except ValueError:
        return {"<unreadable>": bytes(state.published).decode(errors="replace")[:200]}
    return value if isinstance(value, dict) else {"value": value}


def reset_point(workflow_id: str, entries: list[Entry], *, step: str | None, position: int | None) -> int:
    """The position a reset of ``workflow_id`` starts from: the completed step named
    ``step`` (it must be unique) or the entry at ``position``; a clear error otherwise."""
    if (step is None) == (position is None):
        raise SubmitError(
            f"reset of {workflow_id!r}: give the step to restart from by name or by position, one of "
            "them. Fix: e.g. --step charge, or --position 3 (`foundry workflows show` lists both)"
        )
    done = [e for e in entries if e.kind in RESETTABLE and e.status == EntryStatus.OK]
    if step is not None:
        named = [e for e in done if e.name == step]
        if not named:
            names = ", ".join(sorted({e.name for e in done})) or "none"
            raise SubmitError(
                f"reset of {workflow_id!r}: no completed step named {step!r} in its journal (completed: "
                f"{names}). Fix: name one of them, or give --position"
            )
        if len(named) > 1:
            raise SubmitError(
                f"reset of {workflow_id!r}: step {step!r} completed {len(named)} times (positions "
                f"{', '.join(str(e.position) for e in named)}). Fix: give --position to say which"
            )
        target = named[0]
    else:
        by_pos = {e.position: e for e in entries}
        found = by_pos.get(position)  # type: ignore[arg-type]
        if found is None or found not in done:
            raise SubmitError(
                f"reset of {workflow_id!r}: position {position} is not a completed step, child or "
                f"fan-out ({'nothing' if found is None else f'{found.kind} {found.status}'} is there). "
                "Fix: pick one `foundry workflows show` lists as ok"
            )
        target = found
    pos = target.position
    gathers = {e.position: e for e in entries if e.kind == EntryKind.GATHER}
    if target.ref is not None and target.ref in gathers and target.kind != EntryKind.GATHER:
        raise SubmitError(
            f"reset of {workflow_id!r}: position {pos} is a branch of the fan-out at position "
            f"{target.ref}; a fan-out is restarted as a whole. Fix: reset to position {target.ref}"
        )
    ending = next((e for e in entries if e.position < pos and e.kind in _ENDINGS), None)
    if ending is not None:
        raise SubmitError(
            f"reset of {workflow_id!r}: position {pos} comes after the {ending.kind} at position "
            f"{ending.position}, where the old run was already ending. Fix: reset to a step before it"
        )
    return pos


def fork_run(
    journal: JournalBackend,
    workflow_id: str,
    *,
    step: str | None = None,
    position: int | None = None,
    new_id: str | None = None,
    timeout: float | None = None,
) -> Started:
    """Fork the finished ``workflow_id`` at a completed step into a new pending workflow
    (see the module docstring); ``timeout`` (default: the old run's) counts from now."""
    state, entries = journal.load(workflow_id)
    if not state.status.finished:
        raise SubmitError(
            f"reset of {workflow_id!r}: it is still {state.status.value}; only a finished run can be "
            f"reset. Fix: wait for it, or `foundry workflows cancel {workflow_id}` first"
        )
    pos = reset_point(workflow_id, entries, step=step, position=position)
    target = next(e for e in entries if e.position == pos)
    if timeout is None and state.deadline is not None:
        timeout = max(1.0, state.deadline - state.created_at)
    new = new_id or f"{workflow_id}~reset-{uuid.uuid4().hex[:6]}"
    started = journal.fork(
        workflow_id,
        NewWorkflow(
            new,
            state.name,
            state.args,
            codec=state.codec,
            timeout=timeout,
            origin=f"reset of {workflow_id} from position {pos} ({target.kind} {target.name!r})",
        ),
        upto=pos,
    )
    if not started.created:
        raise SubmitError(
            f"reset of {workflow_id!r}: the id {new!r} is taken (by a {started.state.name!r} workflow). "
            "Fix: give another --new-id"
        )
    return started
