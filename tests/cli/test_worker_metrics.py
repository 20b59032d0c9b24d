"""``foundry worker --metrics-port`` exports the worker's loop lag and its culprit, as the
README says: a real worker process, scraped over HTTP while an async job blocks its loop;
and with the watchdog turned off, no loop series at all."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from foundry import Foundry

ROOT = Path(__file__).resolve().parents[2]
UNIT = "crunch"

APP = """
import asyncio, os, time
from foundry import Foundry

app = Foundry("worker-metrics", queue=os.environ["TEST_QUEUE"])


def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@app.work(name="crunch", durable=True, bound="io", est="40ms", concurrency=300)
async def crunch(seconds):
    await asyncio.sleep(0)
    spin(seconds)
    return seconds
"""


class RunningWorker:
    def __init__(self, tmp_path: Path, **env: str) -> None:
        self.queue = f"sqlite:///{tmp_path / 'queue.db'}"
        (tmp_path / "wm_app.py").write_text(APP)
        environ = {
            **os.environ,
            "PYTHONPATH": str(ROOT / "src"),
            "FOUNDRY_HOME": str(tmp_path / ".foundry"),
            "TEST_QUEUE": self.queue,
            **env,
        }
        self.log = tmp_path / f"worker-{uuid.uuid4().hex[:6]}.log"
        self._log = self.log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "foundry.cli", "worker", "wm_app.py", "--metrics-port", "0", "-c", "2"],
            cwd=tmp_path,
            env=environ,
            stdout=subprocess.PIPE,
            stderr=self._log,  # a file: a pipe nobody drains could block the worker
            text=True,
        )
        self.url = self._metrics_url()

    def _metrics_url(self) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 60
        lines: list[str] = []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            found = re.search(r"metrics on (http://\S+)/metrics", line)
            if found:
                return found.group(1)
        self.stop()
        raise AssertionError(f"the worker printed no metrics URL: {lines}; stderr: {self.stderr()}")

    def scrape(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=10) as response:
            return str(response.read().decode())

    def stderr(self) -> str:
        return self.log.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


@pytest.fixture
def worker_env(tmp_path: Path) -> Iterator[Any]:
    started: list[RunningWorker] = []

    def start(**env: str) -> RunningWorker:
        worker = RunningWorker(tmp_path, **env)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def submit_blocking_job(queue: str, home: Path) -> None:
    """Submit, from this process, one job that holds the worker's loop for 250 ms."""
    app = Foundry(f"submitter-{uuid.uuid4().hex[:6]}", home=home, queue=queue)

    @app.work(name=UNIT, durable=True, bound="io", est="40ms", concurrency=300)
    async def crunch(seconds: float) -> float:  # the same unit as the worker's, by name
        return seconds

    try:
        assert crunch.decision.delivery == "queue"
        assert crunch.submit(0.25).result(60) == 0.25
    finally:
        app.close()


def until(check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def test_worker_metrics_port_exports_loop_lag_and_the_culprit(worker_env: Any, tmp_path: Path) -> None:
    worker = worker_env()
    # The loop series is there before any job ran: the worker started its loop watched.
    text = until(lambda: (t := worker.scrape("/metrics")) and 'loop="worker"' in t and t)
    assert 'foundry_loop_lag_seconds_count{loop="worker"}' in text
    submit_blocking_job(worker.queue, tmp_path / ".foundry")
    # Then the culprit series names the unit and the function, and the lag rose
    culprit = (
        f'foundry_loop_culprit_total{{loop="worker",unit="{UNIT}",phase="spin",culprit="spin (wm_app.py:'
    )
    text = until(lambda: (t := worker.scrape("/metrics")) and culprit in t and t)
    assert culprit in text, text
    snapshot = json.loads(worker.scrape("/metrics.json"))["metrics"]
    [lag] = [r for r in snapshot["foundry_loop_lag_seconds"] if r["labels"] == {"loop": "worker"}]
    assert lag["max"] >= 0.15
    assert {"p50", "p99", "max"} <= set(lag)
    [blocked] = [r for r in snapshot["foundry_loop_blocked_total"] if r["labels"] == {"loop": "worker"}]
    assert blocked["value"] >= 1
    worker.stop()
    assert worker.proc.returncode == 0, worker.stderr()


def test_worker_with_the_watchdog_off_exports_no_loop_series(worker_env: Any, tmp_path: Path) -> None:
    worker = worker_env(FOUNDRY_WATCHDOG="off")
    submit_blocking_job(worker.queue, tmp_path / ".foundry")
    text = until(lambda: (t := worker.scrape("/metrics")) and f'unit="{UNIT}"' in t and t)
    assert f'foundry_unit_completed_total{{unit="{UNIT}"' in text  # the job ran, on the loop
    assert "foundry_loop_lag_seconds" not in text
    assert "foundry_loop_culprit_total" not in text
    worker.stop()
    assert worker.proc.returncode == 0, worker.stderr()


def test_the_dashboard_shows_the_worker_loop_and_its_stall_from_the_heartbeat(
    worker_env: Any, tmp_path: Path
) -> None:
    """The queue worker's loop is watched by default, so the dashboard — which reads the
    workers' heartbeats, not their /metrics — charts its lag and puts the stall report
    under the unit that caused it."""
    from foundry.observe.dashboard.live import Live
    from foundry.observe.dashboard.sources import Sources

    worker = worker_env(FOUNDRY_FLEET_INTERVAL="0.2")
    submit_blocking_job(worker.queue, tmp_path / ".foundry")
    app = Foundry("dashboard-view", home=tmp_path / ".foundry", queue=worker.queue)

    @app.work(name=UNIT, durable=True, bound="io", est="40ms", concurrency=300)
    async def crunch(seconds: float) -> float:  # the worker's unit, by name: the plan shows it
        return seconds

    sources = Sources(app)
    try:
        live = Live(sources)

        def seen() -> dict[str, Any] | None:
            sample = live.sample()
            [unit] = [u for u in sample["plan"] if u["name"] == UNIT]
            lag = sample["point"]["loop_lag_p99"].get("worker", 0.0)
            return sample if unit["reports"] and lag > 0 else None

        sample = until(seen)
        assert sample, f"no stall or loop lag from the worker's heartbeat; last: {live.sample()}"
        [unit] = [u for u in sample["plan"] if u["name"] == UNIT]
        message = unit["reports"][0]["message"]
        assert "loop 'worker' blocked" in message
        assert f"unit '{UNIT}'" in message
        assert f"reclassify '{UNIT}.spin'" in message
        [member] = [m for m in sample["fleet"] if m["role"] != "exporter"]
        assert member["state"] == "up"
    finally:
        sources.close()
        app.close()
    worker.stop()
    assert worker.proc.returncode == 0, worker.stderr()
