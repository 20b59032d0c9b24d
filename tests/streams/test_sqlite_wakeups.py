"""The embedded stream log wakes waiting readers: an append in another process reaches a
reader at once (the doorbell), not at its next safety poll; a commit that clears a
pending window and a redelivery deadline wake it too; without the doorbell the poll
still finds everything.

Each wait has a long timeout and a long safety poll (``poll=5s``): an event that
arrives within 2 s was woken, not polled for.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from foundry.backends import _doorbell
from foundry.backends.stream import NewEvent, Start, StreamConfig, open_stream_backend
from foundry.backends.stream.sqlite import SqliteStreamBackend
from foundry.errors import ConfigError

WOKEN = 2.0  # well under the 5 s safety poll

# Appends one event once the reader listens (its marker file is there) and has had a
# moment to start waiting, then prints the wall time of the commit.
_APPEND = """
import os, sys, time
from foundry.backends.stream import NewEvent, open_stream_backend
url, wake, patience = sys.argv[1], sys.argv[2], float(sys.argv[3])
deadline = time.monotonic() + patience
while time.monotonic() < deadline and not (os.path.isdir(wake) and os.listdir(wake)):
    time.sleep(0.01)
time.sleep(0.3)
b = open_stream_backend(url)
b.append("s", [NewEvent("x1", b'{"n": 1}')])
print(time.time(), flush=True)
b.close()
"""


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "stream.db"


def _open(db: Path, poll: str) -> SqliteStreamBackend:
    backend = open_stream_backend(f"sqlite:///{db}?poll={poll}")
    assert isinstance(backend, SqliteStreamBackend)
    backend.ensure_stream(StreamConfig("s"))
    backend.create_group("s", "g", Start.beginning())
    return backend


def _append_elsewhere(db: Path, poll: str, patience: float = 20.0) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _APPEND, f"sqlite:///{db}?poll={poll}", f"{db.resolve()}-wake", str(patience)],
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.skipif(not _doorbell.supported(), reason="the doorbell uses Linux abstract sockets")
def test_an_append_in_another_process_wakes_a_waiting_reader_at_once(db: Path) -> None:
    # Given a reader here, waiting with a 5 s safety poll
    backend = _open(db, "5s")
    try:
        publisher = _append_elsewhere(db, "5s")
        # When another process appends while it waits
        got = backend.read("s", "g", 0, "c1", max=10, ack_deadline=30.0, timeout=30.0)
        woke = time.time()
        out, _ = publisher.communicate(timeout=60)
        assert publisher.returncode == 0
        # Then the event arrives at once, not at the next poll
        assert [e.id for e in got] == ["x1"]
        assert woke - float(out.split()[-1]) < WOKEN
    finally:
        backend.close()


def test_without_the_doorbell_the_poll_still_finds_an_append(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a system without the doorbell (no listener, no marker file)
    monkeypatch.setattr(_doorbell, "supported", lambda: False)
    backend = _open(db, "50ms")
    try:
        assert not backend._wake.cross_process
        publisher = _append_elsewhere(db, "50ms", patience=0.0)  # no marker to wait for
        # When another process appends, Then the reader's poll finds it
        got = backend.read("s", "g", 0, "c1", max=10, ack_deadline=30.0, timeout=60.0)
        publisher.communicate(timeout=60)
        assert [e.id for e in got] == ["x1"]
        assert not (db.parent / "stream.db-wake").exists()
    finally:
        backend.close()


def test_a_commit_that_clears_the_pending_window_wakes_a_waiting_reader(db: Path) -> None:
    # Given events 1..2 delivered to c1 (pending) and event 3 appended after them
    backend = _open(db, "5s")
    try:
        backend.append("s", [NewEvent("a", b"1"), NewEvent("b", b"2")])
        first = backend.read("s", "g", 0, "c1", max=2, ack_deadline=60.0, timeout=0)
        backend.append("s", [NewEvent("c", b"3")])
        got: list[str] = []
        reader = threading.Thread(
            target=lambda: got.extend(
                e.id for e in backend.read("s", "g", 0, "c2", max=10, ack_deadline=60.0, timeout=30.0)
            )
        )
        reader.start()
        # When c1 commits its batch (the pending window clears)
        time.sleep(0.2)
        started = time.monotonic()
        backend.commit("s", "g", 0, first[-1].offset)
        reader.join(30.0)
        # Then the waiting reader gets event 3 at once
        assert got == ["c"]
        assert time.monotonic() - started < WOKEN
    finally:
        backend.close()


def test_a_redelivery_comes_at_its_deadline_not_at_the_next_poll(db: Path) -> None:
    backend = _open(db, "5s")
    try:
        backend.append("s", [NewEvent("a", b"1")])
        backend.read("s", "g", 0, "c1", max=1, ack_deadline=0.3, timeout=0)
        started = time.monotonic()
        again = backend.read("s", "g", 0, "c2", max=1, ack_deadline=30.0, timeout=30.0)
        assert [(e.id, e.deliveries) for e in again] == [("a", 2)]
        assert time.monotonic() - started < WOKEN
    finally:
        backend.close()


@pytest.mark.parametrize("poll", ["0", "-1s", "soon"])
def test_a_bad_poll_is_a_config_error_naming_it(tmp_path: Path, poll: str) -> None:
    with pytest.raises(ConfigError, match="poll="):
        open_stream_backend(f"sqlite:///{tmp_path}/s.db?poll={poll}")
