"""The dashboard in a real browser (headless Chromium from Debian's package, driven by
Playwright): the plan loads, a chart moves when work is submitted, a dead-lettered job
is retried by a click and succeeds, a SIGKILLed `foundry worker` shows as down, and a
job argument that is markup renders as text.

``FOUNDRY_DASHBOARD_SCREENSHOT=docs/img/dashboard.png`` makes the screenshot test write
the README's picture there (it always writes one into its tmp dir).
"""

from __future__ import annotations

import importlib
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from foundry.observe.dashboard import DashboardServer, serve_dashboard
from tests.dashboard.conftest import Workers, wait_for

pytestmark = pytest.mark.slow

XSS = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2">'


@pytest.fixture
def shop(foundry_env: dict[str, str]) -> Iterator[ModuleType]:
    """The test app, imported afresh so it reads this test's FOUNDRY_* engines."""
    import tests.dashboard.dashboard_app as module

    fresh = importlib.reload(module)
    try:
        yield fresh
    finally:
        fresh.app.close()
        fresh.old.close()


@pytest.fixture
def dashboard(shop: ModuleType) -> Iterator[DashboardServer]:
    server = serve_dashboard(shop.app, port=0, poll=1.0)
    try:
        yield server
    finally:
        server.close()


def _open(page: Any, server: DashboardServer, tab: str) -> None:
    page.goto(f"{server.url}/#/{tab}")
    page.wait_for_selector("body[data-last-poll]", timeout=15_000)


def _fleet_state(page: Any, pid: int) -> str | None:
    row = page.query_selector(f'table[data-testid="fleet"] tr[data-pid="{pid}"]')
    return None if row is None else str(row.get_attribute("data-state"))


def test_the_page_loads_and_shows_the_plan(page: Any, dashboard: DashboardServer, shop: ModuleType) -> None:
    _open(page, dashboard, "plan")
    page.wait_for_selector('table[data-testid="plan"] tr[data-unit="resize"] .chip')
    units = page.eval_on_selector_all(
        "table[data-testid=plan] tr[data-unit]", "rows => rows.map(r => r.dataset.unit)"
    )
    assert set(units) == {"resize", "charge", "sign", "thumbnail", "checkout", "signaling"}
    row = page.inner_text('tr[data-unit="charge"]')
    assert "direct" in row
    assert "async" in row
    # the watch list of charge's decision, with the limit its 50 ms budget implies
    lag = page.get_attribute('tr[data-unit="charge"] .chip[data-metric="foundry_loop_lag_seconds"]', "title")
    assert "latency budget" in lag
    assert page.errors == []
    assert "sqlite:///" in page.inner_text("#engines")


def test_a_chart_updates_after_work_is_submitted(
    page: Any, dashboard: DashboardServer, shop: ModuleType, workers: Workers
) -> None:
    proc = workers.start()
    _open(page, dashboard, "charts")
    wait_for(lambda: _fleet_up(dashboard, proc.pid), what="the worker's first heartbeat")
    chart = 'svg[data-chart="throughput"]'
    page.wait_for_selector(chart)
    assert float(page.get_attribute(chart, "data-max")) == 0.0  # nothing done yet
    handles = [shop.app.units["resize"].submit(f"img-{i}.png") for i in range(60)]
    assert [h.result(timeout=60) for h in handles][-1] == "img-59.png@640"
    page.wait_for_function(
        "() => Number(document.querySelector('svg[data-chart=\"throughput\"]').dataset.max) > 0",
        timeout=30_000,
    )
    assert int(page.get_attribute('svg[data-chart="curve"]', "data-points")) >= 2
    assert page.errors == []


def _job_status(server: DashboardServer, job_id: str) -> str | None:
    code, body = server.api.handle("GET", f"/api/jobs/{job_id}", {}, None)
    return str(body["status"]) if code == 200 else None


def _fleet_up(server: DashboardServer, pid: int) -> bool:
    live = server.api.live.sample()
    return any(m["pid"] == pid and m["state"] == "up" for m in live["fleet"])


