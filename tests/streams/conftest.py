"""Fixtures for the stream tests: one backend per engine, unique stream names, cleanup.

``backend_url`` is parametrized over every engine; the NATS and Redis ones need the real
servers (``tests.services.require``: skip on a laptop, fail under ``CI=true``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from foundry import Foundry
from foundry.backends.stream import StreamBackend, StreamConfig, open_stream_backend
from tests.services import require

ENGINES = ("sqlite", "nats", "redis")


def engine_url(engine: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    if engine == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp('stream')}/stream.db"
    return require(engine)


@pytest.fixture(params=ENGINES)
def backend_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return engine_url(str(request.param), tmp_path_factory)


@pytest.fixture
def backend(backend_url: str) -> Iterator[StreamBackend]:
    b = open_stream_backend(backend_url)
    created: list[str] = []
    b._test_created = created  # type: ignore[attr-defined]
    try:
        yield b
    finally:
        for name in created:
            try:
                b.delete_stream(name)
            except Exception:
                pass
        b.close()


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def make_stream(backend: StreamBackend) -> Callable[..., StreamConfig]:
    """Create a uniquely named stream on ``backend`` (deleted after the test)."""

    def make(partitions: int = 1, **limits: object) -> StreamConfig:
        config = StreamConfig(unique(), partitions=partitions, **limits)  # type: ignore[arg-type]
        backend.ensure_stream(config)
        backend._test_created.append(config.name)  # type: ignore[attr-defined]
        return config

    return make


def app_factory(tmp_path: Path, default_url: str | None = None) -> Iterator[Callable[..., Foundry]]:
    """For a fixture: make apps on a stream URL (default ``default_url``, else a SQLite file
    in ``tmp_path``) and, afterwards, close them and delete their streams from the server."""
    made: list[Foundry] = []

    def make(url: str | None = None) -> Foundry:
        home = tmp_path / ("home" if not made else f"home{len(made)}")
        app = Foundry(unique("app"), home=home, stream=url or default_url or f"sqlite:///{tmp_path}/s.db")
        made.append(app)
        return app

    yield make
    for app in made:
        streams = list(app.streams)
        url = app.settings.stream
        app.close()
        backend = open_stream_backend(url)
        try:
            for name in streams:
                backend.delete_stream(name)
        finally:
            backend.close()
