"""channels: memory channels with trio's close semantics, and pipelines that drain.

No timing assertions: waits poll for a state (a blocked sender, a finished handle)
with a generous deadline, and counts prove that nothing was lost or done twice.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from foundry import Foundry
from foundry.errors import (
    BrokenChannelError,
    CancelledError,
    ChannelClosedError,
    ChannelEmptyError,
    ChannelFullError,
    DeclarationError,
    EndOfChannel,
    SubmitError,
    WorkTimeoutError,
)
from foundry.execute.channels import Pipeline, make_runner, open_channel
from foundry.handle import Status
from foundry.observe import names
from foundry.observe.metrics import Registry


def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached within the deadline")
        time.sleep(0.002)


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run fn in a thread; the list receives its result or the exception it raised."""
    out: list[Any] = []

    def main() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    return thread, out


# -- memory channels: close semantics ---------------------------------------------------


def test_send_on_a_closed_end_raises_closed_and_receivers_drain_then_end() -> None:
    tx, rx = open_channel(4)
    tx.send(1)
    tx.send(2)
    tx.close()
    with pytest.raises(ChannelClosedError, match="already closed"):
        tx.send(3)
    # Given every sender closed, When receiving, Then the buffer drains before the end.
    assert rx.receive() == 1
    assert rx.receive() == 2
    with pytest.raises(EndOfChannel):
        rx.receive()
    assert list(rx) == []


def test_the_last_sender_closing_ends_a_blocked_receiver_and_clones_keep_it_open() -> None:
    tx, rx = open_channel(1)
    clone = tx.clone()
    thread, out = in_thread(rx.receive)
    eventually(lambda: rx.statistics().waiting_receivers == 1)
    tx.close()  # one clone still open: nothing ends
    assert thread.is_alive()
    clone.close()
    thread.join(10)
    assert isinstance(out[0], EndOfChannel)


def test_closing_every_receiver_breaks_senders_and_hands_back_what_was_buffered() -> None:
    tx, rx = open_channel(1)
    tx.send("kept")
    thread, out = in_thread(lambda: tx.send("blocked", timeout=30))
    eventually(lambda: tx.statistics().blocked_senders == 1)
    leftovers = rx.close()
    thread.join(10)
    assert leftovers == ["kept"]  # returned, not silently dropped
    assert isinstance(out[0], BrokenChannelError)
    with pytest.raises(BrokenChannelError, match="every receiving end is closed"):
        tx.send("late")


def test_a_task_blocked_on_a_clone_that_another_thread_closes_gets_closed() -> None:
    tx, rx = open_channel(1)
    rx_clone = rx.clone()
    thread, out = in_thread(rx_clone.receive)
    eventually(lambda: rx.statistics().waiting_receivers == 1)
    rx_clone.close()
    thread.join(10)
    assert isinstance(out[0], ChannelClosedError)
    tx.send("still works")  # the original receiver is open
    assert rx.receive() == "still works"


def test_a_full_channel_is_backpressure_with_a_timeout_and_a_metric() -> None:
    registry = Registry()
    tx, rx = open_channel(2, name="bp", metrics=registry)
    tx.send(1)
    tx.send(2)
    assert registry.value(names.CHANNEL_FILL, stage="bp") == 1.0
    with pytest.raises(ChannelFullError, match="stayed full"):
        tx.send_nowait(3)
    with pytest.raises(TimeoutError):  # ChannelFullError is a TimeoutError too
        tx.send(3, timeout=0.01)
    thread, out = in_thread(lambda: tx.send(3, timeout=30))
    eventually(lambda: registry.value(names.CHANNEL_BLOCKED_SENDERS, stage="bp") == 1)
    assert registry.value(names.QUEUE_DEPTH, queue="bp") == 2
    assert registry.value(names.QUEUE_OLDEST_AGE, queue="bp") >= 0
    assert rx.receive() == 1  # room: the blocked sender goes through
    thread.join(10)
    assert out == [None]
    assert registry.value(names.CHANNEL_BLOCKED_SENDERS, stage="bp") == 0
    assert [rx.receive(), rx.receive()] == [2, 3]
    with pytest.raises(ChannelEmptyError):
        rx.receive_nowait()
    assert 'foundry_channel_fill{stage="bp"}' in registry.prometheus()


