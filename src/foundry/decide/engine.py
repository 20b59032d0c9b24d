"""``decide(traits) -> Decision``: both axes, the load, the bill, the warnings. Pure and deterministic.

1. Walk the delivery questions (``questions.DELIVERY_QUESTIONS``) for the unit.
2. Walk the execution questions (seed 003's seven; duration and isolation always asked,
   isolation overriding) for the phase, with the offered load (``load.demand``).
3. Apply an explicit ``model=`` override: it wins, the walk it replaced is kept in the
   record, and a contradiction becomes a warning.
4. Size the chosen model from the load (``load.sized``: workers, permits or partitions,
   what that serves, the arithmetic); say how it keeps the declared order
   (``advice.order_kept``) and what long work needs (``advice.duration_note``).
5. Take both bills from ``bills.BILLS``, the watch list from the bills, the rejected
   alternatives from ``alternatives``, the anti-patterns from ``antipatterns``.

No I/O, no clocks, no environment: facts about the interpreter (cores, GIL) come in
through ``host``. :func:`reclassify` re-decides from measured traits (``Measured``) and
records the drift; :func:`drift` lists it.
"""

from __future__ import annotations

from dataclasses import fields, replace

from foundry.decide.advice import duration_note, order_kept
from foundry.decide.alternatives import rejected_delivery, rejected_execution
from foundry.decide.antipatterns import check_all, override_warning
from foundry.decide.bills import DELIVERY_BILLS, EXECUTION_BILLS
from foundry.decide.fmt import fmt_rate, fmt_seconds
from foundry.decide.load import NEAR_SATURATION, demand, sized
from foundry.decide.model import Answer, Decision, Host, Measured, Rejected, Warning
from foundry.decide.questions import DELIVERY_FALLBACK, FALLBACK, Walk, walk_delivery, walk_execution
from foundry.traits import Traits

__all__ = ["EST_DRIFT", "decide", "drift", "reclassify"]

_NO_CONTRADICTION = frozenset({DELIVERY_FALLBACK.id, FALLBACK.id})
EST_DRIFT = 2.0  # a measured est this many times off the declared one is drift


def decide(traits: Traits, *, phase: str = "main", host: Host | None = None) -> Decision:
    """How ``traits`` should run: delivery for the unit, execution for this ``phase``.

    Never raises on valid :class:`Traits`; the same input always gives the same output.
    """
    host = host if host is not None else Host()
    o_delivery, o_execution = traits.override
    d_walk = walk_delivery(traits, host)
    e_walk = walk_execution(traits, host, o_delivery or d_walk.choice)
    delivery, d_by, d_answers, d_warn = _apply_override(traits, "delivery", d_walk, o_delivery)
    execution, e_by, e_answers, e_warn = _apply_override(traits, "execution", e_walk, o_execution)

    offered = demand(traits, host)
    load = sized(traits, host, offered, delivery, execution)
    warnings = (*d_warn, *e_warn, *check_all(traits, delivery, execution, host, load, phase))
    delivery_bill = DELIVERY_BILLS[delivery]
    execution_bill = EXECUTION_BILLS[execution]
    watch = tuple(dict.fromkeys((*delivery_bill.watch, *execution_bill.watch)))
    if delivery == "queue" and (traits.rate_limit is not None or traits.max_concurrency is not None):
        watch = (*watch, "foundry_limit_waiting", "foundry_limit_wait_seconds_total")  # docs/limits.md
    rejected = (
        *_rejected_with_override(
            rejected_delivery(traits, offered, host, delivery, _answer_of(d_answers, d_by)),
            d_walk,
            o_delivery,
        ),
        *_rejected_with_override(
            rejected_execution(traits, offered, host, execution, _answer_of(e_answers, e_by)),
            e_walk,
            o_execution,
        ),
    )
    # An overridden axis keeps its answers in the record but not its advice.
    notes = [*(() if o_delivery else d_walk.notes), *(() if o_execution else e_walk.notes)]
    long_work = duration_note(traits, delivery, execution)
    if long_work:
        notes.append(long_work)
    if load.utilisation is not None and NEAR_SATURATION <= load.utilisation <= 1.0:
        notes.append(
            f"ρ = {load.utilisation:.2f}: near saturation, waits grow steeply as arrivals approach "
            "capacity (and real arrivals are burstier than the average): model it with `foundry lab`"
        )
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
        notes=tuple(notes),
        load=load,
        order=order_kept(traits, delivery, execution, load),
    )


def drift(traits: Traits, measured: Measured) -> tuple[str, ...]:
    """Where ``measured`` contradicts what ``traits`` declare, as lines a person reads."""
    out = []
    if measured.bound is not None and traits.bound is not None and measured.bound != traits.bound:
        out.append(
            f"declared bound={traits.bound!r} but {measured.source} measured {measured.bound!r}: "
            "reclassify this phase"
        )
    if measured.est is not None and traits.est is not None and _far_apart(measured.est, traits.est):
        out.append(
            f"declared est={fmt_seconds(traits.est)} but {measured.source} measured "
            f"{fmt_seconds(measured.est)}: update est= (the load, and with it the decision, "
            "follows from it)"
        )
    if measured.releases_gil is not None and measured.releases_gil != traits.releases_gil:
        what = "releases" if measured.releases_gil else "holds"
        out.append(
            f"declared releases_gil={traits.releases_gil} but {measured.source} measured that it "
            f"{what} the GIL: declare releases_gil={measured.releases_gil}"
        )
    if measured.rate is not None and traits.rate is not None and _far_apart(measured.rate, traits.rate):
        out.append(
            f"declared rate={fmt_rate(traits.rate)} but {measured.source} measured "
            f"{fmt_rate(measured.rate)}: update rate="
        )
    return tuple(out)


def _far_apart(a: float, b: float) -> bool:
    """``EST_DRIFT`` times or more apart, either way (0 against anything else is far)."""
    low, high = sorted((a, b))
    return high > 0 if low == 0 else high / low >= EST_DRIFT


def reclassify(
    traits: Traits,
    measured: Measured,
    *,
    phase: str = "main",
    host: Host | None = None,
    keep_override: bool = False,
) -> Decision:
    """The decision ``traits`` get once ``measured`` replaces what they declared.

    Pure: the caller measured (``foundry profile``, the loop watchdog, live metrics). The
    explicit ``model=`` is dropped unless ``keep_override`` — a measurement that
    contradicts it is the reason to re-decide. The drift (:func:`drift`) leads the notes.
    """
    changes = {
        f.name: getattr(measured, f.name)
        for f in fields(Measured)
        if f.name != "source" and getattr(measured, f.name) is not None
    }
    if not keep_override:
        changes["model"] = None
    decided = decide(replace(traits, **changes), phase=phase, host=host)
    found = drift(traits, measured)
    if not found:
        return decided
    return replace(decided, notes=(*(f"reclassified: {line}" for line in found), *decided.notes))


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
