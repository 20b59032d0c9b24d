"""Generated declarations: the engine is total, deterministic and always complete."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from foundry.decide import Decision, Host, decide
from foundry.decide.antipatterns import CODES
from foundry.observe.names import ALL as METRIC_NAMES
from foundry.traits import DELIVERIES, EXECUTIONS, Traits

from .strategies import hosts, traits

FIELDS = ("model", "choose_when", "why", "costs", "fails", "guarantees", "simpler")


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
    assert {r.model for r in d.rejected} == (set(DELIVERIES) - {d.delivery}) | (
        set(EXECUTIONS) - {d.execution}
    )
    assert all(r.reason for r in d.rejected)
    assert {w.code for w in d.warnings} <= set(CODES)


@settings(max_examples=400, deadline=None)
@given(traits(), hosts, st.sampled_from(["main", "sign"]))
def test_total_deterministic_and_complete(t: Traits, host: Host, phase: str) -> None:
    first = decide(t, phase=phase, host=host)
    assert first == decide(t, phase=phase, host=host)
    assert first.phase == phase
    _check_complete(first)


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