@pytest.mark.parametrize("capacity", [0, -1, 1.5, True])
def test_every_channel_is_bounded(capacity: Any) -> None:
    with pytest.raises(ValueError, match="capacity"):
        open_channel(capacity)


def test_threads_feed_a_loop_and_many_producers_and_consumers_lose_nothing() -> None:
    tx, rx = open_channel(8)
    per_producer = 2000

    def produce(k: int, end: Any) -> None:
        with end:
            for i in range(per_producer):
                end.send((k, i))

    async def consume(end: Any) -> list[Any]:
        async with end:
            return [item async for item in end]

    async def main() -> list[Any]:
        producers = [threading.Thread(target=produce, args=(k, tx.clone())) for k in range(3)]
        tx.close()
        for p in producers:
            p.start()
        results = await asyncio.gather(*(consume(rx.clone()) for _ in range(3)))
        rx.close()
        for p in producers:
            p.join(10)
        return [item for part in results for item in part]

    got = asyncio.run(main())
    assert sorted(got) == sorted((k, i) for k in range(3) for i in range(per_producer))


def test_a_cancelled_async_receiver_does_not_swallow_the_next_item() -> None:
    async def main() -> Any:
        tx, rx = open_channel(1)
        first = asyncio.create_task(rx.areceive())
        second = asyncio.create_task(rx.areceive())
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        tx.send("item")  # wakes `first` ...
        first.cancel()  # ... which leaves without taking it: the wake-up passes on
        return await asyncio.wait_for(second, 10)

    assert asyncio.run(main()) == "item"


def test_async_send_blocks_on_full_and_times_out_without_blocking_the_loop() -> None:
    async def main() -> tuple[bool, int]:
        tx, _rx = open_channel(1)
        await tx.asend(1)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        try:
            await tx.asend(2, timeout=0.05)
        except ChannelFullError:
            timed_out = True
        else:
            timed_out = False
        task.cancel()
        return timed_out, ticks

    timed_out, ticks = asyncio.run(main())
    assert timed_out
    assert ticks > 1  # the loop kept running while the send waited


# -- pipelines ------------------------------------------------------------------------


def double(x: int) -> int:
    return 2 * x


async def add_one(x: int) -> int:
    await asyncio.sleep(0)
    return x + 1


def fragile(x: int) -> int:
    if x % 10 == 3:
        raise ValueError(f"row {x} is malformed")
    return x


def test_a_pipeline_runs_sync_and_async_stages_and_restores_input_order() -> None:
    registry = Registry()
    pipe = (
        Pipeline(range(300), name="imp", metrics=registry)
        .stage(double, concurrency=3, buffer=4)
        .stage(add_one, concurrency=8, buffer=4)
        .stage(double)
    )
    assert [s.name for s in pipe.stages] == ["double", "add_one", "double#2"]
    assert pipe.run() == [2 * (2 * x + 1) for x in range(300)]
    assert sorted(pipe.map(range(50), ordered=False)) == [2 * (2 * x + 1) for x in range(50)]
    assert registry.value(names.UNIT_COMPLETED, unit="imp.add_one", model="channels") == 350
    assert registry.value(names.UNIT_COMPLETED, unit="imp", model="channels") == 350
    assert registry.value(names.UNIT_IN_FLIGHT, unit="imp", model="channels") == 0


def test_an_item_failure_reaches_only_its_own_handle() -> None:
    pipe = Pipeline(name="rows").stage(fragile, concurrency=2).stage(double)
    with pipe.start() as run:
        handles = [run.submit(x) for x in range(40)]
    bad = [h for h in handles if h.status is Status.FAILED]
    assert len(bad) == 4
    error = bad[0].exception()
    assert isinstance(error, ValueError)
    assert "stage 'fragile'" in "\n".join(error.__notes__)
    good = [h.result() for h in handles if h.status is Status.SUCCEEDED]
    assert good == [2 * x for x in range(40) if x % 10 != 3]
    outcomes = Pipeline(name="rows").stage(fragile).run(range(5), errors="return")
    assert isinstance(outcomes[3], ValueError)
    assert outcomes[:3] == [0, 1, 2]
    with pytest.raises(ValueError, match="row 3"):
        Pipeline(name="rows").stage(fragile).run(range(5))


