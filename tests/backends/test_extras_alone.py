"""Each optional extra works alone: an engine needs its own driver and no other.

Each test runs a child Python whose import system refuses the drivers of every *other*
extra (a meta-path finder raising ``ModuleNotFoundError``, as for a package that is not
installed), opens one engine by URL and runs one job or event through it. A last group
blocks an engine's own driver and checks that opening its URL says which extra to
install, never a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.services import require

# extra -> the top-level modules it installs (what the engines of that extra import)
DRIVERS: dict[str, tuple[str, ...]] = {
    "rabbitmq": ("aio_pika", "aiormq", "pamqp"),
    "redis": ("redis",),
    "postgres": ("psycopg", "psycopg_binary", "psycopg_c", "psycopg_pool"),
    "nats": ("nats",),
    "dask": ("dask", "distributed"),
    "ray": ("ray",),
}

_BLOCKER = """
import importlib.abc, json, sys

BLOCKED = set(json.loads(sys.argv[1]))


class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None


sys.meta_path.insert(0, Blocked())
"""


def _run_without(extras: list[str], body: str, *args: str) -> str:
    """Run ``body`` in a child whose imports of ``extras``' drivers fail; its stdout."""
    blocked = sorted({m for extra in extras for m in DRIVERS[extra]})
    code = _BLOCKER + textwrap.dedent(body)
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(blocked), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"child failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _others(extra: str) -> list[str]:
    return [e for e in DRIVERS if e != extra]


_ONE_JOB = """
import sys, uuid
from foundry.backends.queue import open_queue_backend
from foundry.backends.queue.base import JobStatus, NewJob

url, queue = sys.argv[2], sys.argv[3]
backend = open_queue_backend(url)
try:
    job = NewJob(id=uuid.uuid4().hex, queue=queue, unit="u", payload=b'{"n": 1}')
    backend.enqueue(job)
    claimed = backend.claim(queue, "w", lease=30, limit=1, timeout=10)
    assert [c.id for c in claimed] == [job.id], claimed
    assert backend.complete(job.id, claimed[0].token, b"2")
    state = backend.get(job.id)
    assert state is not None and state.status is JobStatus.SUCCEEDED, state
    print("ran", state.status.value)
finally:
    destroy = getattr(backend, "destroy", None)
    if callable(destroy):
        destroy()
    backend.close()
loaded = sorted({m.split(".")[0] for m in sys.modules} & BLOCKED)
assert not loaded, loaded
"""


def test_the_rabbitmq_extra_alone_runs_a_job_on_amqp(tmp_path: Path) -> None:
    # Given: RabbitMQ, and no driver but the rabbitmq extra's (no redis, psycopg, nats…)
    base = require("rabbitmq")
    state = f"sqlite:///{tmp_path / 'state.db'}"
    url = f"{base}?state={state.replace(':', '%3A').replace('/', '%2F')}&prefix=alone{uuid.uuid4().hex[:8]}"
    # When / Then: amqp:// opens with its state store on SQLite and runs one job
    out = _run_without(_others("rabbitmq"), _ONE_JOB, url, "alone-" + uuid.uuid4().hex[:8])
    assert out.strip() == "ran succeeded"


def test_the_redis_extra_alone_runs_a_job_on_redis() -> None:
    base = require("redis")
    url = f"{base}?prefix=alone-{uuid.uuid4().hex[:8]}"
    out = _run_without(_others("redis"), _ONE_JOB, url, "alone-" + uuid.uuid4().hex[:8])
    assert out.strip() == "ran succeeded"


def test_the_postgres_extra_alone_runs_a_job_on_postgresql() -> None:
    base = require("postgres")
    url = f"{base}?prefix=alone_{uuid.uuid4().hex[:8]}_"
    out = _run_without(_others("postgres"), _ONE_JOB, url, "alone-" + uuid.uuid4().hex[:8])
    assert out.strip() == "ran succeeded"


def test_no_extra_at_all_runs_a_job_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    out = _run_without(list(DRIVERS), _ONE_JOB, url, "alone")
    assert out.strip() == "ran succeeded"


_ONE_EVENT = """
import sys
from foundry.backends.stream import NewEvent, Start, StreamConfig, open_stream_backend

url, name = sys.argv[2], sys.argv[3]
backend = open_stream_backend(url)
try:
    backend.ensure_stream(StreamConfig(name=name, partitions=1))
    backend.create_group(name, "g", Start.beginning())
    backend.append(name, [NewEvent(id="e1", key="k", payload=b"1")])
    events = backend.read(name, "g", 0, "c", max=10, ack_deadline=30, timeout=10)
    assert [e.payload for e in events] == [b"1"], events
    print("read", len(events))
finally:
    backend.delete_stream(name)
    backend.close()
loaded = sorted({m.split(".")[0] for m in sys.modules} & BLOCKED)
assert not loaded, loaded
"""


@pytest.mark.parametrize("extra", ["redis", "nats"])
def test_a_stream_extra_alone_reads_an_event_back(extra: str) -> None:
    base = require(extra)
    name = f"alone-{extra}-{uuid.uuid4().hex[:8]}"
    out = _run_without(_others(extra), _ONE_EVENT, base, name)
    assert out.strip() == "read 1"


_OPEN = """
import sys
from foundry.errors import ConfigError

family, url = sys.argv[2], sys.argv[3]
try:
    if family == "queue":
        from foundry.backends.queue import open_queue_backend as open_
    elif family == "stream":
        from foundry.backends.stream import open_stream_backend as open_
    elif family == "journal":
        from foundry.backends.journal import open_journal as open_
    elif family == "cluster":
        from foundry.backends.cluster import open_cluster as open_
    open_(url)
except ConfigError as exc:
    print(exc)
else:
    raise SystemExit("opened without its driver")
"""


@pytest.mark.parametrize(
    ("family", "url", "extra"),
    [
        ("queue", "amqp://guest:guest@127.0.0.1:5672/", "rabbitmq"),
        ("queue", "redis://127.0.0.1:6379/0", "redis"),
        ("queue", "postgresql://postgres@127.0.0.1:5432/test", "postgres"),
        ("stream", "redis://127.0.0.1:6379/0", "redis"),
        ("stream", "nats://127.0.0.1:4222", "nats"),
        ("journal", "postgresql://postgres@127.0.0.1:5432/test", "postgres"),
        ("cluster", "tcp://127.0.0.1:8786", "dask"),
        ("cluster", "ray://127.0.0.1:10001", "ray"),
    ],
)
def test_a_missing_driver_names_the_extra_to_install(family: str, url: str, extra: str) -> None:
    out = _run_without([extra], _OPEN, family, url)
    assert f'pip install "foundry-exec[{extra}]"' in out, out
    assert "ModuleNotFoundError" not in out
