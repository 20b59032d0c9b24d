"""The exporter, `foundry metrics`, `foundry top --once` and the dashboard's merge."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest
from rich.console import Console

from foundry import Foundry
from foundry.cli.dashboard import merged_snapshot
from foundry.errors import BackendUnavailableError
from foundry.observe import names
from foundry.observe.http import MetricsServer
from foundry.observe.top import fetch_snapshot, render_snapshot


@pytest.fixture
def served() -> Iterator[MetricsServer]:
    app = Foundry()
    app.metrics.counter(names.UNIT_COMPLETED, "done", ["unit"]).labels(unit="sign").inc(7)
    app.metrics.histogram(names.LOOP_LAG, "lag", ["loop"]).labels(loop="main").observe(0.180)
    culprits = app.metrics.counter(names.LOOP_CULPRIT, "stalls", ["loop", "unit", "phase", "culprit"])
    culprits.labels("main", "pay", "sign", "sign (pay.py:9)").inc(3)
    culprits.labels("main", "pay", "main", "pay (pay.py:4)").inc(1)
    app.metrics.collect(names.QUEUE_OLDEST_AGE, "age", lambda: [({"queue": "deploy"}, 12.0)])
    server = app.serve_metrics(port=0)
    yield server
    server.close()


def test_prometheus_json_and_dashboard_are_served(served: MetricsServer) -> None:
    url = served.url
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    assert 'foundry_unit_completed_total{unit="sign"} 7' in text
    snap = json.loads(urllib.request.urlopen(url + "/metrics.json", timeout=5).read())["metrics"]
    assert snap[names.QUEUE_OLDEST_AGE][0]["value"] == 12.0
    page = urllib.request.urlopen(url + "/", timeout=5).read().decode()
    assert "<title>Foundry</title>" in page
    assert "metrics.json" in page


def test_top_renders_every_kind_it_is_given(served: MetricsServer) -> None:
    console = Console(record=True, width=140)
    console.print(render_snapshot(fetch_snapshot(served.url)))
    out = console.export_text()
    assert "sign" in out
    assert "180.0 ms" in out  # loop lag max
    assert "pay.sign: sign (pay.py:9) ×3" in out  # what held the loop most often
    assert "12.0 s" in out  # oldest item's age


def test_cli_top_once_and_metrics(served: MetricsServer) -> None:
    url = served.url
    top = subprocess.run(
        [sys.executable, "-m", "foundry.cli", "top", "--once", "--url", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert top.returncode == 0, top.stderr
    assert "Units" in top.stdout
    metrics = subprocess.run(
        [sys.executable, "-m", "foundry.cli", "metrics", "--url", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "foundry_loop_lag_seconds_count" in metrics.stdout


def test_unreachable_exporter_is_a_clear_error() -> None:
    with pytest.raises(BackendUnavailableError, match="Fix:"):
        fetch_snapshot("http://127.0.0.1:9", timeout=1)
    proc = subprocess.run(
        [sys.executable, "-m", "foundry.cli", "top", "--once", "--url", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr


def test_dashboard_merges_instances_and_marks_the_down_ones(served: MetricsServer) -> None:
    url = served.url
    merged = merged_snapshot([url, "http://127.0.0.1:9"])
    up = {row["labels"]["instance"]: row["value"] for row in merged["foundry_exporter_up"]}
    assert sorted(up.values()) == [0.0, 1.0]
    assert merged[names.UNIT_COMPLETED][0]["labels"]["instance"] == url.split("://")[1]
