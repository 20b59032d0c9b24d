"""The dashboard API over real engines: jobs on every queue engine (list, filter, show,
retry, cancel, purge), workflows (history, timers, inbox, signal, cancel), streams (lag,
owners, dead letters, replay), and the cache that keeps N tabs from multiplying engine
queries."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from foundry.backends.journal import open_journal
from foundry.backends.journal.base import Entry, NewWorkflow, WorkflowStatus
from foundry.backends.queue import JobStatus, NewJob, open_queue_backend
from foundry.backends.stream import NewEvent, Start, StreamConfig, open_stream_backend
from foundry.config import load_settings
from foundry.observe.dashboard.api import Api
from foundry.observe.dashboard.live import Live
from foundry.observe.dashboard.sources import Sources
from foundry.observe.fleet import Beacon
from tests.backends.queue.engines import ENGINES, close, engine_url


def _get(api: Api, path: str, **query: Any) -> Any:
    status, body = api.handle("GET", path, {k: [str(v)] for k, v in query.items()}, None)
    assert status == 200, body
    return json.loads(json.dumps(body))  # what the page receives


def _post(api: Api, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    return api.handle("POST", path, {}, body or {})


def _job(unit: str, payload: Any, queue: str = "q", **kw: Any) -> NewJob:
    data = json.dumps({"args": [payload], "kwargs": {}}).encode()
    return NewJob(id=uuid.uuid4().hex, queue=queue, unit=unit, payload=data, **kw)


@pytest.fixture
def sources(tmp_path: Path) -> Iterator[Any]:
    made: list[Sources] = []

    def make(**urls: str) -> Sources:
        settings = load_settings(home=tmp_path / ".foundry")
        urls.setdefault("fleet", (tmp_path / "fleet").as_uri())
        s = Sources(None, settings=settings, **urls)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


# -- jobs, on every queue engine -----------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_jobs_list_show_retry_cancel_and_purge_on_every_engine(
    engine: str, tmp_path: Path, sources: Any
) -> None:
    url = engine_url(engine, tmp_path)
    backend = open_queue_backend(url)
    try:
        # Given: two queued jobs, one dead-lettered with a traceback, one running
        queued = [_job("resize", f"a{i}") for i in range(2)]
        dead, running = _job("thumbnail", "<b>x</b>", priority=9), _job("resize", "busy", priority=9)
        backend.enqueue_many([*queued, dead])
        [c] = backend.claim("q", "w1", lease=30, limit=1, timeout=10)
        assert c.id == dead.id
        error = json.dumps(
            {"type": "builtins.ValueError", "message": "boom", "traceback": "Traceback...\nValueError: boom"}
        )
        assert backend.fail(c.id, c.token, error.encode(), dead_reason="poison: it keeps failing")
        backend.enqueue(running)
        [held] = backend.claim("q", "w2", lease=30, limit=1, timeout=10)  # (a broker may pick another)
        waiting = [j.id for j in (*queued, running) if j.id != held.id]
        api = Api(sources(queue=url))

        # list and filter
        listed = _get(api, "/api/jobs")
        ids = {j["id"] for j in listed["jobs"]}
        assert {dead.id, held.id, *waiting} == ids
        only_dead = _get(api, "/api/jobs", status="dead")["jobs"]
        assert [j["id"] for j in only_dead] == [dead.id]
        assert only_dead[0]["dead_reason"] == "poison: it keeps failing"
        assert {j["unit"] for j in _get(api, "/api/jobs", unit="thumbnail")["jobs"]} == {"thumbnail"}
        assert _get(api, "/api/jobs", since=time.time() + 60)["jobs"] == []

        # one job: arguments as text, the traceback, what it can do
        detail = _get(api, f"/api/jobs/{dead.id}")
        assert "<b>x</b>" in detail["args"]
        assert detail["error"]["traceback"].endswith("ValueError: boom")
        assert detail["can_retry"]
        assert not detail["can_cancel"]

        # cancel a running job: a request its worker acts on, shown on the job until it ends
        running_detail = _get(api, f"/api/jobs/{held.id}")
        assert running_detail["can_cancel"]
        assert "a cancel asks its worker to stop it" in running_detail["cancel_note"]
        status, body = _post(api, f"/api/jobs/{held.id}/cancel")
        assert status == 200, body
        assert "cancel requested" in body["message"]
        asked = _get(api, f"/api/jobs/{held.id}")
        assert asked["status"] == "running"
        assert asked["cancel_requested_at"] is not None
        assert "waiting for its worker" in asked["cancel_note"]
        assert "cancel requested" in [e["what"] for e in asked["timeline"]]
        assert backend.cancel_requests([held.id], timeout=5) == [held.id]  # what its worker hears
        assert backend.fail(held.id, held.token, b"{}", retry_at=time.time())  # its worker stopped it
        assert backend.get(held.id).status is JobStatus.CANCELLED  # type: ignore[union-attr]
        # ... a queued one at once; a finished one is refused, saying so
        status, body = _post(api, f"/api/jobs/{waiting[0]}/cancel")
        assert status == 200, body
        assert backend.get(waiting[0]).status is JobStatus.CANCELLED  # type: ignore[union-attr]
        status, body = _post(api, f"/api/jobs/{held.id}/cancel")
        assert status == 200  # cancelled already: it will not run
        status, body = _post(api, f"/api/jobs/{dead.id}/cancel")
        assert status == 409
        assert "already finished (dead)" in body["error"]
        assert _post(api, "/api/jobs/nope/cancel")[0] == 409

        # retry the dead letter: back in its queue with fresh counters
        status, body = _post(api, f"/api/jobs/{dead.id}/retry")
        assert status == 200, body
        assert backend.get(dead.id).status is JobStatus.QUEUED  # type: ignore[union-attr]
        status, body = _post(api, f"/api/jobs/{dead.id}/retry")
        assert status == 409
        assert "only dead or failed" in body["error"]
        assert _post(api, "/api/jobs/nope/retry")[0] == 409

        # purge the waiting jobs of the queue (typed confirmation), then expired records
        assert _post(api, "/api/queues/q/purge", {"what": "queued"})[0] == 400  # no confirmation
        status, body = _post(api, "/api/queues/q/purge", {"what": "queued", "confirm": "q"})
        assert status == 200, body
        left = list(backend.jobs(queue="q", status="queued"))  # type: ignore[attr-defined]
        assert left == []
        assert backend.get(dead.id).status is JobStatus.CANCELLED  # type: ignore[union-attr]
        status, body = _post(api, "/api/queues/q/purge", {"what": "expired"})
        assert status == 200
        assert "deleted" in body["message"]
    finally:
        close(backend, url)


# -- workflows -----------------------------------------------------------------------------


def test_workflow_history_timers_inbox_signal_and_cancel(tmp_path: Path, sources: Any) -> None:
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    journal = open_journal(url)
    try:
        started = journal.start(NewWorkflow("wf-1", "provision", b'{"args":["vm"],"kwargs":{}}'), owner="me")
        token = started.claim.token  # type: ignore[union-attr]
        now = journal.clock.time()
        journal.record("wf-1", token, Entry(0, "step", "validate", "ok", b'"ok"', None, 1, now, now + 0.05))
        err = json.dumps({"type": "x.Boom", "message": "<script>no</script>", "traceback": "tb"}).encode()
        journal.record(
            "wf-1", token, Entry(1, "step", "health", "waiting", None, err, 2, now, None, now + 300)
        )
        journal.suspend(
            "wf-1", token, wake_at=now + 300, seen_wakeups=started.state.wakeups, current_step="health"
        )
        api = Api(sources(journal=url))

        rows = _get(api, "/api/workflows", status="waiting")["workflows"]
        assert [r["id"] for r in rows] == ["wf-1"]
        assert _get(api, "/api/workflows", name="other")["workflows"] == []
        detail = _get(api, "/api/workflows/wf-1")
        assert [e["name"] for e in detail["history"]] == ["validate", "health"]
        assert detail["history"][0]["took"] == pytest.approx(0.05)
        assert detail["history"][1]["error"]["message"] == "<script>no</script>"
        assert detail["timers"][0]["wake_at"] == pytest.approx(now + 300)

        status, body = _post(api, "/api/workflows/wf-1/signal", {"name": "approve", "payload": {"by": "ann"}})
        assert status == 200, body
        assert _get(api, "/api/workflows/wf-1")["inbox"][0]["name"] == "approve"
        assert _post(api, "/api/workflows/wf-1/signal", {"name": ""})[0] == 409
        status, body = _post(api, "/api/workflows/wf-1/cancel")
        assert status == 200, body
        assert journal.get("wf-1").cancel_requested  # type: ignore[union-attr]
        assert _post(api, "/api/workflows/missing/cancel")[0] == 409
        assert api.handle("GET", "/api/workflows/missing", {}, None)[0] == 409
    finally:
        journal.close()


def test_workflow_view_shows_timed_out_published_state_and_the_child_tree(
    tmp_path: Path, sources: Any
) -> None:
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    journal = open_journal(url)
    try:
        parent = journal.start(NewWorkflow("p", "provision", b"{}", timeout=60.0), owner="me").claim
        assert parent is not None
        journal.publish("p", parent.token, b'{"progress": 2}')
        journal.start(NewWorkflow("p/0", "child", b"{}", parent_id="p", parent_position=0))
        journal.start(NewWorkflow("p/0/1", "grandchild", b"{}", parent_id="p/0", parent_position=1))
        journal.finish("p", parent.token, WorkflowStatus.TIMED_OUT, error=b'{"type": "x", "message": "late"}')
        api = Api(sources(journal=url))
        assert [r["id"] for r in _get(api, "/api/workflows", status="timed_out")["workflows"]] == ["p"]
        assert "timed_out" in _get(api, "/api/meta")["workflow_statuses"]
        detail = _get(api, "/api/workflows/p")
        assert detail["status"] == "timed_out"
        assert detail["deadline"] == pytest.approx(detail["created_at"] + 60)
        assert '"progress": 2' in detail["published"]
        [child] = detail["tree"]
        assert (child["id"], [g["id"] for g in child["children"]]) == ("p/0", ["p/0/1"])
    finally:
        journal.close()


# -- streams -------------------------------------------------------------------------------


def test_streams_lag_owners_dead_letters_and_replay(tmp_path: Path, sources: Any) -> None:
    url = f"sqlite:///{tmp_path / 'stream.db'}"
    log = open_stream_backend(url)
    fleet = (tmp_path / "fleet").as_uri()
    try:
        log.ensure_stream(StreamConfig("orders", partitions=2))
        log.create_group("orders", "billing", Start.beginning())
        log.append("orders", [NewEvent(f"e{i}", b'{"n": %d}' % i, f"k{i % 4}") for i in range(20)])
        events = log.read("orders", "billing", 0, "c1", max=3, ack_deadline=30, timeout=1)
        log.commit("orders", "billing", 0, events[1].offset)
        log.dead_letter("orders", "billing", events[2], "handler raised 3 times", None)
        beacon = Beacon(
            fleet,
            role="stream-consumer",
            details={"streams": [{"stream": "orders", "group": "billing", "consumer": "c1", "owned": [0]}]},
        )
        beacon.beat()
        api = Api(sources(stream=url, fleet=fleet))
        [stream] = _get(api, "/api/streams")["streams"]
        [group] = stream["groups"]
        p0 = next(p for p in group["partitions"] if p["partition"] == 0)
        assert p0["committed"] == events[2].offset
        assert p0["owners"][0]["consumer"] == "c1"
        assert p0["owners"][0]["state"] == "up"
        dead = _get(api, "/api/streams/orders/dead", group="billing")["dead"]
        assert dead[0]["reason"] == "handler raised 3 times"

        lag_before = group["lag"]
        status, body = _post(api, "/api/streams/orders/groups/billing/replay", {"beginning": True})
        assert status == 200, body
        assert _get(api, "/api/streams")["streams"][0]["groups"][0]["lag"] == 20 > lag_before
        assert _post(api, "/api/streams/orders/groups/billing/replay", {"offset": -1})[0] == 409
        assert _post(api, "/api/streams/orders/groups/billing/replay", {})[0] == 409
        assert _post(api, "/api/streams/orders/groups/nobody/replay", {"end": True})[0] == 409
    finally:
        log.close()


# -- cost: the cache -----------------------------------------------------------------------


class CountingLive(Live):
    def __init__(self, sources: Sources) -> None:
        super().__init__(sources)
        self.samples = 0
        self._gate = threading.Lock()

    def sample(self) -> dict[str, Any]:
        with self._gate:
            self.samples += 1
        time.sleep(0.05)  # an engine round trip
        return super().sample()


def test_many_tabs_share_one_engine_read_per_ttl(sources: Any) -> None:
    src = sources()
    live = CountingLive(src)
    api = Api(src, ttl=1.0, live=live)
    # Given 25 tabs polling at once
    threads = [threading.Thread(target=lambda: _get(api, "/api/live")) for _ in range(25)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then the engines were read once
    assert live.samples == 1
    assert api.cache.misses == 1
    assert api.cache.hits == 24
    time.sleep(1.05)
    _get(api, "/api/live")
    assert live.samples == 2  # after the TTL, one fresh read


def test_an_unreachable_engine_is_a_message_not_a_crash(sources: Any) -> None:
    api = Api(sources(queue="redis://user:hunter2secret@127.0.0.1:1/0?socket_timeout=0.5&reconnect=0.5"))
    status, body = api.handle("GET", "/api/jobs", {}, None)
    assert status in (503, 500)
    assert "hunter2secret" not in json.dumps(body)
    live = _get(api, "/api/live")
    assert "queue" in live["errors"]
    assert "hunter2secret" not in json.dumps(live)
