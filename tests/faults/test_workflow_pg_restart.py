"""PostgreSQL itself restarted while a worker process runs 100 four-step workflows from
a PostgreSQL journal — some done, some in flight, two of them held inside their
transactional step with its transaction open, so that the server drops it. Then count.

What the counts prove: every workflow succeeds, and its submitter — who was waiting on
its handle right through the outage — reads its result; the worker process rode the
outage out and reconnected by itself (the test never restarts it); the transactional
step's effect (a row committed with its record) exists exactly once per workflow; and a
plain step never runs again once its record is committed.

The honest limit: a plain step's effect and its record are two things, so a run that is
stopped between them (here: the journal stays unreachable past the run's retries, so the
run is abandoned and its lease lapses) has that step run again by the next run of the
workflow. A restart shorter than the retries and the lease, as here, costs no re-run at
all; the test asserts that, and bounds re-runs by the number of takeovers in any case.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from foundry.backends.journal.base import WorkflowStatus
from foundry.deliver.workflow import configure
from tests.faults import _workflow_restart_app as restart_app
from tests.faults.test_workflow_faults import _create_effects_table, _effects, _stop_workers, _worker
from tests.private_servers import PrivateServer, private_server
from tests.workflows.conftest import drop_schema

WORKFLOWS = 100
LEASE = 5.0  # longer than the outage: a run that rides it out keeps its workflow
WAIT = 120.0  # every wait below is bounded by this


def _until(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def private_postgres() -> Iterator[PrivateServer]:
    """A private PostgreSQL cluster on a free port (never the shared server), which the
    test restarts once; removed afterwards, passed or not."""
    with private_server("postgres") as server:
        yield server


def _runs(log: Path) -> tuple[Counter[tuple[str, str]], dict[tuple[str, str], list[float]], dict[int, float]]:
    """From the effects log: executions per (workflow, step), their start times, and the
    last time each process ran a step."""
    runs: Counter[tuple[str, str]] = Counter()
    started: dict[tuple[str, str], list[float]] = {}
    last: dict[int, float] = {}
    for line in log.read_text().splitlines():
        wid, what, pid, at = line.split()
        runs[(wid, what)] += 1
        started.setdefault((wid, what), []).append(float(at))
        last[int(pid)] = max(last.get(int(pid), 0.0), float(at))
    return runs, started, last


@pytest.mark.slow
def test_postgres_restarted_mid_run_every_workflow_completes_and_no_recorded_step_reruns(
    tmp_path: Path, private_postgres: PrivateServer
) -> None:
    schema = f"fw_test_{uuid.uuid4().hex[:10]}"
    url = f"{private_postgres.url}?schema={schema}"
    log = tmp_path / "effects.log"
    log.touch()
    os.environ["FW_FAULT_LOG"] = str(log)
    hold = tmp_path / "hold"
    hold.touch()
    os.environ["FW_HOLD_FILE"] = str(hold)
    out = tmp_path / "worker.out"
    worker: subprocess.Popen[bytes] | None = None
    rt = configure(restart_app.app, journal=url)
    try:
        _create_effects_table(url)
        # Given one worker process, and 100 workflows whose submitter waits on every
        # handle in the background, right through what follows
        worker = _worker(url, log, out, target="tests.faults._workflow_restart_app:app", lease=LEASE)
        handles = [restart_app.pipeline.enqueue(n, id=f"wf-{n:03d}") for n in range(WORKFLOWS)]
        outcomes: dict[str, Any] = {}

        def wait_all() -> None:
            for h in handles:
                try:
                    outcomes[h.id] = h.result(timeout=WAIT)
                except Exception as exc:  # recorded, asserted below
                    outcomes[h.id] = exc

        waiter = threading.Thread(target=wait_all, daemon=True)
        waiter.start()

        def shipped() -> int:
            return sum(1 for line in log.read_text().splitlines() if line.split()[1] == "ship")

        def held() -> int:
            return sum(1 for line in log.read_text().splitlines() if line.split()[1] == "held")

        # When PostgreSQL restarts once some workflows are done and others in flight —
        # two of them inside their transactional step, transaction open
        _until(lambda: held() == len(restart_app.HELD), "the held workflows to reach their charge")
        before = shipped()
        try:
            outage = private_postgres.restart()  # fast shutdown: every session ends
        finally:
            hold.unlink()
        restarted_at = time.time()
        assert WORKFLOWS // 5 <= before < WORKFLOWS - 2 * len(restart_app.HELD), before

        # Then every submitter reads its workflow's result
        waiter.join(WAIT + 10)
        assert not waiter.is_alive(), "the submitter is still waiting"
        failed = {wid: o for wid, o in outcomes.items() if isinstance(o, BaseException)}
        assert not failed, f"{len(failed)} submitters got an error, e.g. {next(iter(failed.items()))}"
        for h in handles:
            n = int(h.id.split("-")[1])
            assert outcomes[h.id] == {
                "n": n,
                "items": f"items-{h.id}",
                "box": f"box-{h.id}",
                "parcel": f"parcel-{h.id}",
            }
        # ... the worker is the same process, still running, and ran steps after the restart
        assert worker.poll() is None, "the worker process died"
        runs, started, last = _runs(log)
        assert last.get(worker.pid, 0.0) > restarted_at, "the worker ran no step after the restart"
        # ... every workflow succeeded once in the journal
        states = {s.id: s for s in rt.journal.workflows(limit=1000)}
        assert sorted(states) == sorted(h.id for h in handles)
        assert all(s.status is WorkflowStatus.SUCCEEDED for s in states.values())
        # ... the transactional effect exists exactly once per workflow
        effects = _effects(url)
        assert all(effects[(wid, "charge")] == 1 for wid in states), effects
        assert sum(effects.values()) == WORKFLOWS
        # ... and no plain step ran after its record committed; one ran more than once
        # only in a workflow that another run took over
        takeovers = sum(s.claims - 1 for s in states.values())
        for wid, state in states.items():
            recorded = {e.name: e.finished_at for e in rt.journal.load(wid)[1] if e.kind == "step"}
            for what in restart_app.PLAIN_STEPS:
                assert 1 <= runs[(wid, what)] <= state.claims, (wid, what, runs[(wid, what)], state.claims)
                finished = recorded[what]
                assert finished is not None
                late = [t for t in started[(wid, what)] if t > finished]
                assert not late, f"{wid}: {what} ran again after its record ({late} > {finished})"
        reruns = sum(n - 1 for (_, what), n in runs.items() if what in restart_app.PLAIN_STEPS)
        # a restart shorter than the lease and the journal retries: no run was abandoned
        taken = {wid: s.claims for wid, s in states.items() if s.claims > 1}
        assert takeovers == 0, f"{takeovers} takeovers after a {outage:.1f}s outage (claims: {taken})"
        assert reruns == 0, f"{reruns} plain-step re-runs"
        print(
            f"postgres restart: {before}/{WORKFLOWS} finished before, unreachable {outage:.1f}s, "
            f"{takeovers} takeovers, {reruns} plain-step re-runs, 0 duplicate transactional effects"
        )
    except BaseException:
        print(f"--- worker log ({out}) ---\n{out.read_text() if out.exists() else '(none)'}")
        raise
    finally:
        _stop_workers([worker] if worker is not None else [])
        rt.close()
        os.environ.pop("FW_FAULT_LOG", None)
        os.environ.pop("FW_HOLD_FILE", None)
        drop_schema(url.split("?", 1)[0], schema)
