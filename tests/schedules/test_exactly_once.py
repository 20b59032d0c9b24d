"""Three ``foundry run`` supervisors on one engine, a 1 s schedule, one of them SIGKILLed
while it runs a tick's job: every tick has exactly one job and one completed run, none is
missed while a supervisor is up, and the killed one's job is run again by another (its
first run died with it). On every queue engine.

Each run of the unit appends ``start``/``end`` lines (tick, pid) to a log with
``O_APPEND``, so the runs are counted from outside the processes; the jobs are counted
in the store by their tick keys.
"""

from __future__ import annotations

import collections
import datetime as dt
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from foundry.backends.queue import JobStatus, open_queue_backend
from foundry.backends.queue.schedules import schedule_store
from tests.backends.queue.engines import ENGINES, close, engine_url

ROOT = Path(__file__).resolve().parents[2]

APP = """
import os, time
from foundry import Foundry

app = Foundry("once", queue=os.environ["TEST_QUEUE"])


@app.work(schedule="every 1s", bound="io")
def tick(scheduled_at: str = "") -> None:
    fd = os.open(os.environ["TEST_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"start {scheduled_at} {os.getpid()} {time.time()}\\n".encode())
        time.sleep(0.4)
        os.write(fd, f"end {scheduled_at} {os.getpid()} {time.time()}\\n".encode())
    finally:
        os.close(fd)
"""


def wait_for(what: str, ready: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(0.02)


def runs(log: Path) -> list[tuple[str, str, int, float]]:
    """(start|end, tick, pid, when) per line written so far (a torn last line is left out)."""
    text = log.read_text() if log.exists() else ""
    out = []
    for line in text.splitlines(keepends=True):
        parts = line.split()
        if line.endswith("\n") and len(parts) == 4:
            out.append((parts[0], parts[1], int(parts[2]), float(parts[3])))
    return out


@pytest.mark.parametrize("engine", ENGINES)
def test_three_supervisors_one_killed_run_each_tick_exactly_once(engine: str, tmp_path: Path) -> None:
    url = engine_url(engine, tmp_path)
    (tmp_path / "once_app.py").write_text(APP)
    log = tmp_path / "runs.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "FOUNDRY_HOME": str(tmp_path / ".foundry"),  # shared: RabbitMQ's state store lives here
        "TEST_QUEUE": url,
        "TEST_LOG": str(log),
    }
    command = [sys.executable, "-m", "foundry.cli", "run", "once_app.py", "--lease", "2s", "--grace", "5s"]
    outputs = [(tmp_path / f"supervisor-{i}.log").open("w") for i in range(3)]
    procs = [
        subprocess.Popen(command, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
        for out in outputs
    ]
    try:
        # Given three supervisors running the schedule
        wait_for("three ticks to run", lambda: sum(k == "end" for k, *_ in runs(log)) >= 3, 60)
        # When one of them is SIGKILLed while it runs a tick's job (started less than 0.15 s
        # ago: it sleeps 0.4 s, so it is still running, its completion not written)
        victim: dict[str, object] = {}

        def mid_run() -> bool:
            lines = runs(log)
            done = {(t, p) for k, t, p, _ in lines if k == "end"}
            fresh = [
                (t, p)
                for k, t, p, at in lines
                if k == "start" and (t, p) not in done and time.time() - at < 0.15
            ]
            if fresh:
                victim["tick"], victim["pid"] = fresh[-1]
            return bool(fresh)

        wait_for("a supervisor to start a job", mid_run, 20)
        pid = int(str(victim["pid"]))
        dying = next(p for p in procs if p.pid == pid)
        os.kill(pid, signal.SIGKILL)
        dying.wait(10)
        killed_at = time.time()
        # Then another supervisor runs that tick again once its lease lapses, and the schedule goes on
        wait_for(
            "the killed job's tick to be run by another supervisor",
            lambda: any(k == "end" and t == victim["tick"] and p != pid for k, t, p, _ in runs(log)),
            30,
        )
        later = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(killed_at + 3))
        wait_for(
            "three more ticks after the kill", lambda: any(t[:19] >= later for _, t, *_ in runs(log)), 30
        )
        for p in procs:
            if p is not dying:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            if p is not dying:
                assert p.wait(30) == 0, (tmp_path / f"supervisor-{procs.index(p)}.log").read_text()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for out in outputs:
            out.close()
    lines = runs(log)
    starts = collections.Counter(t for k, t, *_ in lines if k == "start")
    ends = collections.Counter(t for k, t, *_ in lines if k == "end")
    # One completed run per tick, however many started
    assert set(ends.values()) == {1}, ends
    # The killed supervisor's run died with it, and another ran the tick again; no other
    # tick started twice
    assert [p for k, t, p, _ in lines if t == victim["tick"] and k == "end"] != [pid]
    assert pid in [p for k, t, p, _ in lines if t == victim["tick"] and k == "start"]
    assert {t: n for t, n in starts.items() if n > 1} == {victim["tick"]: 2}
    # In the store: one job per tick, none missed from the first tick to the last recorded
    backend = open_queue_backend(url, home=tmp_path / ".foundry")
    try:
        record = schedule_store(backend).get("tick")
        assert record is not None
        assert record.last_job
        ran = {dt.datetime.fromisoformat(t).timestamp() for t in ends}
        expected = range(int(min(ran)), int(record.last_tick) + 1)
        assert len(expected) >= 6  # ticks before, during and after the kill
        assert ran <= set(expected)  # nothing ran that is not a tick
        for second in expected:
            key = "tick:schedule:" + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))
            state = backend.find(key)
            assert state is not None, f"tick {key} has no job: it was missed"
            if second in ran:
                assert state.status is JobStatus.SUCCEEDED, (key, state.status)
    finally:
        close(backend, url)
