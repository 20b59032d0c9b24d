"""Every queue engine, for the conformance suite, the runtime tests and the fault suite.

``ENGINES`` lists them all. :func:`engine_url` gives a private namespace on each (a
fresh SQLite file; a private PostgreSQL schema; for Redis and RabbitMQ the engine's own
``prefix`` option), and :func:`close` removes it. A server that is down skips the
test on a laptop and fails it under ``CI=true`` (``tests.services.require``); so does an
engine module that is not in the tree yet.

An engine may define ``destroy()`` on its backend: it removes everything that
backend's URL namespace created (keys, queues, exchanges); the suite calls it on an
open backend just before closing it.
"""

from __future__ import annotations

import importlib
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.services import require

ENGINES = ["sqlite", "postgres", "redis", "amqp"]
_SERVICE = {"postgres": "postgres", "redis": "redis", "amqp": "rabbitmq"}
_MODULE = {
    "sqlite": "foundry.backends.queue.sqlite",
    "postgres": "foundry.backends.queue.postgres",
    "redis": "foundry.backends.queue.redis",
    "amqp": "foundry.backends.queue.amqp",
}


def require_engine(engine: str) -> None:
    """Skip (locally) or fail (CI) when the engine's module is not in the tree."""
    try:
        importlib.import_module(_MODULE[engine])
    except ModuleNotFoundError as exc:
        if exc.name != _MODULE[engine]:
            raise
        message = f"{_MODULE[engine]} does not exist yet (the {engine} engine is built separately)"
        if os.environ.get("CI"):
            pytest.fail(f"{message} and CI=true: a missing engine is a failure, not a skip")
        pytest.skip(message)


def engine_url(engine: str, tmp_path: Path) -> str:
    """A URL for a private namespace on ``engine`` (see :func:`close`)."""
    require_engine(engine)
    tag = uuid.uuid4().hex[:10]
    if engine == "sqlite":
        return f"sqlite:///{tmp_path / f'queue-{tag}.db'}"
    base = require(_SERVICE[engine])
    sep = "&" if "?" in base else "?"
    if engine == "postgres":
        return f"{base}{sep}schema=fq_test_{tag}"
    return f"{base}{sep}prefix=fqt{tag}"


def close(backend: Any, url: str) -> None:
    """``destroy()`` (when the engine has it), close, then drop a PostgreSQL schema."""
    try:
        destroy = getattr(backend, "destroy", None)
        if callable(destroy):
            destroy()
    finally:
        backend.close()
        drop_schema(url)


def drop_schema(url: str) -> None:
    if url.startswith(("postgresql://", "postgres://")) and "schema=" in url:
        import psycopg

        base, query = url.split("?", 1)
        schema = dict(p.split("=", 1) for p in query.split("&"))["schema"]
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
