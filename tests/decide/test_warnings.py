"""Each anti-pattern: one declaration that walks into it, one near miss that does not."""

from __future__ import annotations

from typing import Any

import pytest

from foundry.decide import Decision, Host, decide
from foundry.decide.antipatterns import CODES
from foundry.traits import traits_from_kwargs

# code -> (triggers, near miss that must not trigger)
TABLE: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "queue-when-order-matters": (
        {"ordered": True, "durable": True, "model": "queue"},
        {"ordered": True, "durable": True},  # the engine picks a stream for it
    ),
    "stream-for-simple-work": (
        {"model": "stream", "rate": "50/day", "durable": True},
        {"model": "stream", "rate": "50/day", "durable": True, "consumers": 3},
    ),
    "orchestrator-for-stateless-work": (
        {"model": "workflow", "est": "20ms", "idempotent": True},
        {"model": "workflow", "multi_step": True, "compensate": True},
    ),
    "direct-for-durable-work": (
        {"durable": True, "model": "direct"},
        {"durable": True},
    ),
    "cpu-on-event-loop": (
        {"bound": "cpu", "est": "35ms", "concurrency": 300, "model": "async"},
        {"bound": "io", "est": "35ms", "concurrency": 300, "model": "async"},
    ),
    "pool-deadlock": (
        {"bound": "cpu", "concurrency": 16, "waits_on_pool": True},
        {"bound": "cpu", "concurrency": 16},
    ),
    "unbounded-intake": (
        {"rate": "300/s", "est": "5ms", "bound": "io"},
        {"rate": "300/s", "est": "5ms", "bound": "io", "max_pending": 1000},
    ),
    "thread-oversubscription": (
        {"bound": "cpu", "est": "50ms", "concurrency": 200, "model": "threads"},
        {"bound": "cpu", "est": "50ms", "concurrency": 200, "workers": 8},
    ),
    "order-lost-by-parallel-model": (
        {"ordered": True, "bound": "cpu", "partitionable": True, "items": 10**7, "est": "30s"},
        {"ordered": True, "bound": "cpu", "partitionable": True, "items": 100, "est": "30s"},
    ),
    "ipc-dominated-process-work": (
        {"est": "200us", "model": "processes"},
        {"est": "2s", "model": "processes"},
    ),
    "override-contradicts-traits": (
        {"est": "90s", "bound": "cpu", "isolate": True, "model": "threads"},
        {"est": "90s", "bound": "cpu", "isolate": True, "model": "processes"},
    ),
}


def _decide(raw: dict[str, Any], host: Host | None = None) -> Decision:
    return decide(traits_from_kwargs("unit", raw), host=host)


def test_every_warning_code_has_a_row() -> None:
    assert set(TABLE) == set(CODES)


@pytest.mark.parametrize("code", sorted(TABLE))
def test_warning_triggers(code: str) -> None:
    decision = _decide(TABLE[code][0])
    warning = next((w for w in decision.warnings if w.code == code), None)
    assert warning is not None, [w.code for w in decision.warnings]
    assert warning.title
    assert warning.message
    assert warning.fix


@pytest.mark.parametrize("code", sorted(TABLE))
def test_near_miss_does_not_trigger(code: str) -> None:
    decision = _decide(TABLE[code][1])
    assert code not in [w.code for w in decision.warnings]


def test_an_override_still_wins_and_is_recorded() -> None:
    decision = _decide({"est": "90s", "bound": "cpu", "isolate": True, "model": "threads"})
    assert decision.execution == "threads"
    assert decision.overridden
    assert decision.decided_by == "override"
    # the walk it replaced stays in the record
    isolation = next(a for a in decision.questions if a.id == "isolation")
    assert not isolation.decided
    assert "overridden by model=" in isolation.answer
    assert any(r.model == "processes" and "model= overrode it" in r.reason for r in decision.rejected)


def test_an_override_of_undeclared_traits_is_not_a_contradiction() -> None:
    decision = _decide({"model": "queue/processes"})
    assert decision.model == "queue/processes"
    assert decision.overridden
    assert "override-contradicts-traits" not in [w.code for w in decision.warnings]


def test_oversubscription_counts_this_hosts_cores() -> None:
    raw = {"bound": "cpu", "est": "50ms", "concurrency": 16, "workers": 12}
    assert "thread-oversubscription" not in [w.code for w in _decide(raw, Host(cores=8)).warnings]
    on_two = _decide(raw, Host(cores=2))
    warning = next(w for w in on_two.warnings if w.code == "thread-oversubscription")
    assert "12 compute threads on 2 cores" in warning.message


def test_payment_handler_without_its_phase_warns_when_forced_onto_the_loop() -> None:
    # The seed's failure: a 35 ms signing step inline on the loop.
    decision = _decide({"bound": "mixed", "est": "75ms", "concurrency": 300, "model": "async"})
    assert "cpu-on-event-loop" in [w.code for w in decision.warnings]
