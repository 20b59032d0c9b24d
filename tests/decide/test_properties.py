"""Generated declarations: the engine is total, deterministic and complete, and it
decides from the load — more load never means less concurrency, and a key never makes
concurrent work sequential."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from foundry.decide import Decision, Host, Measured, decide, reclassify
from foundry.decide.antipatterns import CODES
from foundry.observe.names import ALL as METRIC_NAMES
from foundry.traits import DELIVERIES, EXECUTIONS, Traits

from .strategies import hosts, traits

FIELDS = ("model", "choose_when", "why", "costs", "fails", "guarantees", "simpler")
CONCURRENT = frozenset(EXECUTIONS) - {"sequential"}


def _check_complete(d: Decision) -> None:
    assert d.delivery in DELIVERIES
    assert d.execution in EXECUTIONS
    for bill, model in ((d.delivery_bill, d.delivery), (d.execution_bill, d.execution)):
        assert bill.model == model
        assert all(getattr(bill, f) for f in FIELDS)
    assert d.watch
    assert set(d.watch) <= set(METRIC_NAMES)
    assert d.simpler
    decided = [a for a in d.questions if a.decided]
    assert [a.axis for a in decided] == ["delivery", "execution"]
    assert {a.id for a in decided} == {d.delivery_decided_by, d.decided_by}
    assert d.deciding_answer
    assert d.delivery_answer
    assert {r.model for r in d.rejected} == (set(DELIVERIES) - {d.delivery}) | (
        set(EXECUTIONS) - {d.execution}
    )
    assert all(r.reason for r in d.rejected)
    assert {w.code for w in d.warnings} <= set(CODES)
    # duration and isolation are always asked, in that order, last
    assert [a.id for a in d.questions if a.id in ("duration", "isolation")] == ["duration", "isolation"]
    # the load arithmetic is always shown, and the size is a count or the runtime's default
    assert d.load.lines
    assert d.load.concurrency is None or d.load.concurrency >= 1
    if d.execution == "sequential" and d.delivery != "stream":
        assert d.load.concurrency == 1


def _concurrency(d: Decision) -> int:
    return d.load.concurrency if d.load.concurrency is not None else 0


@settings(max_examples=400, deadline=None)
@given(traits(), hosts, st.sampled_from(["main", "sign"]))
def test_total_deterministic_and_complete(t: Traits, host: Host, phase: str) -> None:
    first = decide(t, phase=phase, host=host)
    assert first == decide(t, phase=phase, host=host)
    assert first.phase == phase
    _check_complete(first)


@settings(max_examples=400, deadline=None)
@given(
    traits(),
    hosts,
    st.floats(min_value=0.0, max_value=1e5, allow_nan=False),
    st.floats(min_value=1.0, max_value=100.0, allow_nan=False),
    st.one_of(st.none(), st.floats(min_value=1e-6, max_value=3600.0, allow_nan=False)),
)
def test_raising_the_rate_never_lowers_the_chosen_concurrency(
    t: Traits, host: Host, rate: float, factor: float, est: float | None
) -> None:
    if est is not None:
        t = replace(t, est=est)
    before = decide(replace(t, rate=rate), host=host)
    after = decide(replace(t, rate=rate * factor), host=host)
    assert _concurrency(after) >= _concurrency(before), (before.load.lines, after.load.lines)


@settings(max_examples=300, deadline=None)
@given(traits(), hosts, st.sampled_from(["session_id", "account"]))
def test_declaring_a_key_never_turns_a_concurrent_choice_sequential(t: Traits, host: Host, key: str) -> None:
    without = decide(replace(t, key=None), host=host)
    keyed = decide(replace(t, key=key), host=host)
    if without.execution in CONCURRENT:
        assert keyed.execution == without.execution
        assert keyed.load.concurrency == without.load.concurrency


@settings(max_examples=200, deadline=None)
@given(traits(), hosts)
def test_ordered_work_always_says_how_its_order_is_kept(t: Traits, host: Host) -> None:
    d = decide(t, host=host)
    assert bool(d.order) == t.ordered


@settings(max_examples=200, deadline=None)
@given(traits(), hosts)
def test_long_work_always_gets_its_timeout_cancel_and_checkpoint_advice(t: Traits, host: Host) -> None:
    d = decide(t, host=host)
    advice = [n for n in d.notes if n.startswith("long-running")]
    if t.is_long and t.override[1] is None and t.override[0] is None:
        assert advice
        assert "timeout" in advice[0]
        assert "cancel" in advice[0]
        assert "checkpoint" in advice[0]
    if not t.is_long:
        assert not advice


@settings(max_examples=200, deadline=None)
@given(traits(), hosts, st.sampled_from(["cpu", "io", "mixed"]), st.floats(min_value=1e-6, max_value=60))
def test_reclassify_is_decide_on_the_measured_traits(t: Traits, host: Host, bound: str, est: float) -> None:
    measured = Measured(est=est, bound=bound)
    again = reclassify(t, measured, host=host)
    direct = decide(replace(t, est=est, bound=bound, model=None), host=host)  # type: ignore[arg-type]
    assert (again.model, again.decided_by, again.load) == (direct.model, direct.decided_by, direct.load)
    assert again == reclassify(t, measured, host=host)


@settings(max_examples=200, deadline=None)
@given(traits())
def test_an_override_always_wins(t: Traits) -> None:
    d = decide(t)
    delivery, execution = t.override
    assert d.overridden == (t.model is not None)
    if delivery is not None:
        assert d.delivery == delivery
        assert d.delivery_decided_by == "override"
    if execution is not None:
        assert d.execution == execution
        assert d.decided_by == "override"


@settings(max_examples=200, deadline=None)
@given(traits())
def test_isolation_overrides_everything_above_it(t: Traits) -> None:
    d = decide(t)
    if t.isolate and t.override[1] is None:
        assert d.execution == "processes"
        assert d.decided_by == "isolation"


def test_empty_traits_decide_the_floor() -> None:
    d = decide(Traits())
    assert d.model == "direct/sequential"
    assert (d.delivery_decided_by, d.decided_by) == ("simple", "fallback")
    _check_complete(d)
