"""The engine's rules one at a time: order of questions, overrides, fallbacks, the GIL."""

from __future__ import annotations

from typing import Any

import pytest

from foundry.decide import Decision, Host, decide
from foundry.decide.bills import DELIVERY_BILLS, EXECUTION_BILLS
from foundry.decide.questions import DELIVERY_QUESTIONS, EXECUTION_QUESTIONS, PARALLEL_MIN_ITEMS
from foundry.observe.names import ALL as METRIC_NAMES
from foundry.traits import DELIVERIES, EXECUTIONS, traits_from_kwargs


def _d(host: Host | None = None, **raw: Any) -> Decision:
    return decide(traits_from_kwargs("unit", raw), host=host)


def _asked(d: Decision, axis: str) -> list[str]:
    return [a.id for a in d.questions if a.axis == axis]


def test_one_bill_table_covers_every_model() -> None:
    assert set(DELIVERY_BILLS) == set(DELIVERIES)
    assert set(EXECUTION_BILLS) == set(EXECUTIONS)
    for bill in (*DELIVERY_BILLS.values(), *EXECUTION_BILLS.values()):
        assert bill.watch, bill.model
        assert set(bill.watch) <= set(METRIC_NAMES), bill.model


def test_the_seven_questions_are_asked_in_order() -> None:
    ids = [q.id for q in EXECUTION_QUESTIONS]
    assert ids == ["size", "bound", "independence", "ordering", "count", "duration"]
    assert [q.id for q in DELIVERY_QUESTIONS][:2] == ["steps", "durable"]


def test_the_walk_stops_at_the_first_that_decides() -> None:
    # Small: size decides; the questions below it are not asked (duration and isolation
    # always are).
    d = _d(est="2ms")
    assert _asked(d, "execution") == ["size", "duration", "isolation"]
    assert d.decided_by == "size"
    # At volume, waiting, 300 at once: count decides after size..ordering were asked.
    d = _d(est="40ms", bound="io", concurrency=300)
    assert _asked(d, "execution") == [
        "size",
        "bound",
        "independence",
        "ordering",
        "count",
        "duration",
        "isolation",
    ]
    assert d.decided_by == "count"


def test_size_decides_only_under_a_few_milliseconds() -> None:
    # seed 003: "if the unit is under a few milliseconds and not repeated at volume"
    assert _d(est="4ms").decided_by == "size"
    assert _d(est="30ms").decided_by == "fallback"  # sequential still, but not because it is small
    assert _d(est="4s").decided_by == "fallback"
    question = next(q for q in EXECUTION_QUESTIONS if q.id == "size")
    assert "under a few ms" in question.text


def test_a_long_job_always_gets_the_duration_question_and_its_advice() -> None:
    # Even when an earlier question decided (here: the count), duration is asked and speaks.
    d = _d(est="2h", bound="io", rate="10/h", concurrency=1)
    assert d.decided_by == "count"
    duration = next(a for a in d.questions if a.id == "duration")
    assert duration.answer.startswith("yes (2h per unit)")
    (advice,) = [n for n in d.notes if n.startswith("long-running")]
    assert "declare timeout=" in advice
    assert "checkpoint" in advice
    assert "cancel" in advice


def test_little_law_decides_the_count() -> None:
    # ~1.8 in flight must not go to a single sequential worker
    d = _d(Host(cores=8, gil=True), est="2ms", rate="900/s", bound="io")
    assert d.execution == "bounded_pool"
    assert d.load.in_flight == pytest.approx(1.8)
    assert d.load.concurrency == 4
    assert "one worker would be busy 180% of the time" in d.deciding_answer
    assert any("L = λ × W = 900/s × 2ms = 1.8" in line for line in d.load.lines)
    # ~0.056 in flight is one worker busy 6 % of the time
    d = _d(est="20s", rate="10/h", bound="io")
    assert (d.execution, d.decided_by, d.load.concurrency) == ("sequential", "count", 1)


