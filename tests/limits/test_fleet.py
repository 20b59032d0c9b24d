"""Limits across a fleet: three worker processes on every queue engine serve limited
units; the runs they record say that no cap and no bucket was ever exceeded, per key
too, that nothing was lost or run twice, and that a limited unit's backlog did not hold
up another unit's jobs behind it. Then a worker SIGKILLed while it holds the only slot:
the slot comes back with its lease."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from foundry.backends.limits import open_limits
from foundry.handle import Handle
from tests.backends.queue.engines import ENGINES, drop_schema, engine_url
from tests.limits import _limited_app as units
from tests.limits._replay import counts, most_at_once, runs, worst_window

ROOT = Path(__file__).resolve().parents[2]
SLACK = 0.25  # seconds from a grant to the job's own clock reading, on a loaded 2-core machine


class Fleet:
    def __init__(self, url: str, effects: Path, lease: float) -> None:
        self.url, self.effects, self.lease = url, effects, lease
        self.procs: list[subprocess.Popen[str]] = []

    def start(self) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.limits._limited_app", self.url, str(self.effects), str(self.lease)],
            cwd=ROOT,
            env={**os.environ, "FOUNDRY_TEST_EFFECTS": str(self.effects)},
            stdout=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()


@pytest.fixture(params=ENGINES)
def setting(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    url = engine_url(request.param, tmp_path)
    effects = tmp_path / "effects.db"
    units.create_effects(effects)
    os.environ["FOUNDRY_TEST_EFFECTS"] = str(effects)
    home = tmp_path / "home"
    old = os.environ.get("FOUNDRY_HOME")
    os.environ["FOUNDRY_HOME"] = str(home)  # the AMQP state store's default file, for every process
    try:
        yield url, effects, home
    finally:
        os.environ.pop("FOUNDRY_TEST_EFFECTS", None)
        if old is None:
            os.environ.pop("FOUNDRY_HOME", None)
        else:
            os.environ["FOUNDRY_HOME"] = old
        drop_schema(url)


def results(handles: list[Handle], timeout: float) -> list[object]:
    deadline = time.monotonic() + timeout
    return [h.result(timeout=max(0.1, deadline - time.monotonic())) for h in handles]


@pytest.mark.alone
def test_three_workers_never_exceed_a_cap_or_a_bucket_and_lose_nothing(
    setting: tuple[str, Path, Path],
) -> None:
    url, effects, _ = setting
    app = units.make_app(url)
    fleet = Fleet(url, effects, lease=5.0)
    try:
        # Given: three worker processes (4 runners each)
        for _ in range(3):
            fleet.start()
        # When: a backlog of rate-limited jobs arrives ahead of unlimited ones, and capped jobs
        rated = [app.units["rated"].submit(i) for i in range(30)]
        free = [app.units["free"].submit(i) for i in range(5)]
        capped = [app.units["capped"].submit(i) for i in range(12)]
        keyed = [app.units["per_customer"].submit(f"c{i % 3}", i) for i in range(12)]
        keyed_rate = [app.units["rated_per"].submit(f"c{i % 2}", i) for i in range(20)]
        done = results(rated + free + capped + keyed + keyed_rate, 90)
        assert done == [*range(30), *range(5), *range(12), *range(12), *range(20)]
    finally:
        fleet.stop()
        app.close()
    # Then: every job ran exactly once
    rows = runs(effects)
    seen = counts(rows)
    want = {("rated", i) for i in range(30)} | {("free", i) for i in range(5)}
    want |= {("capped", i) for i in range(12)} | {("per_customer", i) for i in range(12)}
    want |= {("rated_per", i) for i in range(20)}
    assert set(seen) == want
    assert set(seen.values()) == {1}, seen
    assert len({r[5] for r in rows}) >= 2, "the jobs were shared by the workers"
    # ... never more at once than the cap, for the fleet and per key
    assert most_at_once(runs(effects, "capped")) <= units.CAP
    assert most_at_once(runs(effects, "capped")) == units.CAP, "the cap was used, not serialised"
    for key in ("c0", "c1", "c2"):
        assert most_at_once([r for r in runs(effects, "per_customer") if r[2] == key]) == 1
    assert most_at_once(runs(effects, "per_customer")) >= 2, "keys ran beside each other"
    # ... never more starts in any window than the bucket allows (burst 10, 10/s)
    starts = [r[3] for r in runs(effects, "rated")]
    n, length, bound = worst_window(starts, burst=10, rate=10.0, slack=SLACK)
    assert n <= bound, f"{n} starts in {length:.2f}s, more than the bucket's {bound:.1f}"
    assert max(starts) - min(starts) >= 1.5, "30 jobs at 10/s with a burst of 10 take 2 s"
    for key in ("c0", "c1"):  # ... per key too (burst 5, 5/s each)
        mine = [r[3] for r in runs(effects, "rated_per") if r[2] == key]
        n, length, bound = worst_window(mine, burst=5, rate=5.0, slack=SLACK)
        assert n <= bound, f"{key}: {n} starts in {length:.2f}s, more than the bucket's {bound:.1f}"
        assert max(mine) - min(mine) >= 0.8, "10 jobs at 5/s with a burst of 5 take 1 s"
    both = sorted(r[3] for r in runs(effects, "rated_per"))
    assert worst_window(both, burst=5, rate=5.0, slack=SLACK)[0] > 5 + 5 * SLACK, (
        "the keys have a bucket each"
    )
    # ... and the unlimited jobs queued behind the limited backlog did not wait for it
    assert max(r[3] for r in runs(effects, "free")) < max(starts)


@pytest.mark.alone
def test_a_slot_held_by_a_sigkilled_worker_comes_back_with_its_lease(
    setting: tuple[str, Path, Path], tmp_path: Path
) -> None:
    url, effects, home = setting
    app = units.make_app(url)
    lease = 1.5
    fleet = Fleet(url, effects, lease=lease)
    limits = open_limits(url, home)
    marker = tmp_path / "hogging"
    try:
        # Given: a worker holding the only slot of `hog` (max_concurrency=1)
        first = app.units["hog"].submit(0, str(marker))
        victim = fleet.start()
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert time.monotonic() < deadline, "the hog never started"
            time.sleep(0.02)
        assert limits.in_use("hog", "") == 1
        # When: it is SIGKILLed, and another worker comes for the next job
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        second = app.units["hog"].submit(1, str(marker))
        fleet.start()
        # Then: the slot lapses with the lease, and both jobs run (the first one again)
        assert results([first, second], 30 + 4 * lease) == [0, 1]
        assert sorted(counts(runs(effects, "hog"))) == [("hog", 0), ("hog", 1)]
        deadline = time.monotonic() + 10
        while limits.in_use("hog", "") != 0:
            assert time.monotonic() < deadline, "a slot is still held after every job ended"
            time.sleep(0.05)
    finally:
        fleet.stop()
        limits.close()
        app.close()
