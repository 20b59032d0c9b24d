"""The SQLite queue on a full disk and on a read-only file system (issue 12, item 13):
a clear error — what happened, the file, the fix — instead of "SQLite failed (database
or disk is full)" retried every 2 s for ever, or "unable to open database file"; with
``--burst`` the worker exits 1 (before, it never exited). Without ``--burst`` it keeps
trying, saying why, and carries on once space is freed.

The disk is a real one: a tiny tmpfs mounted for the test (root), then filled or
remounted read-only; without root, the read-only case uses file permissions and the
full-disk case cannot be made (skipped locally, a failure under CI=true)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from foundry.backends.queue import open_queue_backend
from foundry.errors import StorageError
from tests.adversarial import _queue_app
from tests.adversarial._queue_helpers import start_worker


@contextlib.contextmanager
def tiny_disk(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where`` for the duration (needs root)."""
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0777", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        message = f"cannot mount a tmpfs for the test ({done.stderr.strip() or done.returncode})"
        if os.environ.get("CI"):
            pytest.fail(f"{message} and CI=true: run the suite as root")
        pytest.skip(message)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte with one file (deleting it frees the space)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        size = 65536
        while size >= 1:
            try:
                os.write(fd, b"\0" * size)
            except OSError:
                size //= 2  # the last bytes, in smaller and smaller writes
    finally:
        os.close(fd)
    assert os.statvfs(disk).f_bavail == 0
    return filler


def test_a_full_disk_is_a_clear_error_and_burst_exits(tmp_path: Path) -> None:
    with tiny_disk(tmp_path / "disk", "2m") as disk:
        db = disk / "queue.db"
        url = f"sqlite:///{db}"
        app = _queue_app.make_app(url, name=f"full-{uuid.uuid4().hex[:6]}")
        try:
            # Given jobs in a queue whose disk is then full
            handles = [app.units["healthy"].submit(i) for i in range(5)]
            filler = fill(disk)
            # Then a submission says so, naming the file and the fix
            with pytest.raises(StorageError, match="disk is full") as info:
                app.units["healthy"].submit(99)
            assert str(db) in str(info.value)
            assert "Fix: free space" in str(info.value)
            # And a --burst worker exits 1 with that message, instead of retrying for ever
            proc = start_worker(url, "--burst", "-q", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                _, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                raise AssertionError("foundry worker --burst kept retrying on a full disk") from None
            assert proc.returncode == 1, err
            assert "disk is full" in err
            assert str(db) in err
            assert "Fix: free space" in err
            # And a worker without --burst keeps trying, saying why, and goes on once space is freed
            proc = start_worker(url, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                time.sleep(3.0)
                assert proc.poll() is None, "without --burst the worker waits for the disk"
                filler.unlink()
                assert [h.result(timeout=60) for h in handles] == [0, 2, 4, 6, 8]
            finally:
                proc.send_signal(signal.SIGTERM)
                _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            assert "disk is full" in err
        finally:
            app.close()


def make_read_only(disk: Path, db: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True, capture_output=True)
    else:
        for path in disk.iterdir():
            path.chmod(0o444)
        disk.chmod(0o555)


def test_a_read_only_file_system_is_a_clear_error(tmp_path: Path) -> None:
    ctx = tiny_disk(tmp_path / "disk", "4m") if os.geteuid() == 0 else contextlib.nullcontext(tmp_path)
    with ctx as disk:
        db = disk / "queue.db"
        url = f"sqlite:///{db}"
        app = _queue_app.make_app(url, name=f"ro-{uuid.uuid4().hex[:6]}")
        app.units["healthy"].submit(1)
        app.close()
        # Given a queue file that became read-only (a read-only mount, or permissions)
        make_read_only(disk, db)
        try:
            # Then opening it for work says what is wrong with which file, and the fix
            with pytest.raises(StorageError) as info:
                open_queue_backend(url).claim("default", "w", lease=5, limit=1, timeout=0.1)
            message = str(info.value)
            assert "cannot be opened for writing" in message
            assert str(db) in message
            assert "Fix: make" in message
            # And foundry worker --burst exits 1 with that message, not a traceback
            proc = start_worker(url, "--burst", "-q", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 1, err
            assert "cannot be opened for writing" in err
            assert "Fix: make" in err
            assert "Traceback" not in err
            # And a queue in a folder that cannot be created says so too
            with pytest.raises(StorageError, match=r"read-only|cannot be opened"):
                open_queue_backend(f"sqlite:///{disk / 'sub' / 'queue.db'}")
        finally:
            if os.geteuid() != 0:
                disk.chmod(0o755)