def test_cpu_work_is_sized_to_the_cores_and_saturation_shows_the_numbers() -> None:
    d = _d(Host(cores=8, gil=True), est="35ms", rate="300/s", bound="cpu")
    assert d.execution == "processes"
    assert d.load.cores_needed == pytest.approx(10.5)
    assert d.load.concurrency == 8
    assert d.load.utilisation == pytest.approx(300 / (8 / 0.035))
    assert any("10.5 needed" in line and "of 8 on this host" in line for line in d.load.lines)
    assert [w.code for w in d.warnings] == ["saturation"]
    unknown = _d(est="35ms", rate="300/s", bound="cpu")
    assert any("(assumed: host unknown)" in line for line in unknown.load.lines)


def test_the_text_bugs_are_gone() -> None:
    # "work of undeclared kind" only when bound was not declared
    assert "undeclared kind" not in _d(est="40ms", bound="mixed", concurrency=8).deciding_answer
    assert "undeclared kind" in _d(est="40ms", concurrency=8).deciding_answer
    # no "size near 8, not near 8"
    d = _d(Host(cores=8, gil=True), est="35ms", bound="cpu", concurrency=8, releases_gil=True)
    text = " ".join((*d.notes, *d.load.lines, *(a.answer for a in d.questions)))
    assert "not near 8" not in text


def test_isolation_overrides_the_earlier_decider_and_says_so() -> None:
    d = _d(est="2ms", isolate=True)
    assert d.execution == "processes"
    assert d.decided_by == "isolation"
    size = next(a for a in d.questions if a.id == "size")
    assert not size.decided
    assert "overridden by isolation" in size.answer


def test_stages_hand_data_on_through_channels() -> None:
    d = _d(est="200ms", bound="io", stages=3, concurrency=8)
    assert d.execution == "channels"
    assert d.decided_by == "independence"
    assert "foundry_channel_fill" in d.watch


def test_large_partitionable_compute_is_parallel() -> None:
    d = _d(est="30s", bound="cpu", partitionable=True, items=10**7)
    assert d.execution == "parallel"
    assert d.decided_by == "bound"
    assert "foundry_cpu_utilisation" in d.watch


def test_small_partitionable_input_falls_back_to_sequential_and_says_so() -> None:
    d = _d(est="30s", bound="cpu", partitionable=True, items=PARALLEL_MIN_ITEMS - 1)
    assert d.execution == "sequential"
    assert d.decided_by == "bound"
    assert any("slower than a loop" in a.answer for a in d.questions)
    assert any("parallel rejected for size" in n for n in d.notes)
    parallel = next(r for r in d.rejected if r.model == "parallel")
    assert str(PARALLEL_MIN_ITEMS - 1) in parallel.reason


@pytest.mark.parametrize(
    ("gil", "releases", "execution"),
    [
        (None, False, "processes"),
        (True, False, "processes"),
        (False, False, "bounded_pool"),
        (True, True, "bounded_pool"),
    ],
)
def test_compute_needing_cores_is_processes_under_the_gil(
    gil: bool | None, releases: bool, execution: str
) -> None:
    # Short units too (35 ms): under the GIL, threads take turns on one core.
    d = _d(Host(cores=8, gil=gil), est="35ms", bound="cpu", concurrency=4, releases_gil=releases)
    assert d.execution == execution
    assert d.decided_by == "count"
    assert d.load.concurrency == 4
    if execution == "processes":
        assert any("sys._is_gil_enabled()" in n for n in d.notes)
        assert "cpu-threads-under-gil" not in [w.code for w in d.warnings]


def test_shared_mutable_state_under_compute_is_threads_with_locks() -> None:
    d = _d(est="50ms", bound="cpu", concurrency=8, shares=["price cache"])
    assert d.execution == "threads"
    assert any("price cache" in n for n in d.notes)


