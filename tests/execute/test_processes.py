"""``processes``: real faults. Segfault a child, time one out, recycle them, SIGKILL the
parent — then count: only the guilty handle failed, nothing else was lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from foundry import Foundry
from foundry.errors import ChildCrashedError, SubmitError, WorkTimeoutError
from foundry.execute.process_pool import ProcessPool
from foundry.execute.processes import ProcessRunner
from foundry.handle import Status
from foundry.observe import names
from tests.execute import workloads

ROOT = Path(__file__).resolve().parents[2]


def _runner(unit: object) -> ProcessRunner:
    runner = unit.runner  # type: ignore[attr-defined]
    assert isinstance(runner, ProcessRunner)
    return runner


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie nobody reaped yet is dead too
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def wait_until(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_a_segfault_fails_only_its_own_handle(app: Foundry) -> None:
    unit = app.work(model="processes", workers=2, name="native", max_pending=32)(workloads.crash_or_pid)
    before = [unit.submit(i) for i in range(6)]
    crash = unit.submit("segv")
    after = [unit.submit(i) for i in range(6)]
    with pytest.raises(ChildCrashedError) as info:
        crash.result(timeout=20)
    assert info.value.exitcode == -11
    assert info.value.signal_name == "SIGSEGV"
    assert "SIGSEGV" in str(info.value)
    assert crash.status is Status.FAILED
    for handle in before + after:  # siblings, in flight at the time, all complete
        assert isinstance(handle.result(timeout=20), int)
    wait_until(lambda: app.metrics.value(names.CHILD_RESTARTS, unit="native") >= 1)
    assert app.metrics.value(names.CHILD_EXITS, unit="native", code="-11") == 1
    assert app.metrics.value(names.UNIT_FAILED, unit="native") == 1
    assert app.metrics.value(names.UNIT_COMPLETED, unit="native") == 12
    wait_until(lambda: len(_runner(unit).pool.pids()) == 2)  # replaced


def test_a_timeout_kills_the_child_and_fails_that_handle(app: Foundry) -> None:
    unit = app.work(model="processes", workers=1, name="stuck")(workloads.crash_or_pid)
    first_pid = unit(1)
    handle = unit.options(timeout="300ms").submit("sleep")
    queued = unit.submit(2)  # waits behind it; must not be lost with the killed child
    with pytest.raises(WorkTimeoutError, match="was killed"):
        handle.result(timeout=20)
    second_pid = queued.result(timeout=20)
    assert second_pid != first_pid
    assert not _alive(first_pid)
    assert app.metrics.value(names.CHILD_RESTARTS, unit="stuck") == 1


def test_max_tasks_per_child_recycles_children(app: Foundry) -> None:
    unit = app.work(model="processes", workers=1, max_tasks_per_child=2, name="leaky")(workloads.pid)
    pids = [unit() for _ in range(6)]
    assert len(set(pids)) == 3
    assert [pids.count(p) for p in dict.fromkeys(pids)] == [2, 2, 2]
    wait_until(lambda: app.metrics.value(names.CHILD_EXITS, unit="leaky", code="0") >= 2)
    assert app.metrics.value(names.CHILD_RESTARTS, unit="leaky") >= 2


def test_arguments_that_cannot_be_pickled_fail_at_submit(app: Foundry) -> None:
    unit = app.work(model="processes", workers=1, name="square")(workloads.square)
    with pytest.raises(SubmitError, match=r"unit 'square'.*cannot be pickled.*Fix:"):
        unit.submit(threading.Lock())
    assert unit.submit(3).result(timeout=20) == 9  # nothing else was affected


def test_functions_a_child_cannot_import_fail_at_submit(app: Foundry) -> None:
    def closure(x: int) -> int:
        return x

    lam = app.work(model="processes", name="lam")(lambda x: x)
    nested = app.work(model="processes", name="nested")(closure)
    for unit, what in ((lam, "a lambda"), (nested, "nested function")):
        with pytest.raises(SubmitError, match=what):
            unit.submit(1)


def test_a_function_from_python_dash_c_fails_at_submit(home: Path) -> None:
    code = textwrap.dedent(
        """
        from foundry import Foundry
        from foundry.errors import SubmitError
        app = Foundry("dash-c")
        @app.work(model="processes")
        def work(x):
            return x
        try:
            work.submit(1)
        except SubmitError as exc:
            print("SubmitError:", exc)
        app.close()
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert "SubmitError:" in out.stdout, out.stderr
    assert "python -c" in out.stdout


def test_a_result_that_cannot_be_pickled_fails_its_own_handle(app: Foundry) -> None:
    unit = app.work(model="processes", workers=1, name="lock_maker")(workloads.unpicklable_result)
    with pytest.raises(SubmitError, match="result cannot be pickled"):
        unit.submit().result(timeout=20)


