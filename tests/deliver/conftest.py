"""Fixtures of the queue delivery tests: :class:`~tests.deliver._env.Env` per engine."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.backends.queue.engines import drop_schema, engine_url
from tests.deliver._env import Env


@pytest.fixture
def make_env(tmp_path: Path) -> Iterator[Callable[[str], Env]]:
    envs: list[Env] = []

    def make(engine: str = "sqlite") -> Env:
        env = Env(engine_url(engine, tmp_path))
        envs.append(env)
        return env

    try:
        yield make
    finally:
        for env in envs:
            env.close()
            drop_schema(env.url)


@pytest.fixture
def env(make_env: Callable[[str], Env]) -> Env:
    return make_env("sqlite")
