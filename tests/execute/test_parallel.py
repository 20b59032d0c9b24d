"""parallel: the chunk plan, order restored at the join, item-indexed errors, fallback.

The conformance tests take ``cluster_url`` and run on every engine: this machine's
processes, a Dask LocalCluster and a local Ray instance (``tests/clusters.py``). The
functions mapped are module-level so that worker processes can import them.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from foundry import Foundry
from foundry.errors import ChildCrashedError, ClusterWorkerLostError, SubmitError, WorkTimeoutError
from foundry.execute.parallel import (
    DEFAULT_THRESHOLD,
    ParallelExecutor,
    _close_shared,
    make_runner,
    parallel_map,
    plan_chunks,
)
from foundry.execute.parallel.executor import _trimmed_mean
from foundry.execute.parallel.plan import AMORTISED, CHUNK_SHIP, MIN_SPEEDUP
from foundry.observe import names
from foundry.runtime import SubmitOptions

ROOT = Path(__file__).resolve().parents[2]


def uneven(n: int) -> int:
    """CPU work whose cost varies a lot by item (load imbalance on purpose)."""
    total = 0
    for i in range((n % 7) * 300):
        total += i * i
    return total + n


def reject_77(n: int) -> int:
    if n == 77:
        raise ValueError(f"item {n} is malformed")
    return n


def segfault_on_5(n: int) -> int:
    if n == 5:
        import ctypes

        ctypes.string_at(0)  # SIGSEGV in the child
    return n


def die_at(n: int, *, victim: int, log: str) -> int:
    """A chunk's items in order; item ``victim`` SIGKILLs its own child (after a pause in
    which its next chunk is handed ahead to it)."""
    with open(log, "a") as out:  # O_APPEND: one whole line per call, whichever worker
        out.write(f"{n}\n")
    if n == victim:
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.005)
    return n


def forever(n: int) -> int:
    time.sleep(60)
    return n


def scale(n: int, *, by: int) -> int:
    return n * by


def nap_and_log(n: int, *, log: str, seconds: float) -> int:
    with open(log, "a") as out:  # O_APPEND: one whole line per call, whichever worker
        out.write(f"{n}\n")
    time.sleep(seconds)
    return n


def engine_of(url: str) -> str:
    scheme = url.split("://", 1)[0]
    return {"tcp": "dask", "dask": "dask"}.get(scheme, scheme)


@pytest.fixture(scope="module")
def executor(cluster_url: str) -> Any:
    ex = ParallelExecutor(workers=2, name="t", cluster=cluster_url)
    yield ex
    ex.close()


# -- the plan -----------------------------------------------------------------------------


def test_small_inputs_fall_back_to_sequential_and_say_why() -> None:
    plan = plan_chunks(12, workers=4)
    assert plan.mode == "sequential"
    assert plan.reason == f"fell back to sequential: 12 items < threshold {DEFAULT_THRESHOLD}"
    tiny = plan_chunks(5000, workers=4, est=2e-6)
    assert tiny.mode == "sequential"
    assert "less than shipping it to processes costs" in tiny.reason
    assert plan_chunks(5000, workers=1, est=0.01).mode == "sequential"
    shipping = plan_chunks(1_000_000, workers=2, est=3e-7, ship=1.5e-7)
    assert shipping.mode == "sequential"  # 0.30 s here, 0.15 s shipping + 0.15 s computing there
    assert "≈ 300.0 ms here, ≈ 303.8 ms on 2 workers" in shipping.reason
    assert "0.99× is less than the 1.5× that pays for processes" in shipping.reason
    heavy_payload = plan_chunks(100_000, workers=2, est=1e-4, ship=8e-5)
    assert heavy_payload.mode == "sequential"  # 50 µs saved per item, 80 µs spent shipping it
    assert "shipping ≈ 80 µs an item and 200 µs a chunk" in heavy_payload.reason


def test_shipping_is_charged_per_chunk_and_per_item_so_microsecond_items_in_bulk_go_to_processes() -> None:
    # The case: 2M items of ~1 µs, ~120 ns an item to pickle both ways. One item
    # alone is not worth shipping (a chunk costs 200 µs); 10 ms chunks of them are.
    plan = plan_chunks(2_000_000, workers=2, est=0.9e-6, ship=1.2e-7)
    assert plan.mode == "processes"
    assert plan.chunksize * plan.est >= CHUNK_SHIP / AMORTISED  # the chunk cost is ≤ 2 % of the work
    assert plan.chunks * CHUNK_SHIP <= AMORTISED * plan.items * plan.est
    sizes = [hi - lo for lo, hi in plan.bounds()]
    assert (sum(sizes), len(sizes)) == (plan.items, plan.chunks)
    assert sizes == sorted(sizes, reverse=True)  # full chunks, then a tail that shrinks ...
    assert sizes[0] == plan.chunksize
    assert sizes[-2] < plan.chunksize / 2  # ... so the workers reach the join together
    assert f"(the last {sum(s < plan.chunksize for s in sizes)} smaller)" in plan.reason
    expected = plan.expected_seconds
    assert expected is not None
    assert expected == pytest.approx(2_000_000 * 1.2e-7 + plan.chunks * CHUNK_SHIP + 2_000_000 * 0.9e-6 / 2)
    assert plan.items * plan.est / expected >= MIN_SPEEDUP
    assert (
        f"≈ {plan.items * plan.est / expected:.1f}× the loop" in plan.reason
    )  # what it says is what it computed
    assert "shipping ≈ 120 ns an item and 200 µs a chunk" in plan.reason
    unmeasured = plan_chunks(2_000_000, workers=2, est=0.9e-6)
    assert unmeasured.mode == "processes"
    assert "per item not measured" in unmeasured.reason
    # the same items on one core's worth of gain are not: 2 workers, but shipping eats it
    assert plan_chunks(2_000_000, workers=2, est=0.9e-6, ship=4e-7).mode == "sequential"


def test_the_probe_leaves_out_the_items_a_descheduled_caller_made_look_slow() -> None:
    took = [1e-6] * 250 + [8e-3] * 3  # three items hit by a 8 ms preemption
    assert _trimmed_mean(took) == pytest.approx(1e-6)
    assert _trimmed_mean([0.5]) == 0.5


def test_chunks_outnumber_workers_and_carry_enough_work_each() -> None:
    plan = plan_chunks(10_000, workers=4, est=0.001)
    assert plan.mode == "processes"
    assert plan.chunks >= 4 * 4  # load imbalance bounded by one small chunk
    assert plan.chunksize * plan.est >= 0.005  # IPC stays small against the work
    cheap = plan_chunks(1_000_000, workers=2, est=1e-5)
    assert cheap.mode == "processes"
    assert cheap.chunksize * 1e-5 >= 0.005
    heavy = plan_chunks(100, workers=2, est=1.0)
    assert heavy.chunksize == 1
    assert heavy.chunks == 100
    explicit = plan_chunks(1000, workers=2, chunksize=64)
    assert (explicit.chunksize, explicit.chunks) == (64, 16)
    with pytest.raises(SubmitError, match="chunksize"):
        plan_chunks(1000, workers=2, chunksize=0)


# -- running ------------------------------------------------------------------------------


def test_order_is_restored_at_the_join_with_uneven_chunks(executor: ParallelExecutor) -> None:
    data = list(range(3000))
    assert executor.map(uneven, data, chunksize=37) == [uneven(n) for n in data]
    assert executor.last_plan is not None
    assert executor.last_plan.mode == "processes"
    assert executor.last_plan.chunks == 82
    assert executor.last_plan.engine == executor.engine
    assert executor.metrics.value(names.PARALLEL_WORKERS, unit="t", engine=executor.engine) == 2
    assert executor.metrics.value(names.UNIT_COMPLETED, unit="t", model="parallel") >= 3000
    assert 0 < executor.metrics.value(names.CPU_UTILISATION, unit="t") <= 1


def test_auto_chunking_measures_the_first_items_and_keeps_their_results(executor: ParallelExecutor) -> None:
    data = list(range(4000))
    assert executor.map(uneven, data, min_work=0.0) == [uneven(n) for n in data]
    plan = executor.last_plan
    assert plan is not None
    assert plan.mode == "processes"
    assert plan.probed >= 1
    assert plan.est is not None
    assert plan.items == 4000 - plan.probed


def micro(n: int) -> int:
    """About a microsecond of integer arithmetic."""
    for _ in range(12):
        n = (n * 2654435761 + 1) & 0xFFFFFFFF
    return n


def test_microsecond_items_in_bulk_run_on_processes_in_big_chunks() -> None:
    ex = ParallelExecutor(workers=2, name="micro")
    try:
        data = list(range(300_000))
        assert ex.map(micro, data, progress=False) == [micro(n) for n in data]
        plan = ex.last_plan
        assert plan is not None
        assert plan.mode == "processes", plan.reason
        assert plan.ship is not None
        assert plan.ship < 1e-6  # ints pickle in tens of nanoseconds
        assert plan.chunksize >= 5000, plan.reason  # ≥ 10 ms of microsecond items
        assert ex.metrics.value(names.UNIT_COMPLETED, unit="micro", model="parallel") == 300_000
    finally:
        ex.close()


def test_a_failed_item_is_reported_with_its_index_and_the_rest_complete(executor: ParallelExecutor) -> None:
    with pytest.raises(ValueError, match="item 77 is malformed") as info:
        executor.map(reject_77, range(500), chunksize=50)
    notes = "\n".join(info.value.__notes__)
    assert "item 77 failed (chunk 1, items 50..99)" in notes
    assert "raised in worker pid" in notes
    outcomes = executor.map(reject_77, range(500), chunksize=50, errors="return")
    assert isinstance(outcomes[77], ValueError)
    assert outcomes[:77] == list(range(77))
    assert outcomes[78:] == list(range(78, 500))


def test_a_crashing_item_loses_only_its_own_chunk(executor: ParallelExecutor) -> None:
    outcomes = executor.map(segfault_on_5, range(200), chunksize=4, errors="return")
    lost = [i for i, value in enumerate(outcomes) if isinstance(value, ChildCrashedError)]
    if executor.engine == "dask":
        # Dask counts a worker's death against every chunk assigned to it, started or not:
        # a chunk waiting behind the crasher on the same worker can be given up with it.
        assert set(lost) >= {4, 5, 6, 7}
        assert set(lost) == {
            j for c in {i // 4 for i in lost} for j in range(4 * c, 4 * c + 4)
        }  # whole chunks
        assert len(lost) <= 4 * 4, lost  # the crasher and at most the chunks in flight with it
    else:
        assert lost == [4, 5, 6, 7]
    if executor.engine == "local":
        assert outcomes[4].signal_name == "SIGSEGV"
    else:  # a cluster re-runs the chunk on other workers, then gives up (it reports no signal)
        assert isinstance(outcomes[4], ClusterWorkerLostError)
        assert "Fix:" in str(outcomes[4])
    assert executor.metrics.value(names.PARALLEL_CHUNKS_LOST, unit="t", engine=executor.engine) >= 1
    assert "chunk 1, items 4..7 were lost with it" in "\n".join(outcomes[4].__notes__)
    assert [v for i, v in enumerate(outcomes) if i not in lost] == [i for i in range(200) if i not in lost]
    assert executor.map(uneven, range(100), chunksize=10) == [uneven(n) for n in range(100)]  # pool healed


def _both_children_ready(ex: ParallelExecutor) -> None:
    pool = ex._get_pool()
    deadline = time.monotonic() + 30
    while not (len(pool._children) == 2 and all(c.ready for c in pool._children)):
        assert time.monotonic() < deadline, "the pool's children did not start"
        time.sleep(0.01)


def test_a_child_killed_mid_map_loses_its_chunk_only_and_the_chunk_handed_ahead_runs_elsewhere(
    tmp_path: Path,
) -> None:
    # Given: two children up; chunks of 10 items of ~5 ms, one chunk handed ahead to each
    ex = ParallelExecutor(workers=2, name="sigkill")
    log = tmp_path / "log"
    try:
        ex.map(uneven, range(100), chunksize=10)
        _both_children_ready(ex)

        # When: item 35 SIGKILLs its child while it holds the next chunk, not yet started
        outcomes = ex.map(
            die_at, range(120), chunksize=10, errors="return", kwargs={"victim": 35, "log": str(log)}
        )

        # Then: its chunk (30..39) is reported lost with the signal, every other item holds
        # its own result, in order, and no item ran twice (36..39 never ran)
        lost = [i for i, value in enumerate(outcomes) if isinstance(value, ChildCrashedError)]
        assert lost == list(range(30, 40))
        assert outcomes[35].signal_name == "SIGKILL"
        assert [v for i, v in enumerate(outcomes) if i not in lost] == [
            i for i in range(120) if i not in lost
        ]
        ran = [int(line) for line in log.read_text().splitlines()]
        assert sorted(ran) == [i for i in range(120) if not 36 <= i <= 39]
        assert ex.map(uneven, range(100), chunksize=10) == [uneven(n) for n in range(100)]  # healed
    finally:
        ex.close()


def test_a_timeout_kills_the_children_still_computing_the_run() -> None:
    ex = ParallelExecutor(workers=2, name="slow")
    try:
        ex.map(uneven, range(100), chunksize=10)  # start the children
        _both_children_ready(ex)  # (one still starting would compute nothing, and live on)
        before = set(ex._get_pool().pids())
        with pytest.raises(WorkTimeoutError, match="timed out"):
            ex.map(forever, range(4), chunksize=1, timeout=0.3)
        deadline = time.monotonic() + 10
        while not all(_alive(pid) is False for pid in before) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in before)  # killed, not left computing for 60 s
        assert ex.map(uneven, range(100), chunksize=10) == [uneven(n) for n in range(100)]
    finally:
        ex.close()


def test_a_timeout_stops_the_run_and_drops_the_chunks_not_started(cluster_url: str, tmp_path: Path) -> None:
    # Given: 12 chunks of one item that take 1.5 s each, on 2 workers, with a 0.5 s budget
    ex = ParallelExecutor(workers=2, name="budget", cluster=cluster_url)
    log = tmp_path / "started.log"
    try:
        ex.map(uneven, range(100), chunksize=10)  # workers up and warm
        began = time.monotonic()
        with pytest.raises(WorkTimeoutError, match="timed out"):
            ex.map(nap_and_log, range(12), chunksize=1, kwargs={"log": str(log), "seconds": 1.5}, timeout=0.5)
        # Then: it raised at the budget, not after the chunks it had sent
        assert time.monotonic() - began < 1.4
        time.sleep(2.5)  # what was computing has finished (Dask) or was interrupted (local, Ray)
        started = log.read_text().split() if log.exists() else []
        # only chunks in flight (two per worker) ever started; the rest were dropped unsent
        assert len(started) <= 4, started
        assert ex.map(uneven, range(100), chunksize=10) == [uneven(n) for n in range(100)]
    finally:
        ex.close()


def test_the_sequential_fallback_runs_each_item_once_and_reports_the_failed_index(
    executor: ParallelExecutor,
) -> None:
    calls: list[int] = []

    def counted(n: int) -> int:  # runs in the caller (sequential), so a closure is fine
        calls.append(n)
        return reject_77(n)

    outcomes = executor.map(counted, range(10_000), errors="return")
    assert executor.last_plan is not None
    assert executor.last_plan.mode == "sequential"
    assert sorted(calls) == list(range(10_000))  # each item exactly once, the failure included
    assert isinstance(outcomes[77], ValueError)
    assert "item 77 failed (in the caller)" in "\n".join(outcomes[77].__notes__)
    assert outcomes[76] == 76
    assert outcomes[78] == 78


def test_what_cannot_be_sent_to_a_process_fails_before_it_runs(executor: ParallelExecutor) -> None:
    with pytest.raises(SubmitError, match="define it at module level"):
        executor.map(lambda n: n, range(200), chunksize=10)
    data: list[Any] = list(range(200))
    data[150] = lambda: None
    with pytest.raises(SubmitError, match="item 150 cannot be sent"):
        executor.map(uneven, data, chunksize=10)


def test_parallel_map_passes_keyword_arguments_and_small_inputs_run_in_the_caller(cluster_url: str) -> None:
    try:
        assert parallel_map(scale, range(10), by=3, cluster=cluster_url) == [n * 3 for n in range(10)]
        assert parallel_map(scale, range(300), by=2, chunksize=25, workers=2, cluster=cluster_url) == [
            n * 2 for n in range(300)
        ]
    finally:
        _close_shared()  # its connection must not outlive the session's cluster


def test_progress_bar_shows_on_a_terminal_and_stays_off_otherwise(executor: ParallelExecutor) -> None:
    shown = io.StringIO()
    executor.map(
        uneven, range(400), chunksize=50, console=Console(file=shown, force_terminal=True), progress=True
    )
    assert "400/400" in shown.getvalue()
    hidden = io.StringIO()
    executor.map(uneven, range(400), chunksize=50, console=Console(file=hidden, force_terminal=False))
    assert hidden.getvalue() == ""
    off = io.StringIO()
    executor.map(
        uneven, range(400), chunksize=50, console=Console(file=off, force_terminal=True), progress=False
    )
    assert off.getvalue() == ""


# -- a @app.work(partitionable=True) unit ---------------------------------------------------


def test_a_parallel_unit_records_its_fallback_in_its_decision(home: Any, cluster_url: str) -> None:
    app = Foundry("par", cluster=cluster_url)
    unit = app.work(partitionable=True, bound="cpu", name="uneven")(uneven)
    assert unit.decision.execution == "parallel"
    runner = make_runner(unit.spec, app.context())
    try:
        assert runner.call((list(range(12)),), {}) == [uneven(n) for n in range(12)]
        assert f"fell back to sequential: 12 items < threshold {DEFAULT_THRESHOLD}" in runner.decision.notes
        handle = runner.submit((list(range(2000)),), {}, SubmitOptions())
        assert handle.result(60) == [uneven(n) for n in range(2000)]
        assert runner.executor.engine == engine_of(cluster_url)
        assert list(runner.map(range(5))) == [uneven(n) for n in range(5)]
        with pytest.raises(SubmitError, match="one iterable"):
            runner.submit((1, 2), {}, SubmitOptions())
    finally:
        runner.close()


def test_children_die_with_the_parent_even_by_sigkill(tmp_path: Path) -> None:
    script = tmp_path / "victim.py"
    script.write_text(
        textwrap.dedent(
            """
            import threading, time
            from foundry.execute.parallel import ParallelExecutor
            from tests.execute.test_parallel import forever

            if __name__ == "__main__":
                ex = ParallelExecutor(workers=2)
                threading.Thread(target=ex.map, args=(forever, range(4)), kwargs={"chunksize": 1}).start()
                while len(ex._get_pool().pids()) < 2:
                    time.sleep(0.05)
                time.sleep(0.3)
                print(" ".join(str(p) for p in ex._get_pool().pids()), flush=True)
                time.sleep(60)
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
    )
    try:
        assert proc.stdout is not None
        children = [int(p) for p in proc.stdout.readline().split()]
        assert len(children) == 2
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in children)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead: reaped by init soon
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