PARENT = """
import sys, time
from foundry import Foundry
from tests.execute import workloads

def main():
    app = Foundry("orphans")
    unit = app.work(model="processes", workers=2, name="sleepy")(workloads.sleep_then)
    handles = [unit.submit(60, i) for i in range(2)]
    pool = unit.runner.pool
    while len(pool.pids()) < 2 or any(h.status.value != "running" for h in handles):
        time.sleep(0.01)
    print(" ".join(map(str, pool.pids())), flush=True)
    time.sleep(60)

if __name__ == "__main__":
    main()
"""


def test_no_orphans_when_the_parent_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FOUNDRY_HOME": str(tmp_path / ".foundry")}
    parent = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    watchdog = threading.Timer(30, parent.kill)  # a parent that never reports must not hang the suite
    watchdog.start()
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 2, parent.stderr.read() if parent.stderr else line
        assert all(_alive(p) for p in pids)
        # When: the parent dies without any chance to clean up
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        # Then: its children die too
        wait_until(lambda: not any(_alive(p) for p in pids), timeout=10)
    finally:
        watchdog.cancel()
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        for stream in (parent.stdout, parent.stderr):
            if stream is not None:
                stream.close()


FORGETFUL = """
import sys
from foundry import Foundry
from tests.execute import workloads

def main():
    app = Foundry("forgetful")
    procs = app.work(model="processes", workers=1, name="procs")(workloads.append_line)
    pooled = app.work(model="bounded_pool", workers=1, name="pooled")(workloads.append_line)
    for i in range(3):
        procs.submit(sys.argv[1], f"p{i}")
        pooled.submit(sys.argv[1], f"t{i}")
    # the program ends here: no result() waited for, no app.close()

if __name__ == "__main__":
    main()
"""


def test_accepted_work_is_drained_when_the_program_ends_without_close(tmp_path: Path) -> None:
    script = tmp_path / "forgetful.py"
    script.write_text(FORGETFUL)
    out = tmp_path / "lines.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FOUNDRY_HOME": str(tmp_path / ".foundry")}
    done = subprocess.run(
        [sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert sorted(out.read_text().split()) == ["p0", "p1", "p2", "t0", "t1", "t2"]


def test_a_decorated_unit_is_found_by_name_in_the_child(home: Path) -> None:
    from tests.execute.declared import app as declared_app
    from tests.execute.declared import triple

    try:
        assert triple(2) == 6
        assert triple.submit(5).result(timeout=20) == 15
    finally:
        declared_app.close(timeout=5)


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(app: Foundry) -> None:
    unit = app.work(model="processes", workers=1, timeout="200ms", name="stubborn")(
        workloads.ignore_sigterm_and_sleep
    )
    with pytest.raises(WorkTimeoutError):
        unit.submit(30).result(timeout=20)
    assert app.metrics.value(names.CHILD_EXITS, unit="stubborn", code="-9") == 1  # SIGKILL


def test_a_child_killed_while_holding_a_unit_handed_ahead_loses_only_the_unit_it_was_running(
    tmp_path: Path,
) -> None:
    # Given: a pool that hands one unit ahead (parallel's chunks), both children up, and six
    # units that wait at a gate: two running, one handed ahead to each child, two queued
    log, gate = tmp_path / "log", tmp_path / "gate"
    pool = ProcessPool(
        "ahead", workloads.__name__, "log_and_wait_for", workers=2, max_pending=8, short=False, ahead=1
    )
    try:
        pool.start(30)
        wait_until(lambda: len(pool._children) == 2 and all(c.ready for c in pool._children), 30)
        tasks = [pool.submit((i, str(log), str(gate)), {}) for i in range(6)]
        by_number = {t.number: i for i, t in enumerate(tasks)}
        wait_until(lambda: log.exists() and len(log.read_text().splitlines()) == 2)
        with pool._lock:
            held = {c.pid: [by_number[t.number] for t in c.inflight] for c in pool._children}
        assert sorted(map(len, held.values())) == [2, 2], held  # one running, one ahead, each
        assert sorted(i for units in held.values() for i in units) == [0, 1, 2, 3]
        victim = next(pid for pid, units in held.items() if units[0] == 0)
        running, ahead = held[victim]

        # When: the child running unit 0 is killed with SIGKILL, then the gate opens
        os.kill(victim, signal.SIGKILL)
        assert tasks[running].wait(20)
        gate.touch()
        for task in tasks:
            assert task.wait(20)

        # Then: the unit it was running failed as crashed; the one handed ahead to it ran
        # on another child; every other unit completed; none ran twice
        crashed = tasks[running].outcome().error
        assert isinstance(crashed, ChildCrashedError)
        assert crashed.signal_name == "SIGKILL"
        values = {i: t.outcome().value for i, t in enumerate(tasks) if i != running}
        assert all(values[i][0] == i for i in values), values
        assert values[ahead][1] != victim
        started = [int(line.split()[0]) for line in log.read_text().splitlines()]
        assert sorted(started) == list(range(6))  # each unit started exactly once
    finally:
        gate.touch()
        pool.close()
