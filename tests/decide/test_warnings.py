"""Each anti-pattern: declarations that walk into it, and near misses that must not —
above all where Foundry's own runtime for the chosen model already prevents the failure
(a bounded intake, order restored at the join, per-key lanes, a pool sized to the cores)."""

from __future__ import annotations

from typing import Any

import pytest

from foundry.decide import Decision, Host, decide
from foundry.decide.antipatterns import CODES
from foundry.traits import traits_from_kwargs

WAITING_AT_VOLUME = {"rate": "3000/s", "est": "40ms", "bound": "io"}  # 120 in flight: async
LEDGER = {"rate": "500/s", "est": "20ms", "bound": "io", "ordered": True, "shares": ["ledger"]}

# code -> (declarations that trigger it, near misses that must not)
TABLE: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {
    "queue-when-order-matters": (
        [{"ordered": True, "durable": True, "model": "queue"}],
        [{"ordered": True, "durable": True}, {"durable": True, "model": "queue"}],  # a stream; no order
    ),
    "stream-for-simple-work": (
        [{"model": "stream", "rate": "50/day", "durable": True}],
        [
            {"model": "stream", "rate": "50/day", "durable": True, "consumers": 3},
            {"model": "stream", "rate": "5000/s", "durable": True},
        ],
    ),
    "orchestrator-for-stateless-work": (
        [{"model": "workflow", "est": "20ms", "idempotent": True}],
        [{"model": "workflow", "multi_step": True, "compensate": True}],
    ),
    "direct-for-durable-work": (
        [{"durable": True, "model": "direct"}, {"durable": True, "model": "pool"}],
        [{"durable": True}],
    ),
    "cpu-on-event-loop": (
        [
            {"bound": "cpu", "est": "35ms", "concurrency": 300, "model": "async"},
            {"bound": "mixed", "est": "75ms", "concurrency": 300, "model": "async"},
        ],
        [
            {"bound": "io", "est": "35ms", "concurrency": 300, "model": "async"},
            {"bound": "cpu", "est": "35ms", "concurrency": 300},  # the engine picks processes
        ],
    ),
    "pool-deadlock": (
        [
            {"bound": "cpu", "concurrency": 16, "waits_on_pool": True},
            {"bound": "io", "concurrency": 16, "waits_on_pool": True},
        ],
        [{"bound": "cpu", "concurrency": 16}, {"est": "2ms", "waits_on_pool": True}],  # sequential
    ),
    "unbounded-intake": (
        # `await unit(...)` callers of an async unit wait for a permit in an unbounded line
        [WAITING_AT_VOLUME, {**WAITING_AT_VOLUME, "overflow": "caller_runs"}],
        [
            {**WAITING_AT_VOLUME, "overflow": "reject"},  # reject caps the waiters at max_pending
            {"rate": "300/s", "est": "5ms", "bound": "io"},  # a pool: bounded by default
            {"rate": "300/s", "est": "5ms", "bound": "io", "model": "sequential"},  # no intake at all
            {"rate": "300/s", "est": "1ms"},  # direct/sequential: the caller runs it
            {"rate": "300/s", "est": "5ms", "bound": "io", "model": "channels"},  # bounded channel
            {"rate": "300/s", "est": "5ms", "bound": "cpu"},  # processes: bounded intake
            {"rate": "300/s", "est": "5ms", "bound": "cpu", "partitionable": True},  # parallel: 4 runs
            {**WAITING_AT_VOLUME, "durable": True},  # the backlog is on disk
            {"est": "40ms", "bound": "io", "concurrency": 300},  # no arrival rate to overload it
        ],
    ),
    "thread-oversubscription": (
        [
            {"bound": "cpu", "est": "50ms", "concurrency": 200, "workers": 200, "model": "threads"},
            {"bound": "cpu", "est": "10ms", "concurrency": 64, "workers": 64, "releases_gil": True},
        ],
        [
            # Foundry sizes a computing pool to the cores: no workers=, no oversubscription
            {"bound": "cpu", "est": "50ms", "concurrency": 200, "model": "threads"},
            {"bound": "cpu", "est": "10ms", "concurrency": 64, "releases_gil": True},
            {"bound": "cpu", "est": "50ms", "concurrency": 200, "workers": 8},
        ],
    ),
    "cpu-threads-under-gil": (
        [
            {"bound": "cpu", "est": "50ms", "concurrency": 8, "shares": ["price cache"]},
            {"bound": "cpu", "est": "35ms", "concurrency": 16, "model": "bounded_pool"},
        ],
        [
            {"bound": "cpu", "est": "35ms", "concurrency": 16},  # the engine picks processes
            {"bound": "cpu", "est": "35ms", "concurrency": 16, "releases_gil": True},
            {"bound": "io", "est": "35ms", "concurrency": 16, "model": "bounded_pool"},
            {"bound": "cpu", "est": "35ms", "concurrency": 16, "workers": 1, "model": "bounded_pool"},
        ],
    ),
    "saturation": (
        [
            {"bound": "cpu", "est": "35ms", "rate": "300/s"},  # 10.5 cores on 8
            {"bound": "io", "est": "35ms", "rate": "300/s", "workers": 4},  # 4 threads serve 114/s
            {"bound": "cpu", "est": "35ms", "rate": "100/s", "model": "bounded_pool"},  # GIL: one core
            {"est": "2ms", "rate": "900/s", "bound": "io", "model": "sequential"},  # one at a time
        ],
        [
            {"bound": "cpu", "est": "35ms", "rate": "200/s"},  # 7 cores of 8
            {"bound": "io", "est": "35ms", "rate": "300/s"},  # sized from the load: 21 threads
            {"bound": "cpu", "est": "35ms", "concurrency": 16},  # no rate: no demand to exceed
            {"bound": "cpu", "est": "35ms", "rate": "100/s", "releases_gil": True, "model": "bounded_pool"},
        ],
    ),
    "order-lost-by-parallel-model": (
        [LEDGER, {**LEDGER, "model": "processes"}],
        [
            {**LEDGER, "key": "account"},  # per-key lanes keep the writes in order per account
            {**LEDGER, "shares": []},  # only results: restored at the join
            {"ordered": True, "bound": "cpu", "partitionable": True, "items": 10**7, "est": "30s"},
            {"ordered": True, "shares": ["ledger"], "est": "20ms"},  # sequential: in order
            {**LEDGER, "workers": 1},  # one at a time
        ],
    ),
    "ipc-dominated-process-work": (
        [{"est": "200us", "model": "processes"}, {"est": "500us", "rate": "8000/s", "bound": "cpu"}],
        [{"est": "2s", "model": "processes"}, {"est": "2ms", "rate": "900/s", "bound": "cpu"}],
    ),
    "limit-below-demand": (
        [
            {"durable": True, "rate": "50/s", "rate_limit": "10/s"},
            {"durable": True, "rate": "50/s", "est": "200ms", "max_concurrency": 5},
        ],
        [
            {"durable": True, "rate": "5/s", "rate_limit": "10/s"},
            {"durable": True, "rate": "50/s", "rate_limit": "10/s", "per": "customer_id"},  # split unknown
            {"durable": True, "rate": "50/s", "max_concurrency": 5},  # no est: capacity unknown
        ],
    ),
    "override-contradicts-traits": (
        [{"est": "90s", "bound": "cpu", "isolate": True, "model": "threads"}],
        [{"est": "90s", "bound": "cpu", "isolate": True, "model": "processes"}, {"model": "queue/processes"}],
    ),
}