def test_a_dead_lettered_job_is_retried_by_a_click_and_then_succeeds(
    page: Any, dashboard: DashboardServer, shop: ModuleType, workers: Workers
) -> None:
    # Given a worker deployed before `thumbnail` existed: it dead-letters the job
    early = workers.start("tests.dashboard.dashboard_app:old")
    handle = shop.thumbnail.submit("cat.png")
    wait_for(lambda: _job_status(dashboard, handle.id) == "dead", what="the job to be dead-lettered")
    early.send_signal(signal.SIGTERM)
    early.wait(timeout=20)
    # ... and the right worker now running
    workers.start()
    _open(page, dashboard, "jobs?status=dead")
    row = f'tr[data-job-id="{handle.id}"]'
    page.wait_for_selector(row)
    assert "unknown unit 'thumbnail'" in page.inner_text(row)
    # When the Retry button of that row is clicked
    page.click(f'{row} button[data-action="retry"]')
    page.wait_for_selector('[data-testid="toast"]:has-text("back in its queue")')
    # Then the job runs again and succeeds, and the page says so
    page.goto(f"{dashboard.url}/#/job/{handle.id}")
    page.wait_for_selector("h2 .st-succeeded", timeout=30_000)
    assert handle.result(timeout=60) == "thumb:cat.png"
    assert page.errors == []


def test_a_killed_worker_shows_as_down(page: Any, dashboard: DashboardServer, workers: Workers) -> None:
    proc = workers.start()
    _open(page, dashboard, "fleet")
    page.wait_for_function(
        f"() => document.querySelector('tr[data-pid=\"{proc.pid}\"]')?.dataset.state === 'up'", timeout=30_000
    )
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    killed = time.monotonic()
    page.wait_for_function(
        f"() => document.querySelector('tr[data-pid=\"{proc.pid}\"]')?.dataset.state === 'down'",
        timeout=15_000,
    )
    took = time.monotonic() - killed
    assert _fleet_state(page, proc.pid) == "down"
    assert "down" in page.inner_text("#status")
    print(f"shown down {took:.1f}s after SIGKILL")


def test_the_drift_warning_shows_where_measured_figures_contradict_the_declaration(
    page: Any, dashboard: DashboardServer, foundry_env: dict[str, str]
) -> None:
    from foundry.observe import names
    from foundry.observe.fleet import Beacon
    from foundry.observe.metrics import Registry

    # Given a process of the fleet that measured 25 runs of `sign` (declared est=2ms) at
    # a median of 500 ms, and 25 of `resize` (declared est=20ms) at 20 ms
    registry = Registry()
    durations = registry.histogram(names.UNIT_DURATION, "seconds per unit", ("unit", "model"))
    for _ in range(25):
        durations.labels("sign", "direct/sequential").observe(0.5)
        durations.labels("resize", "queue/sequential").observe(0.02)
    beacon = Beacon(
        foundry_env["FOUNDRY_FLEET"], role="queue-worker", app="shop", registry=registry, interval=0.5
    ).start()
    try:
        # When the plan is open, then `sign` carries the engine's reclassification ...
        _open(page, dashboard, "plan")
        warning = page.wait_for_selector('tr[data-unit="sign"] [data-testid="drift"]', timeout=20_000)
        text = warning.inner_text()
        assert "declared est=2ms but the median of 25 runs measured 500ms" in text
        assert "reclassify this phase: direct/processes" in text
        assert "not direct/sequential" in text
        # ... and `resize`, whose figures agree with its declaration, carries none
        assert page.query_selector('tr[data-unit="resize"] [data-testid="drift"]') is None
        assert page.errors == []
    finally:
        beacon.stop()


def test_markup_in_a_job_argument_renders_as_text(
    page: Any, dashboard: DashboardServer, shop: ModuleType
) -> None:
    handle = shop.app.units["resize"].submit(XSS)  # nobody runs it: it stays queued
    _open(page, dashboard, "jobs")
    cell = f'tr[data-job-id="{handle.id}"] td[data-testid="args"]'
    page.wait_for_selector(cell)
    assert "<script>window.__xss=1</script>" in page.inner_text(cell)
    assert page.query_selector(f'tr[data-job-id="{handle.id}"] img') is None
    page.goto(f"{dashboard.url}/#/job/{handle.id}")
    page.wait_for_selector('pre[data-testid="job-args"]')
    assert XSS.replace('"', '\\"') in page.inner_text('pre[data-testid="job-args"]')
    assert page.query_selector("main script, main img") is None
    assert page.evaluate("() => window.__xss") is None
    assert page.errors == []


