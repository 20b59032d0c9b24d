"""``decide(traits) -> Decision``: both axes, the bill, the warnings. Pure and deterministic.

1. Walk the delivery questions (``questions.DELIVERY_QUESTIONS``) for the unit.
2. Walk the execution questions (seed 003's seven, isolation overriding) for the phase.
3. Apply an explicit ``model=`` override: it wins, the walk it replaced is kept in the
   record, and a contradiction becomes a warning.
4. Take both bills from ``bills.BILLS``, the watch list from the bills, the rejected
   alternatives from ``alternatives``, the anti-patterns from ``antipatterns``.

No I/O, no clocks, no environment: facts about the interpreter (cores, GIL) come in
through ``host``.
"""

from __future__ import annotations

from dataclasses import replace

from foundry.decide.alternatives import rejected_delivery, rejected_execution
from foundry.decide.antipatterns import check_all, override_warning
from foundry.decide.bills import DELIVERY_BILLS, EXECUTION_BILLS
from foundry.decide.model import Answer, Decision, Host, Rejected, Warning
from foundry.decide.questions import DELIVERY_FALLBACK, FALLBACK, Walk, walk_delivery, walk_execution
from foundry.traits import Traits

__all__ = ["decide"]

_NO_CONTRADICTION = frozenset({DELIVERY_FALLBACK.id, FALLBACK.id})


def decide(traits: Traits, *, phase: str = "main", host: Host | None = None) -> Decision:
    """How ``traits`` should run: delivery for the unit, execution for this ``phase``.

    Never raises on valid :class:`Traits`; the same input always gives the same output.
    """
    host = host if host is not None else Host()
    o_delivery, o_execution = traits.override
    d_walk = walk_delivery(traits, host)
    e_walk = walk_execution(traits, host)
    delivery, d_by, d_answers, d_warn = _apply_override(traits, "delivery", d_walk, o_delivery)
    execution, e_by, e_answers, e_warn = _apply_override(traits, "execution", e_walk, o_execution)

    warnings = (*d_warn, *e_warn, *check_all(traits, delivery, execution, host))
    delivery_bill = DELIVERY_BILLS[delivery]
    execution_bill = EXECUTION_BILLS[execution]
    watch = tuple(dict.fromkeys((*delivery_bill.watch, *execution_bill.watch)))
    rejected = (
        *_rejected_with_override(
            rejected_delivery(traits, delivery, _answer_of(d_answers, d_by)), d_walk, o_delivery
        ),
        *_rejected_with_override(
            rejected_execution(traits, execution, _answer_of(e_answers, e_by)), e_walk, o_execution
        ),
    )
    # An overridden axis keeps its answers in the record but not its advice.
    notes = (*(() if o_delivery else d_walk.notes), *(() if o_execution else e_walk.notes))
    return Decision(
        phase=phase,
        delivery=delivery,
        execution=execution,
        decided_by=e_by,
        delivery_decided_by=d_by,
        questions=(*d_answers, *e_answers),
        delivery_bill=delivery_bill,
        execution_bill=execution_bill,
        watch=watch,
        rejected=rejected,
        simpler=_simpler(delivery, execution),
        warnings=warnings,
        overridden=o_delivery is not None or o_execution is not None,
        notes=notes,
    )


def _apply_override(
    t: Traits, axis: str, walk: Walk, given: str | None
) -> tuple[str, str, tuple[Answer, ...], tuple[Warning, ...]]:
    if given is None:
        return walk.choice, walk.decided_by, walk.answers, ()
    answers = tuple(
        replace(a, answer=f"{a.answer} (overridden by model=)", decided=False) if a.decided else a
        for a in walk.answers
    )
    answers += (
        Answer("override", axis, f"Was the {axis} model given explicitly?", f"yes: model={t.model!r}", True),
    )
    warn: tuple[Warning, ...] = ()
    if given != walk.choice and walk.decided_by not in _NO_CONTRADICTION:
        decider = _answer_of(walk.answers, walk.decided_by)
        warn = (override_warning(t, axis, given, walk.choice, walk.decided_by, decider),)
    return given, "override", answers, warn


def _answer_of(answers: tuple[Answer, ...], qid: str) -> str:
    for a in answers:
        if a.id == qid:
            return a.answer
    return qid


def _rejected_with_override(
    rejected: tuple[Rejected, ...], walk: Walk, given: str | None
) -> tuple[Rejected, ...]:
    if given is None:
        return rejected
    return tuple(
        Rejected(r.model, f"the traits chose it (decided by {walk.decided_by}); model= overrode it")
        if r.model == walk.choice
        else r
        for r in rejected
    )


def _simpler(delivery: str, execution: str) -> str:
    d, e = DELIVERY_BILLS[delivery].simpler, EXECUTION_BILLS[execution].simpler
    if delivery == "direct" and execution == "sequential":
        return "nothing: direct/sequential is already the simplest model on both axes"
    if delivery == "direct":
        return e
    if execution == "sequential":
        return d
    return f"{d}; inside the worker, {e}"