HOST = Host(cores=8, gil=True)


def _decide(raw: dict[str, Any], host: Host = HOST) -> Decision:
    return decide(traits_from_kwargs("unit", raw), host=host)


def _cases(index: int) -> list[tuple[str, dict[str, Any]]]:
    return [(code, raw) for code, rows in sorted(TABLE.items()) for raw in rows[index]]


def test_every_warning_code_has_a_row() -> None:
    assert set(TABLE) == set(CODES)


@pytest.mark.parametrize(("code", "raw"), _cases(0), ids=[f"{c}-{i}" for i, (c, _) in enumerate(_cases(0))])
def test_warning_triggers(code: str, raw: dict[str, Any]) -> None:
    decision = _decide(raw)
    warning = next((w for w in decision.warnings if w.code == code), None)
    assert warning is not None, (decision.model, [w.code for w in decision.warnings])
    assert warning.title
    assert warning.message
    assert warning.fix


@pytest.mark.parametrize(("code", "raw"), _cases(1), ids=[f"{c}-{i}" for i, (c, _) in enumerate(_cases(1))])
def test_near_miss_does_not_trigger(code: str, raw: dict[str, Any]) -> None:
    decision = _decide(raw)
    assert code not in [w.code for w in decision.warnings], decision.model


def test_saturation_says_the_numbers_and_the_fix() -> None:
    decision = decide(
        traits_from_kwargs("sign", {"bound": "cpu", "est": "35ms", "rate": "300/s"}), phase="sign", host=HOST
    )
    warning = next(w for w in decision.warnings if w.code == "saturation")
    assert warning.message.startswith("10.5 cores of sign on 8: add hosts or shed load")
    assert "ρ = 1.31" in warning.message
    assert decision.load.saturated


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
    raw = {"bound": "cpu", "est": "50ms", "concurrency": 16, "workers": 12, "releases_gil": True}
    assert "thread-oversubscription" not in [w.code for w in _decide(raw, Host(cores=8)).warnings]
    on_two = _decide(raw, Host(cores=2))
    warning = next(w for w in on_two.warnings if w.code == "thread-oversubscription")
    assert "12 compute threads on 2 cores" in warning.message


def test_a_free_threaded_host_needs_no_process_workers_and_gets_no_gil_warning() -> None:
    raw = {"bound": "cpu", "est": "35ms", "concurrency": 16, "model": "bounded_pool"}
    assert "cpu-threads-under-gil" in [w.code for w in _decide(raw).warnings]
    assert "cpu-threads-under-gil" not in [w.code for w in _decide(raw, Host(cores=8, gil=False)).warnings]