def test_shared_state_while_waiting_is_serialised_per_key() -> None:
    d = _d(est="50ms", bound="io", concurrency=8, shares=["orders table"], key="order_id")
    assert d.execution == "bounded_pool"
    assert any("serialise per order_id" in n for n in d.notes)


def test_order_is_a_constraint_not_a_selector() -> None:
    # A key keeps the model the load needs and says how the order is kept on it.
    keyed = _d(est="20ms", bound="io", concurrency=50, ordered=True, key="account")
    plain = _d(est="20ms", bound="io", concurrency=50)
    assert keyed.execution == plain.execution == "bounded_pool"
    assert keyed.decided_by == "count"
    assert keyed.order.startswith("per-key lanes: at most one unit per account in flight")
    assert plain.order == ""
    fanout = _d(est="50ms", bound="io", concurrency=10_000, ordered=True, key="conn")
    assert fanout.execution == "async"
    unkeyed = _d(est="20ms", bound="io", concurrency=50, ordered=True)
    assert unkeyed.order.startswith("restored at the join")
    stream = _d(durable=True, ordered=True, key="session_id", est="2ms", rate="2000/s", bound="io")
    assert stream.order.startswith("single partition owner")
    parallel = _d(est="30s", bound="cpu", partitionable=True, items=10**7, ordered=True)
    assert parallel.order.startswith("restored at the join: the map")
    in_order = _d(est="20ms", bound="io", ordered=True)
    assert (in_order.execution, in_order.decided_by) == ("sequential", "ordering")


def test_long_running_constrains_but_does_not_choose() -> None:
    d = _d(est="20m", bound="io")
    assert d.decided_by == "fallback"
    assert any(n.startswith("long-running (20m)") and "cancel" in n for n in d.notes)


def test_delivery_framework() -> None:
    assert _d(multi_step=True, compensate=True).delivery == "workflow"
    assert _d(multi_step=True, durable=True).delivery == "workflow"
    assert _d(multi_step=True).delivery == "direct"  # short, not durable: functions calling functions
    assert _d(durable=True).delivery == "queue"
    assert _d(durable=True, replay=True).delivery == "stream"
    assert _d(consumers=3).delivery == "stream"
    assert _d(ordered=True, background=True).delivery == "stream"
    assert _d(background=True, rate="5000/s").delivery == "stream"
    assert _d(latency="20ms", idempotent=True).delivery == "pool"
    assert _d(latency="20ms").delivery == "direct"
    assert _d(background=True).delivery == "queue"


def test_the_simpler_thing_and_rejections_read_as_advice() -> None:
    d = _d(durable=True, est="90s", bound="cpu", isolate=True)
    assert "scale out" in d.simpler or "direct" in d.simpler
    direct = next(r for r in d.rejected if r.model == "direct")
    assert "durable=True" in direct.reason
    floor = _d(est="2ms")
    assert "simplest" in floor.simpler


def test_the_docs_name_every_question_and_warning() -> None:
    from pathlib import Path

    from foundry.decide.antipatterns import CODES
    from foundry.decide.questions import DELIVERY_FALLBACK, FALLBACK, ISOLATION

    docs = (Path(__file__).resolve().parents[2] / "docs" / "decisions.md").read_text()
    questions = (*DELIVERY_QUESTIONS, DELIVERY_FALLBACK, *EXECUTION_QUESTIONS, ISOLATION, FALLBACK)
    for qid in (q.id for q in questions):
        assert f"`{qid}`" in docs, qid
    for code in CODES:
        assert f"`{code}`" in docs, code


@pytest.mark.parametrize(
    ("raw", "field"), [({"workers": 0}, "workers"), ({"waits_on_pool": "yes"}, "waits_on_pool")]
)
def test_the_engines_own_traits_are_validated(raw: dict[str, Any], field: str) -> None:
    from foundry.errors import DeclarationError

    with pytest.raises(DeclarationError) as info:
        traits_from_kwargs("unit", raw)
    assert info.value.field == field
    assert "Fix:" in str(info.value)
