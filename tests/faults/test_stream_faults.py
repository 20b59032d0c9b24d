"""Event streams under real faults: a consumer process killed with SIGKILL mid-batch, and
the NATS server restarted mid-run. Then count: nothing lost, per-key order intact,
duplicates only inside the uncommitted window (and absorbed by the idempotent handler).
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from foundry import Foundry
from foundry.backends.stream import open_stream_backend
from foundry.deliver.stream import StreamEvent
from foundry.errors import BackendUnavailableError
from tests.private_servers import PrivateServer, private_server
from tests.streams.conftest import ENGINES, engine_url, unique

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
EVENTS = 160
KEYS = 12
BATCH, PARTITIONS = 20, 2  # as in _stream_consumer.py


def _count(db: Path, sql: str) -> int:
    if not db.exists():
        return 0
    conn = sqlite3.connect(db, timeout=30)
    try:
        return int(conn.execute(sql).fetchone()[0])
    except sqlite3.OperationalError:
        return 0  # the tables are not there yet
    finally:
        conn.close()


def _wait_for(what: str, check: object, timeout: float) -> None:
    until = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > until:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _consumer(env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A consumer process; its log goes to FAULT_LOG so a failure can show it."""
    with open(env["FAULT_LOG"], "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "foundry.cli", "streams", "consume", str(HERE / "_stream_consumer.py")],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=log,
        )


def _log_tail(env: dict[str, str], lines: int = 40) -> str:
    path = Path(env["FAULT_LOG"])
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


