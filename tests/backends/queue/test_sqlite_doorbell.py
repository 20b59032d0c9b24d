"""The embedded queue's cross-process doorbell (Linux): a commit in one process wakes a
waiter in another at once, not at its next poll; dead listeners are forgotten."""

from __future__ import annotations

import multiprocessing
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from foundry.backends._doorbell import Doorbell, supported
from foundry.backends.queue import open_queue_backend
from foundry.backends.queue.base import NewJob
from foundry.backends.queue.sqlite import SqliteQueue

pytestmark = pytest.mark.skipif(not supported(), reason="the doorbell uses Linux abstract sockets")


def _enqueue_later(url: str, queue: str, delay: float) -> None:
    time.sleep(delay)
    backend = open_queue_backend(url)
    try:
        backend.enqueue(NewJob(id=f"j-{os.getpid()}", queue=queue, unit="u", payload=b"{}"))
    finally:
        backend.close()


def test_a_ring_reaches_a_listener_in_another_process(tmp_path: Path) -> None:
    db = str(tmp_path / "q.db")
    listener = Doorbell(db)
    sock = listener.listen()
    assert sock is not None
    assert len(os.listdir(db + "-wake")) == 1
    code = f"from foundry.backends._doorbell import Doorbell; Doorbell({db!r}).ring()"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert select.select([sock], [], [], 10)[0], "no ring arrived"
    listener.drain()
    assert not select.select([sock], [], [], 0)[0]  # drained
    listener.stop_listening()
    assert os.listdir(db + "-wake") == []


def test_a_dead_listeners_marker_is_removed_by_the_next_ring(tmp_path: Path) -> None:
    db = str(tmp_path / "q.db")
    code = (
        "import time; from foundry.backends._doorbell import Doorbell; "
        f"assert Doorbell({db!r}).listen() is not None; print('up', flush=True); time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"up"
        assert len(os.listdir(db + "-wake")) == 1
        child.send_signal(signal.SIGKILL)  # no chance to remove its marker
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if child.stdout is not None:
            child.stdout.close()
    ringer = Doorbell(db)
    ringer.ring()  # refused: the listener is gone, so is its marker
    assert os.listdir(db + "-wake") == []
    ringer.ring()  # and nothing to ring now
    ringer.close()


def test_a_ring_with_nobody_listening_is_harmless(tmp_path: Path) -> None:
    bell = Doorbell(str(tmp_path / "q.db"))
    bell.ring()  # no directory yet
    os.makedirs(bell.dir)
    bell.ring()  # an empty directory
    bell.close()


def test_a_waiter_wakes_on_another_process_commit_not_on_its_poll(tmp_path: Path) -> None:
    # The poll is 60 s and the wait 30 s: only the bell can wake the waiter in time.
    url = f"sqlite:///{tmp_path / 'q.db'}?poll=60"
    backend = open_queue_backend(url)
    assert isinstance(backend, SqliteQueue)
    other = multiprocessing.get_context("spawn").Process(target=_enqueue_later, args=(url, "bells", 0.5))
    try:
        with backend._watch():  # what a claim or a result wait holds while it sleeps
            since = backend.signals.gen("queue:bells")
            other.start()
            woken = backend.signals.wait("queue:bells", since, 30)
    finally:
        other.join(60)
        backend.close()
    assert other.exitcode == 0
    assert woken, "the other process's commit did not wake this one"
    assert backend_jobs(url) == [f"j-{other.pid}"]


def backend_jobs(url: str) -> list[str]:
    backend = open_queue_backend(url)
    try:
        return [c.id for c in backend.claim("bells", "w", lease=30, limit=10, timeout=1)]
    finally:
        backend.close()
