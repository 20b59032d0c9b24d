"""100 workflows, two worker processes, one of them SIGKILLed mid-step again and again —
on SQLite and on PostgreSQL. Then count: every workflow finished or compensated, every
caller saw its result, every transactional effect happened exactly once, and a plain
step ran again only when the run that executed it died before its record."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from foundry.backends.journal.base import WorkflowStatus
from foundry.deliver.workflow import configure
from tests.faults import _workflow_app as fault_app
from tests.workflows.conftest import drop_schema, make_url

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = 100
KILLS = 5
CONCURRENCY = 4


def _create_effects_table(url: str) -> None:
    if url.startswith("sqlite"):
        import sqlite3

        with sqlite3.connect(url.split("?", 1)[0][len("sqlite:///") :]) as conn:
            conn.execute("CREATE TABLE effects (wf TEXT NOT NULL, what TEXT NOT NULL)")
        conn.close()
        return
    import psycopg

    schema = url.split("schema=", 1)[1]
    with psycopg.connect(url.split("?", 1)[0], autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{schema}".effects (wf TEXT NOT NULL, what TEXT NOT NULL)')


def _effects(url: str) -> Counter[tuple[str, str]]:
    if url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(url.split("?", 1)[0][len("sqlite:///") :])
        try:
            rows = conn.execute("SELECT wf, what FROM effects").fetchall()
        finally:
            conn.close()
    else:
        import psycopg

        schema = url.split("schema=", 1)[1]
        with psycopg.connect(url.split("?", 1)[0]) as pg:
            rows = pg.execute(f'SELECT wf, what FROM "{schema}".effects').fetchall()
    return Counter((str(r[0]), str(r[1])) for r in rows)


def _worker(
    url: str, log: Path, out: Path, *, target: str = "tests.faults._workflow_app:app", lease: float = 1.0
) -> subprocess.Popen[bytes]:
    """A worker process running ``target``; it prints one line on stdout once it is running."""
    env = {**os.environ, "FW_FAULT_LOG": str(log)}
    cmd = [
        sys.executable,
        "-m",
        "foundry.cli",
        "workflows",
        "worker",
        target,
        "--journal",
        url,
        "--lease",
        str(lease),
        "--poll",
        "0.05",
        "--concurrency",
        str(CONCURRENCY),
    ]
    with open(out, "wb") as sink:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
    _wait_for(lambda: b"workflow worker" in out.read_bytes() or proc.poll() is not None)
    assert proc.poll() is None, out.read_text()
    return proc


def _stop_workers(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every worker still running; SIGKILL one that has not exited 15 s later."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def _wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _ran_steps(log: Path, pid: int) -> bool:
    """Has process ``pid`` executed a step? (log lines: ``order step pid time``)"""
    return any(line.split()[2] == str(pid) for line in log.read_text().splitlines())


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_sigkilled_workers_lose_nothing_and_repeat_no_completed_step(engine: str, tmp_path: Path) -> None:
    url, schema = make_url(engine, tmp_path)
    log = tmp_path / "effects.log"
    log.touch()
    os.environ["FW_FAULT_LOG"] = str(log)
    procs: list[subprocess.Popen[bytes]] = []
    rt = configure(fault_app.app, journal=url)
    try:
        _create_effects_table(url)
        # Given worker B running throughout, and worker A, which is SIGKILLed mid-step five
        # times: each time a batch of orders arrives, A starts on it, and dies
        steady = _worker(url, log, tmp_path / "steady.out")
        procs.append(steady)
        rng = random.Random(5)
        handles: list[Any] = []

        def more(count: int) -> None:
            first = len(handles) + 1
            handles.extend(
                fault_app.order.enqueue(n, id=f"order-{n:03d}") for n in range(first, first + count)
            )

        for cycle in range(KILLS):
            victim = _worker(url, log, tmp_path / f"victim-{cycle}.out")
            procs.append(victim)
            more(WORKFLOWS // KILLS)
            # (if worker B took the whole batch before A got going, give them more)
            deadline = time.monotonic() + 60
            while not _ran_steps(log, victim.pid):
                assert time.monotonic() < deadline, "worker A never ran a step"
                if all(h.done() for h in handles[-5:]):
                    more(5)
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.02))
            victim.send_signal(signal.SIGKILL)
            victim.wait(10)
        victim = _worker(url, log, tmp_path / "victim-last.out")
        procs.append(victim)
        # Then every caller sees its workflow's outcome
        outcomes = {}
        for h in handles:
            error = h.exception(timeout=90)
            outcomes[h.id] = error if error is not None else h.result(0)
        assert all(p.poll() is None for p in (steady, victim)), "a worker that was not killed died"
        failed = {h.id for h in handles if int(h.id.split("-")[1]) % 10 == 0}
        for wid, outcome in outcomes.items():
            if wid in failed:
                assert isinstance(outcome, fault_app.ShipError), (wid, outcome)
            else:
                assert outcome["charged"]["amount"] == int(wid.split("-")[1]), (wid, outcome)
        states = {s.id: s for s in rt.journal.workflows(limit=1000)}
        assert len(states) == len(handles) >= WORKFLOWS
        for wid, state in states.items():
            want = WorkflowStatus.FAILED if wid in failed else WorkflowStatus.SUCCEEDED
            assert state.status == want, (wid, state.status)
            assert state.compensation == ("done" if wid in failed else "")
        # Transactional effects happened exactly once each, kills or not
        effects = _effects(url)
        for wid in states:
            assert effects[(wid, "charge")] == 1, (wid, effects[(wid, "charge")])
            assert effects[(wid, "refund")] == (1 if wid in failed else 0), wid
        # Plain steps are at-least-once, and a *completed* step never runs again: every
        # execution started before the step's record was written, and a step ran more than
        # once only in a workflow that another run took over
        runs: Counter[tuple[str, str]] = Counter()
        started: dict[tuple[str, str], list[float]] = {}
        for line in log.read_text().splitlines():
            wid, what, _pid, at = line.split()
            runs[(wid, what)] += 1
            started.setdefault((wid, what), []).append(float(at))
        for wid, state in states.items():
            recorded = {e.name: e.finished_at for e in rt.journal.load(wid)[1] if e.kind in ("step", "undo")}
            for what in ("reserve", "ship", *(("release",) if wid in failed else ())):
                assert runs[(wid, what)] >= 1, (wid, what)
                assert runs[(wid, what)] <= state.claims, (wid, what, runs[(wid, what)], state.claims)
                finished = recorded[what]
                assert finished is not None
                late = [t for t in started[(wid, what)] if t > finished]
                assert not late, f"{wid}: {what} ran again after its record ({late} > {finished})"
        duplicates = sum(n - 1 for n in runs.values() if n > 1)
        assert duplicates <= sum(s.claims - 1 for s in states.values())
        recovered = sum(1 for s in states.values() if s.claims > 1)
        assert recovered > 0, "no workflow was ever taken over: the kills missed"
        print(
            f"{engine}: {len(handles)} workflows, {KILLS} kills, {recovered} recovered by another run, "
            f"{duplicates} plain-step re-runs, 0 duplicate transactional effects"
        )
    finally:
        _stop_workers(procs)
        rt.close()
        os.environ.pop("FW_FAULT_LOG", None)
        if schema is not None:
            drop_schema(url.split("?", 1)[0], schema)