def test_screenshot_of_the_dashboard(
    page: Any, dashboard: DashboardServer, shop: ModuleType, workers: Workers, tmp_path: Path
) -> None:
    """A picture with live data for the README (and a check that the page renders it)."""
    early = workers.start("tests.dashboard.dashboard_app:old")
    dead = shop.thumbnail.submit("logo.svg")
    wait_for(lambda: _job_status(dashboard, dead.id) == "dead", what="a dead letter")
    early.send_signal(signal.SIGTERM)
    early.wait(timeout=20)
    proc = workers.start()
    wait_for(lambda: _fleet_up(dashboard, proc.pid), what="the worker's first heartbeat")
    for round_ in range(3):
        for h in [shop.app.units["resize"].submit(f"photo-{round_}-{i}.jpg") for i in range(40)]:
            h.result(timeout=60)
    _open(page, dashboard, "plan")
    page.wait_for_selector('tr[data-unit="resize"] .chip[data-state="ok"]', timeout=20_000)
    page.wait_for_selector('tr[data-unit="thumbnail"] .chip[data-state="over"]', timeout=20_000)
    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=False)
    assert shot.stat().st_size > 10_000
    target = os.environ.get("FOUNDRY_DASHBOARD_SCREENSHOT")
    if target:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target)


def test_a_workflow_is_signalled_and_a_stream_group_replayed_from_the_page(
    page: Any, dashboard: DashboardServer, foundry_env: dict[str, str]
) -> None:
    from foundry.backends.journal import open_journal
    from foundry.backends.journal.base import Entry, NewWorkflow
    from foundry.backends.stream import NewEvent, Start, StreamConfig, open_stream_backend

    journal = open_journal(foundry_env["FOUNDRY_JOURNAL"])
    log = open_stream_backend(foundry_env["FOUNDRY_STREAM"])
    try:
        started = journal.start(NewWorkflow("wf-7", "checkout", b'{"args":["o-1"],"kwargs":{}}'), owner="w")
        token = started.claim.token  # type: ignore[union-attr]
        now = journal.clock.time()
        journal.record("wf-7", token, Entry(0, "step", "reserve", "ok", b'"r-1"', None, 1, now, now + 0.2))
        journal.record(
            "wf-7", token, Entry(1, "signal", "approve", "waiting", wake_at=float("inf"), started_at=now)
        )
        journal.publish("wf-7", token, b'{"stage": "awaiting approval"}')
        journal.start(NewWorkflow("wf-7/2", "ship", b"{}", parent_id="wf-7", parent_position=2))
        journal.suspend("wf-7", token, wake_at=float("inf"), seen_wakeups=0, current_step="approve")
        log.ensure_stream(StreamConfig("signaling", partitions=2))
        log.create_group("signaling", "billing", Start.end())
        log.append("signaling", [NewEvent(f"e{i}", b"{}", f"s{i}") for i in range(12)])
        log.seek("signaling", "billing", Start.end())

        # the run's history, then a signal typed into the page
        _open(page, dashboard, "workflows")
        page.click('tr[data-workflow-id="wf-7"] a')
        page.wait_for_selector('table[data-testid="history"] tr[data-position="0"]')
        assert "reserve" in page.inner_text('table[data-testid="history"]')
        assert "awaiting approval" in page.inner_text('[data-testid="published"]')
        assert "wf-7/2" in page.inner_text('[data-testid="children"]')  # its child, in the tree
        page.fill('[data-testid="signal-name"]', "approve")
        page.fill('[data-testid="signal-payload"]', '{"by": "<b>ann</b>"}')
        page.wait_for_timeout(1500)  # a poll re-renders the view: what was typed must survive it
        page.click('button[data-action="signal"]')
        page.wait_for_selector('table[data-testid="inbox"]:has-text("approve")', timeout=15_000)
        assert '"<b>ann</b>"' in page.inner_text('table[data-testid="inbox"]')
        assert journal.signals("wf-7")[0].name == "approve"

        # a consumer group moved back to the beginning from the page
        _open(page, dashboard, "streams")
        page.wait_for_selector('table[data-group="billing"]')
        page.once("dialog", lambda dialog: dialog.accept())
        page.select_option('select[data-testid="replay-from"]', "beginning")
        page.wait_for_timeout(1500)  # a poll re-renders the view: the choice must survive it
        page.click('button[data-action="replay"]')
        page.wait_for_selector('[data-testid="toast"]:has-text("moved to")', timeout=15_000)
        assert sum(p.lag for p in log.lag("signaling", "billing")) == 12
        assert page.errors == []
    finally:
        journal.close()
        log.close()