def test_shutdown_mid_stream_processes_every_accepted_item_exactly_once() -> None:
    seen: dict[str, collections.Counter[int]] = {"a": collections.Counter(), "b": collections.Counter()}
    lock = threading.Lock()

    def stage_a(x: int) -> int:
        with lock:
            seen["a"][x] += 1
        time.sleep(0.0005)
        return x

    async def stage_b(x: int) -> int:
        await asyncio.sleep(0.0005)
        with lock:
            seen["b"][x] += 1
        return x

    pipe = (
        Pipeline(name="drain").stage(stage_a, concurrency=2, buffer=8).stage(stage_b, concurrency=4, buffer=8)
    )
    run = pipe.start()
    accepted: dict[int, Any] = {}
    refused = 0
    stop = threading.Event()

    def producer(base: int) -> None:
        nonlocal refused
        i = 0
        while not stop.is_set():
            try:
                accepted[base + i] = run.submit(base + i)
            except ChannelClosedError:
                refused += 1
                return
            i += 1

    producers = [threading.Thread(target=producer, args=(k * 1_000_000,)) for k in range(3)]
    for p in producers:
        p.start()
    eventually(lambda: len(accepted) > 200)
    # When the pipeline is closed while producers are still feeding it ...
    run.close(timeout=30)
    stop.set()
    for p in producers:
        p.join(10)
    # Then every accepted item went through each stage exactly once, and nothing else did.
    assert run.accepted == len(accepted) == run.finished
    assert all(h.result(0) == x for x, h in accepted.items())
    assert set(seen["a"]) == set(seen["b"]) == set(accepted)
    assert set(seen["a"].values()) == {1}
    assert set(seen["b"].values()) == {1}
    with pytest.raises(ChannelClosedError, match="is closed"):
        run.submit(1)


def test_close_that_runs_out_of_time_fails_the_rest_instead_of_dropping_them() -> None:
    gate = threading.Event()

    def stuck(x: int) -> int:
        if x == 0:
            gate.wait(30)
        return x

    run = Pipeline(name="stuck").stage(stuck, buffer=16).start()
    handles = [run.submit(x) for x in range(10)]
    eventually(lambda: handles[0].status is Status.RUNNING)
    closer, _ = in_thread(lambda: run.close(timeout=0.05))
    eventually(lambda: run._abandoned)
    gate.set()  # the running item finishes; the ones it held up are failed, not lost
    closer.join(30)
    assert handles[0].result(10) == 0
    for handle in handles[1:]:
        with pytest.raises(CancelledError, match="close"):
            handle.result(10)
    assert run.finished == run.accepted == 10


def test_a_full_first_stage_pushes_back_on_submit_and_shows_blocked_senders() -> None:
    registry = Registry()
    gate = threading.Event()

    def slow(x: int) -> int:
        gate.wait(30)
        return x

    run = Pipeline(name="bp", metrics=registry).stage(slow, buffer=2).start()
    try:
        handles = [run.submit(x) for x in range(3)]  # one running, two buffered
        eventually(lambda: registry.value(names.CHANNEL_FILL, stage="bp.slow") == 1.0)
        with pytest.raises(ChannelFullError):
            run.submit(99, wait=0.01)
        thread, out = in_thread(lambda: run.submit(3, wait=30))
        eventually(lambda: registry.value(names.CHANNEL_BLOCKED_SENDERS, stage="bp.slow") == 1)
    finally:
        gate.set()
    thread.join(10)
    run.close(10)
    assert [h.result(0) for h in [*handles, out[0]]] == [0, 1, 2, 3]
    assert run.accepted == 4  # the refused item was never accepted


