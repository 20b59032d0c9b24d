"""The fleet: heartbeats into every store (a directory, Redis, PostgreSQL), liveness
from the last beat, hostile records skipped, and a heartbeat that never queries a
database in the worker."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from foundry.errors import BackendUnavailableError, ConfigError
from foundry.observe import names
from foundry.observe.fleet import (
    MAX_RECORD,
    Beacon,
    Member,
    fleet_url,
    liveness,
    open_fleet,
    parse_member,
)
from foundry.observe.metrics import Registry
from tests.services import require

STORES = ["file", "redis", "postgres"]


def _member(**changes: Any) -> Member:
    base: dict[str, Any] = {
        "id": "h-1-aa",
        "role": "queue-worker",
        "app": "shop",
        "host": "elsewhere",
        "pid": 4242,
        "started_at": 1000.0,
        "beat_at": 2000.0,
        "interval": 1.0,
        "status": "running",
    }
    base.update(changes)
    return Member(**base)


# -- liveness --------------------------------------------------------------------------


def test_a_member_is_up_while_it_beats_and_down_three_intervals_after() -> None:
    m = _member()
    assert liveness(m, 2000.5)[0] == "up"
    assert liveness(m, 2002.9)[0] == "up"
    state, why = liveness(m, 2003.1)
    assert state == "down"
    assert "no report for 3.1s" in why
    slow = _member(interval=5.0)
    assert liveness(slow, 2014.0)[0] == "up"  # three of its own intervals
    assert liveness(slow, 2016.0)[0] == "down"


def test_on_this_host_a_gone_pid_is_down_at_once() -> None:
    m = _member(host="here")
    assert liveness(m, 2000.1, this_host="here", pid_alive=lambda pid: False)[0] == "down"
    assert liveness(m, 2000.1, this_host="here", pid_alive=lambda pid: True)[0] == "up"
    assert liveness(m, 2000.1, this_host="there", pid_alive=lambda pid: False)[0] == "up"  # not ours to check


def test_a_clean_exit_is_stopped_not_down() -> None:
    assert liveness(_member(status="stopped"), 9999.0) == ("stopped", "exited cleanly")


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        b'{"v": 2, "id": "x"}',
        json.dumps(
            {
                "v": 1,
                "id": "",
                "role": "r",
                "host": "h",
                "pid": 1,
                "started_at": 1,
                "beat_at": 1,
                "interval": 1,
            }
        ),
        json.dumps(
            {
                "v": 1,
                "id": "x",
                "role": "r",
                "host": "h",
                "pid": "1",
                "started_at": 1,
                "beat_at": 1,
                "interval": 1,
            }
        ),
        json.dumps(
            {
                "v": 1,
                "id": "x",
                "role": "r",
                "host": "h",
                "pid": 1,
                "started_at": 1,
                "beat_at": True,
                "interval": 1,
            }
        ),
        json.dumps(
            {
                "v": 1,
                "id": "x",
                "role": "r",
                "host": "h",
                "pid": 1,
                "started_at": 1,
                "beat_at": 1,
                "interval": 1,
                "metrics": [],
            }
        ),
        b'{"v": 1, "pad": "' + b"x" * MAX_RECORD + b'"}',
    ],
)
def test_malformed_or_oversized_records_are_skipped(raw: bytes | str) -> None:
    assert parse_member(raw) is None


# -- stores ------------------------------------------------------------------------------


@pytest.fixture(params=STORES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    tag = uuid.uuid4().hex[:10]
    if request.param == "file":
        yield (tmp_path / "fleet").as_uri()
        return
    if request.param == "redis":
        base = require("redis")
        url = f"{base}?prefix=fleet{tag}"
        yield url
        import redis

        client = redis.Redis.from_url(base)
        for key in client.scan_iter(match=f"fleet{tag}:*"):
            client.delete(key)
        client.close()
        return
    base = require("postgres")
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA fleet_{tag}")
    yield f"{base}?schema=fleet_{tag}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA fleet_{tag} CASCADE")


def test_beats_round_trip_through_every_store_and_garbage_is_ignored(store_url: str) -> None:
    registry = Registry()
    registry.counter(names.UNIT_COMPLETED, "done", ("unit", "model")).labels("resize", "queue").inc(3)
    beacon = Beacon(
        store_url, role="queue-worker", app="shop", registry=registry, details={"queues": ["images"]}
    )
    beacon.start()
    try:
        store = open_fleet(store_url)
        try:
            _plant_garbage(store_url)
            [member] = [m for m in store.members() if m.id == beacon.id]
            assert member.pid == os.getpid()
            assert member.details == {"queues": ["images"]}
            assert member.metrics[names.UNIT_COMPLETED][0]["value"] == 3
            assert liveness(member, time.time())[0] == "up"
            assert all(m.id == beacon.id for m in store.members())  # the garbage was skipped
        finally:
            store.close()
    finally:
        beacon.stop()
    store = open_fleet(store_url)
    try:
        [member] = [m for m in store.members() if m.id == beacon.id]
        assert member.status == "stopped"
    finally:
        store.close()


def _plant_garbage(url: str) -> None:
    scheme = url.split("://")[0]
    if scheme == "file":
        folder = Path(url[len("file://") :])
        (folder / "junk.json").write_text("{not json")
        (folder / "big.json").write_bytes(b"{" + b" " * (MAX_RECORD + 10) + b"}")
    elif scheme == "redis":
        from foundry.observe.fleet import RedisFleet

        store = RedisFleet(url)
        store.client.set(f"{store.prefix}:junk", b"\x00\xff")
        store.client.zadd(store.prefix, {"junk": time.time()})
        store.close()
    else:
        from foundry.observe.fleet import PostgresFleet

        pg = PostgresFleet(url)
        pg._execute(f"INSERT INTO {pg._table} VALUES ('junk', %s, '[1, 2]')", (time.time(),))
        pg.close()


def test_a_heartbeat_reads_no_collected_gauge() -> None:
    """Collected gauges (a durable queue's depth) query the database: a beat never runs them."""
    registry = Registry()
    calls = []
    registry.collect(names.QUEUE_DEPTH, "depth", lambda: calls.append(1) or [({"queue": "q"}, 1.0)])
    registry.gauge(names.UNIT_IN_FLIGHT, "in flight", ("unit", "model")).labels("u", "queue").set(2)
    beacon = Beacon(_MemoryStore(), role="r", registry=registry)
    record = json.loads(beacon.record())
    assert calls == []
    assert names.QUEUE_DEPTH not in record["metrics"]
    assert record["metrics"][names.UNIT_IN_FLIGHT][0]["value"] == 2
    assert len(beacon.record()) < 4096


class _MemoryStore:
    url = "memory://"

    def __init__(self, fail: bool = False) -> None:
        self.records: dict[str, bytes] = {}
        self.fail = fail

    def put(self, member_id: str, beat_at: float, record: bytes) -> None:
        if self.fail:
            raise BackendUnavailableError("down")
        self.records[member_id] = record

    def members(self) -> list[Member]:
        return [m for m in (parse_member(r) for r in self.records.values()) if m is not None]

    def close(self) -> None:
        return None


def test_an_unreachable_store_never_stops_the_process() -> None:
    store = _MemoryStore(fail=True)
    beacon = Beacon(store, role="r", interval=0.05).start()
    time.sleep(0.2)
    store.fail = False
    time.sleep(0.2)
    beacon.stop()
    assert beacon.beats >= 1
    assert parse_member(store.records[beacon.id]).status == "stopped"  # type: ignore[union-attr]


def test_watchdog_reports_travel_with_the_beat() -> None:
    import logging

    beacon = Beacon(_MemoryStore(), role="r", interval=60).start()
    try:
        logging.getLogger("foundry.watchdog").warning("loop 'api' blocked ≥ 212 ms: reclassify 'charge'")
        record = json.loads(beacon.record())
        assert "reclassify 'charge'" in record["reports"][0]["message"]
    finally:
        beacon.stop()


def test_the_fleet_store_follows_the_engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from foundry.config import load_settings

    monkeypatch.delenv("FOUNDRY_FLEET", raising=False)
    home = tmp_path / ".foundry"
    assert fleet_url(load_settings(home=home)) == (home / "fleet").resolve().as_uri()
    redis_url = "redis://127.0.0.1:6379/0?prefix=shop&reconnect=5"
    assert fleet_url(load_settings(home=home, queue=redis_url)) == "redis://127.0.0.1:6379/0?prefix=shop"
    pg = "postgresql://u@db/app"
    assert fleet_url(load_settings(home=home, journal=pg)) == pg
    monkeypatch.setenv("FOUNDRY_FLEET", "file:///srv/fleet")
    assert fleet_url(load_settings(home=home, queue=redis_url)) == "file:///srv/fleet"
    with pytest.raises(ConfigError, match="scheme"):
        open_fleet("amqp://guest@host/")


@pytest.mark.parametrize(
    ("command", "role", "serves"),
    [
        (["worker", "tests.dashboard.dashboard_app:app", "-q", "-Q", "images"], "queue-worker", "queues"),
        (["pool", "serve", "tests.pool.served:app", "--unit", "square", "-q"], "pool-server", "pool"),
    ],
    ids=["worker", "pool-serve"],
)
def test_a_sigkilled_process_is_down_in_the_store_within_seconds(
    tmp_path: Path, command: list[str], role: str, serves: str
) -> None:
    """The same check the dashboard makes, from the store alone (another host's view:
    no pid check), against a real `foundry worker` / `foundry pool serve` killed with
    SIGKILL: it reported its host, pid and start time while it lived."""
    root = Path(__file__).resolve().parents[2]
    home = tmp_path / ".foundry"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)]),
        "FOUNDRY_HOME": str(home),
        "FOUNDRY_QUEUE": f"sqlite:///{home / 'queue.db'}",
        "FOUNDRY_POOL": "local://",
        "FOUNDRY_FLEET": (home / "fleet").as_uri(),
        "FOUNDRY_FLEET_INTERVAL": "0.5",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "foundry.cli", *command],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    store = open_fleet(env["FOUNDRY_FLEET"])
    try:
        deadline = time.monotonic() + 60
        while not [m for m in store.members() if m.pid == proc.pid and m.details.get(serves)]:
            assert proc.poll() is None, f"{command} exited {proc.returncode}"
            assert time.monotonic() < deadline, "the process never reported"
            time.sleep(0.1)
        [member] = [m for m in store.members() if m.pid == proc.pid]
        assert (member.role, member.host) == (role, socket.gethostname())
        assert member.started_at <= member.beat_at <= time.time()
        assert liveness(member, time.time(), this_host=member.host)[0] == "up"
        proc.kill()
        proc.wait(timeout=10)
        [member] = [m for m in store.members() if m.pid == proc.pid]
        assert member.status == "running"  # it had no chance to say goodbye
        time.sleep(2 * member.interval)
        [again] = [m for m in store.members() if m.pid == proc.pid]
        assert again.beat_at == member.beat_at  # it no longer reports ...
        assert liveness(member, member.beat_at + 3.01)[0] == "down"  # ... so ≤ 3 s after its last beat
        assert liveness(member, time.time(), this_host=member.host)[0] == "down"  # same host: at once
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        store.close()
