"""The embedded queue's cross-process doorbell (Linux): a commit in one process wakes a
waiter in another at once, not at its next poll; dead listeners are forgotten."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from foundry.backends._doorbell import Doorbell, supported
from foundry.backends.queue import open_queue_backend
from foundry.backends.queue.base import NewJob
from foundry.backends.queue.sqlite import SqliteQueue, _kind

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


def _readable(sock: socket.socket | None, wait: float = 0.0) -> bool:
    assert sock is not None
    return bool(select.select([sock], [], [], wait)[0])


def test_a_ring_for_one_reaches_one_listener_of_its_kind_and_every_unkinded_one(tmp_path: Path) -> None:
    db = str(tmp_path / "q.db")
    claimers = [Doorbell(db) for _ in range(3)]  # each Doorbell is one process's listeners
    queues = [c.listen("q") for c in claimers]
    old, results = Doorbell(db), Doorbell(db)
    everything, jobs = old.listen(), results.listen("j")  # an older version's listener is unkinded
    ringer = Doorbell(db)
    try:
        ringer.ring(b"queue:x", {"q"}, one="q")
        time.sleep(0.05)
        assert sum(_readable(s) for s in queues) == 1
        assert _readable(everything)
        assert not _readable(jobs)
        first = next(c for c, s in zip(claimers, queues, strict=True) if _readable(s))
        for c in (*claimers, old):
            c.drain()
        first.ring(b"queue:x", {"q"}, one="q")  # passed on: to the next one, never back to itself
        time.sleep(0.05)
        got = [_readable(s) for s in queues]
        assert sum(got) == 1
        assert not got[claimers.index(first)]
        for c in (*claimers, old):
            c.drain()
        ringer.ring(b"queue:x", {"q"})  # for every claimer
        time.sleep(0.05)
        assert all(_readable(s) for s in queues)
        assert not _readable(jobs)
    finally:
        for bell in (*claimers, old, results, ringer):
            bell.close()


def test_a_claim_or_a_heartbeat_rings_nobody_new_work_rings_claimers(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    backend = open_queue_backend(url)
    listener = Doorbell(str(tmp_path / "q.db"))  # another process's claimers and result waiters
    claimers, waiters = listener.listen(_kind("queue:bells")), listener.listen("j")
    try:
        backend.enqueue(NewJob(id="a", queue="bells", unit="u", payload=b"{}"))
        assert _readable(claimers, 5)
        assert not _readable(waiters)
        listener.drain()
        (job,) = backend.claim("bells", "w", lease=30, limit=10, timeout=1)
        assert backend.heartbeat(job.id, job.token, lease=30)
        assert not _readable(claimers, 0.1)
        assert not _readable(waiters)
        assert backend.complete(job.id, job.token, b"1")
        assert _readable(waiters, 5)
        assert not _readable(claimers)
    finally:
        listener.close()
        backend.close()


def test_a_process_whose_claimer_is_busy_passes_new_work_on(tmp_path: Path) -> None:
    from foundry.backends.queue.sqlite import _File

    path = str(tmp_path / "q.db")
    files = [_File(path, "NORMAL", 5.0, 60.0) for _ in range(2)]  # two "processes"
    ringer = Doorbell(path)
    try:
        with files[0].watching("queue:bells"), files[1].watching("queue:bells"):  # both listen
            assert all(f.bell is not None for f in files)
            # The ring goes to the first listener in the bell's order: make it the busy one.
            busy, idle = sorted(files, key=lambda f: f.bell._listeners[_kind("queue:bells")][1])  # type: ignore[union-attr]
            time.sleep(0.2)
            for _ in range(2):
                since = idle.signals.gen("queue:bells")
                ringer.ring(b">8\0queue:bells", {_kind("queue:bells")}, one="q")
                assert idle.signals.wait("queue:bells", since, 5), "the busy process did not pass it on"
                assert busy.signals.gen("queue:bells") != (0, 0)  # it heard it first
                time.sleep(0.01)  # past the moment it counts as coming back to claim
    finally:
        ringer.close()
        for f in files:
            f.close()


def test_a_nudge_never_waits_for_room_in_a_full_listener(tmp_path: Path) -> None:
    # A nudge is sent by a thread that may hold what the listening thread needs before it
    # can drain: a blocking send into a full queue would deadlock the two.
    bell = Doorbell(str(tmp_path / "q.db"))
    sock = bell.listen("x")
    assert sock is not None
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            for _ in range(100_000):
                s.sendto(b"!", sock.getsockname())
    nudged = threading.Thread(target=bell.nudge, daemon=True)
    nudged.start()
    nudged.join(5)
    assert not nudged.is_alive(), "nudge blocked on a full listener"
    bell.close()


def test_a_claimer_nothing_rang_for_takes_only_the_jobs_that_have_waited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # New work rings one claimer. Another, which heard nothing since its last look, leaves a
    # fresh job to that one (extra workers cost nothing while one keeps up) and takes it once
    # it has waited ``unrung_age``: nobody took it, so a backlog reaches every claimer.
    backend = open_queue_backend(f"sqlite:///{tmp_path / 'q.db'}")
    assert isinstance(backend, SqliteQueue)
    # The watcher's look for commits nobody rang for (``PRAGMA data_version``: every 0.5 s
    # with the bell, every poll where its socket is not up) sees ``quietly``'s commit and
    # wakes every waiter, as it must for another tool's commit; it would make the steps
    # below depend on when it runs. These steps are about rings: that look is held off
    # until ``monkeypatch.undo()`` below, where a claimer on the real clock must find it.
    monkeypatch.setattr(backend._file, "_foreign_commits", lambda: False)
    assert backend.unrung_age > 0
    clock = [time.time()]
    monkeypatch.setattr(backend, "_now", lambda: clock[0])

    def quietly(job_id: str, queue: str) -> None:  # committed by another process: nothing rang here
        job = NewJob(id=job_id, queue=queue, unit="u", payload=b"{}")
        backend._write(lambda conn: backend._insert(conn, job, clock[0]))

    def claim(queue: str, timeout: float = 0.0) -> list[str]:
        return [c.id for c in backend.claim(queue, "w", lease=30, limit=10, timeout=timeout)]

    try:
        assert claim("fresh") == []  # its last look: nothing there
        quietly("quiet", "fresh")
        clock[0] += backend.unrung_age / 2
        assert claim("fresh") == []  # fresh, and nothing rang: the rung claimer's
        clock[0] += backend.unrung_age
        assert claim("fresh") == ["quiet"]  # it has waited: anyone's
        backend.enqueue(NewJob(id="rung", queue="fresh", unit="u", payload=b"{}"))  # a wake-up here
        assert claim("fresh") == ["rung"]  # at once
        # On the real clock, a waiting claimer takes such a job by itself: never lost.
        monkeypatch.undo()
        assert claim("later") == []
        clock[0] = time.time()
        quietly("unrung", "later")
        assert claim("later", timeout=30) == ["unrung"]
    finally:
        backend.close()


def test_a_ring_for_one_is_not_sent_again_while_its_listener_has_not_read_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The unread ring makes its listener look after the later commit too: the second ring
    # would only wake it once more. A listener that stops reading gets them again.
    from foundry.backends import _doorbell

    db = str(tmp_path / "q.db")
    ringer, listener = Doorbell(db), Doorbell(db)
    sock = listener.listen("q")
    assert sock is not None
    try:
        ringer.ring(b"a", {"q"}, one="q")
        ringer.ring(b"b", {"q"}, one="q")
        assert listener.receive(sock) == [b"a"]
        ringer.ring(b"c", {"q"}, one="q")  # the last one was read: this one is sent
        assert listener.receive(sock) == [b"c"]
        monkeypatch.setattr(_doorbell, "UNREAD_GRACE", 0.0)  # unread for longer than that
        ringer.ring(b"d", {"q"}, one="q")
        ringer.ring(b"e", {"q"}, one="q")
        assert listener.receive(sock) == [b"d", b"e"]
        monkeypatch.undo()
        everything = listener.listen()  # an unkinded listener hears every ring: never skipped
        assert everything is not None
        ringer.ring(b"f", {"q"}, one="q")
        ringer.ring(b"g", {"q"}, one="q")
        assert listener.receive(everything) == [b"f", b"g"]
        assert listener.receive(sock) == [b"f", b"g"]
    finally:
        ringer.close()
        listener.close()