def test_a_cancelled_item_is_dropped_at_its_next_stage() -> None:
    gate = threading.Event()
    later: list[int] = []

    def first(x: int) -> int:
        gate.wait(30)
        return x

    def second(x: int) -> int:
        later.append(x)
        return x

    run = Pipeline(name="c").stage(first, buffer=4).stage(second).start()
    handles = [run.submit(x) for x in range(3)]
    assert handles[2].cancel()
    assert handles[2].status is Status.CANCELLED
    gate.set()
    run.close(10)
    assert later == [0, 1]
    assert run.finished == 3


def test_an_async_stage_timeout_fails_that_item_with_work_timeout() -> None:
    async def slow(x: int) -> int:
        await asyncio.sleep(30 if x == 1 else 0)
        return x

    results = Pipeline(name="t").stage(slow, concurrency=2, timeout=0.05).run([0, 1, 2], errors="return")
    assert results[0] == 0
    assert results[2] == 2
    assert isinstance(results[1], WorkTimeoutError)


def test_pipeline_declarations_are_checked() -> None:
    with pytest.raises(DeclarationError, match="concurrency"):
        Pipeline(name="p").stage(double, concurrency=0)
    with pytest.raises(DeclarationError, match="buffer"):
        Pipeline(name="p").stage(double, buffer=0)
    with pytest.raises(DeclarationError, match="is empty"):
        Pipeline(name="p").start()
    with pytest.raises(SubmitError, match="no items"):
        Pipeline(name="p").stage(double).run()


# -- a @app.work(stages=N) unit -----------------------------------------------------------


def test_a_stages_unit_builds_its_pipeline_and_feeds_it_per_submit(home: Any) -> None:
    app = Foundry("chan")

    @app.work(stages=2)
    def import_rows(p: Pipeline) -> Pipeline:
        return p.stage(fragile, concurrency=2).stage(add_one, concurrency=4)

    assert import_rows.decision.execution == "channels"
    runner = make_runner(import_rows.spec, app.context())
    try:
        handles = [runner.submit((x,), {}, _opts()) for x in range(20)]
        assert runner.call((4,), {}) == 5
        assert [h.result(10) for h in handles if h.exception(10) is None] == [
            x + 1 for x in range(20) if x % 10 != 3
        ]
        assert isinstance(handles[13].exception(), ValueError)
        with pytest.raises(SubmitError, match="one item per submit"):
            runner.submit((1, 2), {}, _opts())
        with pytest.raises(SubmitError, match="durable"):
            runner.submit((1,), {}, _opts(key="k"))

        async def from_a_loop() -> Any:
            handle = await runner.asubmit((7,), {}, _opts())
            return await handle

        assert asyncio.run(from_a_loop()) == 8
    finally:
        runner.close()
    assert app.metrics.value(names.UNIT_COMPLETED, unit="import_rows.add_one", model="channels") == 20


def test_a_plain_function_becomes_a_one_stage_pipeline_and_stage_counts_must_match(home: Any) -> None:
    app = Foundry("chan2")

    @app.work(stages=1, concurrency=3)
    def shout(text: str) -> str:
        return text.upper()

    runner = make_runner(shout.spec, app.context())
    try:
        assert runner.call(("hi",), {}) == "HI"
        assert "one-stage pipeline" in runner.notes[0]
    finally:
        runner.close()

    @app.work(stages=3)
    def wrong(p: Pipeline) -> Pipeline:
        return p.stage(double)

    with pytest.raises(DeclarationError, match="builder, which made 1 stages"):
        make_runner(wrong.spec, app.context())


def _opts(**kw: Any) -> Any:
    from foundry.runtime import SubmitOptions

    return SubmitOptions(**kw)


def test_through_the_app_a_pipeline_unit_maps_in_order_and_close_drains(home: Any) -> None:
    app = Foundry("chan3")

    @app.work(stages=2)
    def rows(p: Pipeline) -> Pipeline:
        return p.stage(double, concurrency=2, buffer=4).stage(add_one, concurrency=4, buffer=4)

    assert list(rows.map(range(100))) == [2 * x + 1 for x in range(100)]
    handles = [rows.submit(x) for x in range(20)]
    app.close()  # drains the unit's pipeline: every accepted item is finished
    assert [h.result(0) for h in handles] == [2 * x + 1 for x in range(20)]
