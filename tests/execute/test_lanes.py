"""Per-key order under concurrency: every in-process model that accepts ``ordered=True,
key=...`` runs one unit per key at a time, in submission order, and different keys at once.

Each test interleaves keys (a1 b1 c1 a2 b2 c2 ...) with durations that differ per item, so
a model that ignored the key would start a2 while a1 still runs (or finish them out of
order); the assertions are on the recorded start/end times, never on speed.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from foundry import Foundry
from foundry.errors import CancelledError, OverloadError, SubmitError
from foundry.handle import Handle, Status

from . import workloads

KEYS = "abc"
ROUNDS = 5
Record = tuple[str, int, float, float]


def _items(rounds: int = ROUNDS) -> list[dict[str, Any]]:
    # durations 10/30/50 ms, shifted per key: later items of a key are often shorter
    return [
        {"k": k, "seq": seq, "sleep": 0.01 + 0.02 * ((seq * 2 + ord(k)) % 3)}
        for seq in range(rounds)
        for k in KEYS
    ]


def _assert_per_key_order(records: list[Record]) -> None:
    by_key: dict[str, list[Record]] = {}
    for record in records:
        by_key.setdefault(record[0], []).append(record)
    assert sorted(by_key) == list(KEYS)
    for key, runs in by_key.items():
        runs.sort(key=lambda r: r[1])
        assert [r[1] for r in runs] == list(range(ROUNDS))
        for before, after in itertools.pairwise(runs):
            assert after[2] >= before[3], f"{key}{after[1]} started before {key}{before[1]} finished"


def _overlapped_across_keys(records: list[Record]) -> bool:
    """Two units of different keys ran at the same time (the lanes did not serialise all)."""
    return any(
        a[0] != b[0] and a[2] < b[3] and b[2] < a[3] for i, a in enumerate(records) for b in records[i + 1 :]
    )


MODELS: dict[str, dict[str, Any]] = {
    "bounded_pool": {"model": "bounded_pool", "bound": "io", "concurrency": 4},
    "threads": {"model": "threads", "bound": "io", "concurrency": 4},
    "processes": {"model": "processes", "bound": "io", "concurrency": 4, "workers": 3},
    "channels": {"model": "channels", "bound": "io", "concurrency": 4},
    "async": {"model": "async", "bound": "io", "concurrency": 4},
}


def _unit(app: Foundry, model: str, **more: Any) -> Any:
    fn: Callable[..., Any] = workloads.async_keyed_step if model == "async" else workloads.keyed_step
    traits = {**MODELS[model], "ordered": True, "key": "k", **more}
    return app.work(name=f"keyed_{model}", **traits)(fn)


def _warm(unit: Any, width: int) -> None:
    """Wait until ``width`` units of different keys run at once. A process pool starts its
    children one at a time until the first is up (so a script that cannot start fails
    once), so just after its first submit it may be one child wide."""
    deadline = time.monotonic() + 60
    while True:
        handles = [unit.submit({"k": f"warm{i}", "seq": 0, "sleep": 0.2}) for i in range(width)]
        records = [h.result(timeout=60) for h in handles]
        if all(a[2] < b[3] and b[2] < a[3] for a, b in itertools.combinations(records, 2)):
            return
        assert time.monotonic() < deadline, f"{width} units of different keys never ran at once"


@pytest.mark.parametrize("model", sorted(MODELS))
def test_interleaved_keys_keep_their_order_under_concurrency(app: Foundry, model: str) -> None:
    # Given a keyed unit on a concurrent model (a process pool with all its children up),
    unit = _unit(app, model)
    assert unit.decision.execution == model
    assert "per-key lanes" in unit.decision.order
    if model == "processes":
        _warm(unit, MODELS[model]["workers"])
    # when a1 b1 c1 a2 b2 c2 ... are submitted at once,
    handles = [unit.submit(item) for item in _items()]
    records = [h.result(timeout=60) for h in handles]
    # then each key ran one at a time in submission order, and keys ran beside each other.
    _assert_per_key_order(records)
    assert _overlapped_across_keys(records)


def test_without_a_key_the_same_model_runs_a_key_out_of_order(app: Foundry) -> None:
    # The control: the same interleaving with ordered=True but no key= has no lanes, so
    # units of one key overlap. (It shows the order test above can fail.)
    unit = app.work(name="unkeyed", model="bounded_pool", bound="io", concurrency=4, ordered=True)(
        workloads.keyed_step
    )
    records = [h.result(timeout=60) for h in [unit.submit(item) for item in _items()]]
    with pytest.raises(AssertionError, match="started before"):
        _assert_per_key_order(records)


def test_async_callers_on_a_loop_keep_the_order(app: Foundry) -> None:
    unit = _unit(app, "async")

    async def main() -> list[Record]:
        handles = [await unit.asubmit(item) for item in _items()]
        return [await h for h in handles]

    records = asyncio.run(main())
    _assert_per_key_order(records)
    assert _overlapped_across_keys(records)


def test_a_failure_does_not_stall_its_key(app: Foundry) -> None:
    unit = _unit(app, "bounded_pool")
    first = unit.submit({"k": "a", "seq": 0, "sleep": 0.02, "fail": True})
    second = unit.submit({"k": "a", "seq": 1, "sleep": 0.0})
    with pytest.raises(workloads.Boom):
        first.result(timeout=10)
    assert second.result(timeout=10)[:2] == ("a", 1)


def test_cancelling_a_waiting_unit_skips_it_and_the_key_moves_on(app: Foundry) -> None:
    unit = app.work(
        name="keyed_wait", model="bounded_pool", bound="io", concurrency=2, ordered=True, key="tag"
    )(workloads.wait_tagged)
    gate = threading.Event()
    running = unit.submit(gate, "first", tag="x")
    waiting = unit.submit(gate, "second", tag="x")
    after = unit.submit(gate, "third", tag="x")
    assert waiting.status == Status.QUEUED
    assert waiting.cancel()
    assert waiting.status == Status.CANCELLED
    with pytest.raises(CancelledError):
        waiting.result(timeout=1)
    gate.set()
    assert running.result(timeout=10) == "first"
    assert after.result(timeout=10) == "third"


def test_the_lanes_are_a_bounded_intake(app: Foundry) -> None:
    unit = app.work(
        name="keyed_full",
        model="bounded_pool",
        bound="io",
        concurrency=1,
        workers=1,
        ordered=True,
        key="tag",
        max_pending=2,
        overflow="reject",
    )(workloads.wait_tagged)
    gate = threading.Event()
    accepted: list[Handle] = [unit.submit(gate, i, tag="same") for i in range(3)]  # 1 running, 2 wait
    with pytest.raises(OverloadError, match="per-key lanes"):
        unit.submit(gate, 99, tag="same")
    depth = app.metrics.value("foundry_queue_depth", queue="keyed_full:lanes")
    assert depth == 2
    gate.set()
    assert [h.result(timeout=10) for h in accepted] == [0, 1, 2]


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda unit: unit.submit({"seq": 1}), "key='k' is neither an argument"),
        (lambda unit: unit.submit({"k": ["not", "hashable"], "seq": 1}), "is not hashable"),
    ],
)
def test_a_call_without_a_usable_key_is_refused_at_submit(
    app: Foundry, call: Callable[[Any], Any], needle: str
) -> None:
    unit = _unit(app, "bounded_pool")
    with pytest.raises(SubmitError, match=needle):
        call(unit)


def test_the_key_may_be_a_keyword_a_position_or_a_field(app: Foundry) -> None:
    unit = app.work(
        name="keyed_args", model="bounded_pool", bound="io", concurrency=2, ordered=True, key="value"
    )(workloads.sleep_then)
    runner = unit.runner
    assert runner.key_of((0.0,), {"value": "kw"}) == "kw"
    assert runner.key_of((0.0, "pos"), {}) == "pos"
    fielded = _unit(app, "threads").runner
    assert fielded.key_of(({"k": "field", "seq": 0},), {}) == "field"
    assert unit.submit(0.0, value="v").result(timeout=10) == "v"


def test_close_drains_every_lane(app: Foundry) -> None:
    unit = _unit(app, "bounded_pool")
    handles = [unit.submit(item) for item in _items(2)]
    started = time.monotonic()
    unit.runner.close(timeout=30)
    assert all(h.status == Status.SUCCEEDED for h in handles)
    assert time.monotonic() - started < 30


def test_sequential_keeps_every_key_in_order_by_running_one_at_a_time(app: Foundry) -> None:
    unit = app.work(name="keyed_seq", model="sequential", ordered=True, key="k")(workloads.keyed_step)
    assert unit.decision.order.startswith("one at a time, in submission order")
    records = [h.result(timeout=10) for h in [unit.submit(item) for item in _items()]]
    _assert_per_key_order(records)
    assert not _overlapped_across_keys(records)


def test_parallel_restores_input_order_at_the_join(app: Foundry) -> None:
    unit = app.work(name="keyed_parallel", partitionable=True, bound="cpu", ordered=True, key="k")(
        workloads.keyed_step
    )
    assert unit.decision.execution == "parallel"
    assert unit.decision.order.startswith("restored at the join")
    items = _items()
    records = list(unit.map(items, ordered=True))
    assert [(r[0], r[1]) for r in records] == [(i["k"], i["seq"]) for i in items]


def test_an_unordered_map_over_lanes_gets_every_result(app: Foundry) -> None:
    unit = _unit(app, "threads")
    items = _items()
    records = list(unit.map(items, ordered=False, timeout=30))
    assert sorted((r[0], r[1]) for r in records) == sorted((i["k"], i["seq"]) for i in items)
    _assert_per_key_order(records)


def test_close_cancels_what_still_waits_and_never_runs_it(app: Foundry) -> None:
    ran: list[Any] = []
    unit = app.work(
        name="keyed_close", model="bounded_pool", bound="io", concurrency=2, ordered=True, key="tag"
    )(workloads.wait_tagged)
    gate = threading.Event()
    first = unit.submit(gate, "first", tag="x")
    waiting = [unit.submit(gate, f"later-{i}", tag="x") for i in range(3)]
    for handle in waiting:
        handle._source.add_done_callback(lambda h=handle: ran.append(h.status))
    threading.Timer(0.3, gate.set).start()
    unit.runner.close(timeout=0.1)  # the lane cannot drain in 0.1 s: the waiting units are cancelled
    assert all(h.status == Status.CANCELLED for h in waiting)
    assert first.result(timeout=10) == "first"
    assert ran == [Status.CANCELLED] * 3