@pytest.fixture(params=ENGINES)
def fault_env(
    request: pytest.FixtureRequest, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    url = engine_url(str(request.param), tmp_path_factory)
    name = unique("fault")
    env = {
        **os.environ,
        "FAULT_URL": url,
        "FAULT_STREAM": name,
        "FAULT_HOME": str(tmp_path / "home"),
        "FAULT_DB": str(tmp_path / "effects.db"),
        "FAULT_LOG": str(tmp_path / "consumers.log"),
        "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}",
    }
    yield env
    backend = open_stream_backend(url)
    try:
        backend.delete_stream(name)
    finally:
        backend.close()


@pytest.mark.slow
def test_consumer_killed_mid_batch_resumes_from_its_committed_position(fault_env: dict[str, str]) -> None:
    db = Path(fault_env["FAULT_DB"])
    # Given 160 events over 12 keys, published before any consumer runs ...
    app = Foundry("publisher", stream=fault_env["FAULT_URL"], home=fault_env["FAULT_HOME"])
    stream = app.stream(fault_env["FAULT_STREAM"], key="k", partitions=PARTITIONS)
    stream.publish_many(
        [{"k": f"key-{i % KEYS}", "n": i} for i in range(EVENTS)], ids=[f"e{i}" for i in range(EVENTS)]
    )
    app.close()

    # ... when a consumer process is killed with SIGKILL in the middle of its work ...
    first = _consumer(fault_env)
    try:
        _wait_for(
            "the first consumer to handle 40 events",
            lambda: _count(db, "SELECT count(*) FROM effects") >= 40,
            60,
        )
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
    assert first.returncode == -signal.SIGKILL
    at_kill = _count(db, "SELECT count(*) FROM effects")
    assert at_kill < EVENTS

    # ... a new consumer takes the partitions over (after the lease and the ack deadline).
    second = _consumer(fault_env)
    try:
        _wait_for(
            # Seconds when the machine is quiet; generous for a loaded 2-core CI box.
            "every event to be handled",
            lambda: _count(db, "SELECT count(*) FROM effects") >= EVENTS,
            90,
        )
    finally:
        second.send_signal(signal.SIGTERM)
        try:
            second.wait(20)
        except subprocess.TimeoutExpired:
            second.kill()
            second.wait(10)

    conn = sqlite3.connect(db)
    try:
        effects = conn.execute("SELECT k, n FROM effects ORDER BY seq").fetchall()
        calls = conn.execute("SELECT n, count(*) FROM calls GROUP BY n").fetchall()
    finally:
        conn.close()
    # Then nothing is lost and nothing applied twice ...
    assert sorted(n for _, n in effects) == list(range(EVENTS))
    # ... each key's events took effect in publish order ...
    per_key: dict[str, list[int]] = collections.defaultdict(list)
    for key, n in effects:
        per_key[key].append(n)
    for key, ns in per_key.items():
        assert ns == sorted(ns), f"{key} out of order: {ns}"
    # ... and the only events handled twice are those of the uncommitted window at the kill.
    duplicated = [n for n, times in calls if times > 1]
    assert all(times <= 2 for _, times in calls)
    assert len(duplicated) <= BATCH * PARTITIONS
    print(f"killed after {at_kill} effects; {len(duplicated)} events handled twice, absorbed")
    backend = open_stream_backend(fault_env["FAULT_URL"])
    try:
        # ... and the server agrees: every partition's committed position is at its end.
        until = time.monotonic() + 15
        while (lag := backend.lag(fault_env["FAULT_STREAM"], "g")) and sum(p.lag for p in lag) > 0:
            assert time.monotonic() < until, (
                f"the committed position did not reach the end: {lag}\n{_log_tail(fault_env)}"
            )
            time.sleep(0.05)
        assert backend.dead_letters(fault_env["FAULT_STREAM"], "g") == []
    finally:
        backend.close()


# -- the NATS server restarted mid-run (a private instance: never the shared one) ----


@pytest.fixture
def private_nats() -> Iterator[PrivateServer]:
    """A private ``nats-server -js`` on a free port with its own store directory."""
    with private_server("nats") as server:
        yield server


@pytest.mark.slow
@pytest.mark.parametrize("awaited", [False, True], ids=["publish", "apublish"])
def test_nats_server_restarted_mid_run_loses_nothing(
    tmp_path: Path, private_nats: PrivateServer, awaited: bool
) -> None:
    url = private_nats.url
    app = Foundry("restart", stream=url, home=tmp_path)
    stream = app.stream(unique("restart"), key="k", partitions=2)
    handled: dict[str, list[int]] = collections.defaultdict(list)
    seen: set[str] = set()
    lock = threading.Lock()

    @stream.consumer(group="g", batch=10, ack_deadline="2s", session="2s")
    def handle(event: StreamEvent) -> None:
        with lock:
            if event.id not in seen:  # idempotent: a redelivery after the restart changes nothing
                seen.add(event.id)
                handled[event["k"]].append(event["n"])

    published: list[str] = []
    total = 300

    def publish() -> None:
        for i in range(total):
            event_id = f"e{i}"
            until = time.monotonic() + 60
            while True:
                try:
                    stream.publish({"k": f"key-{i % 7}", "n": i}, id=event_id)
                    break
                except BackendUnavailableError:
                    if time.monotonic() > until:
                        raise
                    time.sleep(0.1)  # the same id again: dedup keeps it once
            published.append(event_id)
            time.sleep(0.002)

    async def apublish() -> None:  # on this thread's own loop: its own connection rides the restart
        for i in range(total):
            event_id = f"e{i}"
            until = time.monotonic() + 60
            while True:
                try:
                    await stream.apublish({"k": f"key-{i % 7}", "n": i}, id=event_id)
                    break
                except BackendUnavailableError:
                    if time.monotonic() > until:
                        raise
                    await asyncio.sleep(0.1)
            published.append(event_id)
            await asyncio.sleep(0.002)

    consumers = stream.run()
    publisher = threading.Thread(
        target=(lambda: asyncio.run(apublish())) if awaited else publish, daemon=True
    )
    try:
        publisher.start()
        _wait_for("a third of the events", lambda: len(seen) >= total // 3, 60)
        # When the server goes away mid-run (its process exits, every connection drops)
        # and comes back on the same port with the same JetStream store ...
        before, sent = len(seen), len(published)
        outage = private_nats.restart(down=0.5)
        assert before < total, "every event was handled before the restart: it tested nothing"
        publisher.join(90)
        assert not publisher.is_alive()
        # ... then every published event is handled once (idempotently), in order per key.
        _wait_for("every event to be handled", lambda: len(seen) >= total, 90)
    finally:
        consumers.stop()
        app.close()  # the private server and its store go with the fixture
    print(f"nats restart: {before} handled and {sent} published before, down {outage:.1f}s")
    assert seen == set(published)
    assert sorted(n for ns in handled.values() for n in ns) == list(range(total))
    for key, ns in handled.items():
        assert ns == sorted(ns), f"{key} out of order: {ns}"
