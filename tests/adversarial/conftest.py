"""Fixtures of the adversarial suite.

Streams: ``stream_url`` (every stream engine, the servers through
``tests.services.require``) and ``make_stream_app`` (apps whose streams are deleted
afterwards); helpers in ``tests/adversarial/_streams.py``.

Journals: ``journal_url`` (SQLite and PostgreSQL, a private schema dropped afterwards)
and ``workflow_app`` (the workflows of ``_workflow_app.py`` on it); what a store writer
does to a journal, in ``tests/adversarial/_journals.py``.

Queues: ``queue_env`` (every queue engine, a private namespace on each; a missing server
skips locally and fails under ``CI=true``), a :class:`QueueEnv` whose app has in-process
workers that stop at the end.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from foundry import Foundry
from foundry.backends.queue import open_queue_backend
from foundry.deliver.worker import Worker
from tests.adversarial._journals import ENGINES as JOURNAL_ENGINES
from tests.adversarial._journals import journal_url as journal_url_of
from tests.adversarial._streams import ENGINES as STREAM_ENGINES
from tests.adversarial._streams import MakeApp, app_factory
from tests.adversarial._streams import engine_url as stream_engine_url
from tests.adversarial._workflow_app import make_app as make_workflow_app
from tests.backends.queue.engines import ENGINES as QUEUE_ENGINES
from tests.backends.queue.engines import close
from tests.backends.queue.engines import engine_url as queue_engine_url


@pytest.fixture(params=STREAM_ENGINES)
def stream_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return stream_engine_url(str(request.param), tmp_path_factory)


@pytest.fixture
def make_stream_app(tmp_path: Path) -> Iterator[MakeApp]:
    yield from app_factory(tmp_path)


class QueueEnv:
    """An app on a private queue namespace; :meth:`worker` starts in-process workers."""

    def __init__(self, engine: str, url: str) -> None:
        self.engine = engine
        self.url = url
        self.app = Foundry(f"adv-{uuid.uuid4().hex[:6]}", queue=url)
        self._workers: list[Worker] = []

    def work(self, fn: Callable[..., Any], **traits: Any) -> Any:
        return self.app.work(durable=True, **traits)(fn)

    def worker(self, **options: Any) -> Worker:
        settings: dict[str, Any] = {"concurrency": 2, "lease": 10.0, "poll": 0.2, "grace": 5.0}
        settings.update(options)
        worker = Worker(self.app, **settings).start()
        self._workers.append(worker)
        return worker

    def close(self) -> None:
        try:
            for worker in self._workers:
                worker.stop(5.0)
            self.app.close(timeout=5)
        finally:
            close(open_queue_backend(self.url), self.url)


@pytest.fixture(params=QUEUE_ENGINES)
def queue_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[QueueEnv]:
    engine = str(request.param)
    env = QueueEnv(engine, queue_engine_url(engine, tmp_path))
    try:
        yield env
    finally:
        env.close()


@pytest.fixture(params=JOURNAL_ENGINES)
def journal_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh journal on every engine (SQLite, PostgreSQL; see ``_journals``)."""
    with journal_url_of(str(request.param), tmp_path) as url:
        yield url


@pytest.fixture
def workflow_app(journal_url: str, tmp_path: Path) -> Iterator[Foundry]:
    """The app of ``tests/adversarial/_workflow_app.py`` on ``journal_url`` (every engine)."""
    app = make_workflow_app(journal_url, name=f"wadv-{uuid.uuid4().hex[:6]}", home=tmp_path / "home")
    try:
        yield app
    finally:
        app.close()
