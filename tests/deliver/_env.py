"""What the queue delivery tests share: an app on a private queue with in-process
workers (:class:`Env`), and a way to run Python in another process of the repository."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from foundry.deliver.worker import JobEvent, Worker
from tests.deliver import queue_app

ROOT = Path(__file__).resolve().parents[2]


class Env:
    """An app on a private queue, with in-process workers that stop at the end."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.app = queue_app.make_app(url, name=f"qt-{uuid.uuid4().hex[:6]}")
        self.events: list[JobEvent] = []
        self._workers: list[Worker] = []

    def unit(self, name: str) -> Any:
        return self.app.units[name]

    def worker(self, **options: Any) -> Worker:
        settings: dict[str, Any] = {
            "concurrency": 4,
            "lease": 5.0,
            "poll": 0.2,
            "on_event": self.events.append,
        }
        settings.update(options)
        w = Worker(self.app, **settings).start()
        self._workers.append(w)
        return w

    def kinds(self, job_id: str) -> list[str]:
        return [e.kind for e in self.events if e.job_id == job_id]

    def settled_kinds(self, job_id: str, timeout: float = 10.0) -> list[str]:
        """The job's events once its last one is in: the worker reports an outcome after
        it recorded it, so a caller can read the result a moment before the event."""
        deadline = time.monotonic() + timeout
        while not {"succeeded", "failed", "dead"} & set(self.kinds(job_id)):
            assert time.monotonic() < deadline, f"no outcome event for {job_id}: {self.kinds(job_id)}"
            time.sleep(0.01)
        return self.kinds(job_id)

    def close(self) -> None:
        for w in self._workers:
            w.stop(2.0)
        self.app.close()


def python(*argv: str, queue: str | None = None) -> str:
    """Run ``python ARGV`` in the repository (another process); its stdout."""
    env = {**os.environ, **({"FOUNDRY_QUEUE": queue} if queue else {})}
    done = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
