"""What the adversarial queue tests share: a private namespace on every queue engine
(for RabbitMQ with its state store in the test's directory, so every process uses the
same one), a ``foundry worker`` process running ``tests.adversarial._queue_app``, and
a raw handle on each engine's store for writing malformed records straight into it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from foundry.backends.queue import JobState, open_queue_backend
from tests.backends.queue.engines import ENGINES, close, drop_schema, engine_url

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["ENGINES", "ROOT", "private_url", "queue_url", "start_worker", "stored", "write_field"]


def private_url(engine: str, tmp_path: Path) -> str:
    """A private namespace on ``engine``; RabbitMQ keeps its state next to the test."""
    url = engine_url(engine, tmp_path)
    if engine == "amqp":
        url += "&state=" + quote(f"sqlite:///{tmp_path / 'amqp-state.db'}", safe="")
    return url


@pytest.fixture(params=ENGINES)
def queue_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A private namespace on each engine, removed afterwards."""
    url = private_url(str(request.param), tmp_path)
    try:
        yield url
    finally:
        try:
            close(open_queue_backend(url), url)
        finally:
            drop_schema(url)


def stored(url: str, job_id: str) -> JobState:
    """The job's state as the store has it now (read through a backend of its own)."""
    backend = open_queue_backend(url)
    try:
        state = backend.get(job_id)
    finally:
        backend.close()
    assert state is not None, f"no job {job_id} in {url}"
    return state


def start_worker(url: str, *args: str, **popen: Any) -> subprocess.Popen[str]:
    """``foundry worker tests.adversarial._queue_app:app ARGS`` on ``url`` in another process."""
    env = {**os.environ, "FOUNDRY_QUEUE": url, "PYTHONFAULTHANDLER": ""}
    env.pop("PYTHONFAULTHANDLER")
    return subprocess.Popen(
        [sys.executable, "-m", "foundry.cli", "worker", "tests.adversarial._queue_app:app", *args],
        cwd=ROOT,
        env=env,
        text=True,
        **popen,
    )


def _query(url: str) -> dict[str, str]:
    from urllib.parse import parse_qsl, urlsplit

    return dict(parse_qsl(urlsplit(url).query))


def write_field(url: str, job_id: str, field: str, value: Any) -> None:
    """Overwrite one field of a job's record straight in the engine's store, bypassing
    Foundry (what a foreign writer, or an attacker with access to the store, can do)."""
    from urllib.parse import unquote

    engine = url.split("://", 1)[0]
    if engine == "amqp":  # its record lives in the state store (here: a SQLite file)
        prefix = _query(url)["prefix"]
        state = unquote(_query(url)["state"])
        _sqlite_write(state.split("?", 1)[0][len("sqlite:///") :], f"{prefix}_jobs", job_id, field, value)
    elif engine == "sqlite":
        _sqlite_write(url.split("?", 1)[0][len("sqlite:///") :], "foundry_jobs", job_id, field, value)
    elif engine in ("postgresql", "postgres"):
        import psycopg

        base = url.split("?", 1)[0]
        schema = _query(url)["schema"]
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'UPDATE "{schema}".foundry_jobs SET {field} = %s WHERE id = %s', (value, job_id))
    elif engine == "redis":
        import redis

        client = redis.Redis.from_url(url.split("?", 1)[0])
        try:
            client.hset(f"{_query(url)['prefix']}:j:{job_id}", field, value)
        finally:
            client.close()
    else:  # pragma: no cover - a new engine needs its raw writer here
        raise AssertionError(f"no raw writer for {engine}")


def _sqlite_write(path: str, table: str, job_id: str, field: str, value: Any) -> None:
    import sqlite3

    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        assert conn.execute(f"UPDATE {table} SET {field} = ? WHERE id = ?", (value, job_id)).rowcount == 1
    finally:
        conn.close()
