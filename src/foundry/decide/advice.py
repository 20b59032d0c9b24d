"""Constraints that do not choose a model but bind the one chosen: order and duration.

Order is a constraint, not a selector: the load picks the model, then
:func:`order_kept` says how *that* model keeps the declared order — per-key lanes in
Foundry's in-process runtimes, a single partition owner on a stream, order restored
at the join for a parallel map — or that it cannot (a queue).

Duration is always asked: long work gets :func:`duration_note` — a timeout, how the
chosen model cancels, and how progress survives a restart — whatever decided the model.
"""

from __future__ import annotations

from foundry.decide.fmt import fmt_seconds
from foundry.decide.model import Load
from foundry.traits import Traits

__all__ = ["LANE_MODELS", "duration_note", "order_kept"]

# In-process models whose Foundry runtime runs one unit per key at a time when a unit
# declares ordered=True with key= (foundry.execute.lanes).
LANE_MODELS = frozenset({"async", "threads", "bounded_pool", "processes", "channels"})


def order_kept(t: Traits, delivery: str, execution: str, load: Load) -> str:
    """How ``delivery/execution`` keeps the order ``t`` declares ("" when none is declared)."""
    if not t.ordered:
        return ""
    key = t.key
    if delivery == "queue":
        return (
            "not kept: a queue hands jobs to parallel consumers and retries reorder them "
            "(see the queue-when-order-matters warning)"
        )
    if delivery == "stream":
        if key:
            return (
                f"single partition owner: events with the same {key} go to one partition, which one "
                "consumer at a time reads in offset order; partitions run in parallel"
            )
        return (
            "single partition owner: one consumer at a time reads a partition in offset order; "
            "declare key= to spread the order over partitions"
        )
    if delivery == "workflow":
        return "the steps of one run run in order; separate runs are not ordered against each other"
    if execution == "sequential":
        per = f", so order per {key} follows" if key else ""
        return f"one at a time, in submission order{per}"
    if execution == "parallel":
        return "restored at the join: the map yields results in input order"
    if key and execution in LANE_MODELS:
        size = f" {load.concurrency} {load.runs_on}" if load.concurrency else ""
        return (
            f"per-key lanes: at most one unit per {key} in flight; the next with the same {key} "
            f"starts when it finishes, while different {key}s run at once on the{size or ' pool'}"
        )
    return (
        "restored at the join: unit.map(items, ordered=True) yields results in input order (or read "
        "handles in submission order); the units themselves run out of order — declare key= if "
        "their effects must stay in order per entity"
    )


_CANCEL: dict[str, str] = {
    "sequential": "a thread cannot be stopped from outside: check a flag or deadline between steps",
    "threads": "a thread cannot be stopped from outside: call foundry.execute.checkpoint() between "
    "steps, which raises once it was cancelled or timed out",
    "bounded_pool": "a thread cannot be stopped from outside: call foundry.execute.checkpoint() "
    "between steps, which raises once it was cancelled or timed out",
    "async": "every await is a cancellation point: a timeout or cancel() cancels the task",
    "processes": "a timeout or cancel() kills the child (SIGTERM, then SIGKILL) and starts a fresh one",
    "channels": "close(timeout) drains the stages, then cancels what is left",
    "parallel": "cancel() drops the chunks not started; a running chunk runs to its end",
}

_RESUME: dict[str, str] = {
    "direct": "nothing survives a crash of this process: declare durable=True if losing the work "
    "in progress is not acceptable",
    "pool": "nothing is persisted: a lost worker loses the work in progress; declare durable=True "
    "if that is not acceptable",
    "queue": "a retried job starts again from the top: record progress keyed by the job id, or "
    "split it into steps (@app.workflow) so a retry resumes",
    "stream": "an event redelivered after a crash runs again from the top: record progress keyed by event.id",
    "workflow": "each step is journaled: a restart resumes at the first unfinished step; keep "
    "steps short enough to lose",
}


def duration_note(t: Traits, delivery: str, execution: str) -> str:
    """Timeout, cancellation and checkpoint advice for long work ("" when not long)."""
    if not t.is_long:
        return ""
    how_long = fmt_seconds(t.est) if t.est is not None else "long-running"
    timeout = (
        f"timeout={fmt_seconds(t.timeout)} is declared"
        if t.timeout is not None
        else "declare timeout= (none is declared, so a hung unit holds its slot for ever)"
    )
    return (
        f"long-running ({how_long}): {timeout}; cancel: {_CANCEL[execution]}; checkpoint: "
        f"{_RESUME[delivery]}; sizing its pool is a queueing problem (`foundry lab`)"
    )
