"""What someone who holds a store's credentials can do: write records straight into the
engine, bypassing Foundry. Used by the adversarial tests to plant hostile records.

:class:`Marker` pickles to bytes whose loading creates a file (``__reduce__`` calls
``open(path, "w")``): if the marker file exists after a test, some path unpickled a
record it should not have. :func:`rewrite_job` and :func:`rewrite_workflow` /
:func:`rewrite_entry` change columns of one record in the queue or journal engine
itself (SQLite, PostgreSQL, Redis, and the RabbitMQ engine's state store).
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any


class Marker:
    """Unpickling this runs ``open(path, "w")``: the file appearing is the proof."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def hostile_pickle(path: Path) -> bytes:
    return pickle.dumps(Marker(path))


def rewrite_job(backend: Any, job_id: str, **columns: Any) -> None:
    """Set ``columns`` (codec, payload, result, error, unit…) of job ``job_id`` in the
    engine's own storage, as a store writer would."""
    state = getattr(backend, "state", None)
    if state is not None:  # RabbitMQ: the job's record lives in the state store
        rewrite_job(state, job_id, **columns)
        return
    if hasattr(backend, "_write") and hasattr(backend, "execute"):  # SQLite, PostgreSQL
        sets = ", ".join(f"{name} = ?" for name in columns)
        params = [*columns.values(), job_id]
        changed = backend._write(
            lambda conn: backend.execute(conn, f"UPDATE {{jobs}} SET {sets} WHERE id = ?", params)
        )
        assert changed == 1, f"job {job_id} not found to rewrite"
        return
    client = getattr(backend, "client", None)
    if client is not None:  # Redis: one hash per job
        key = backend._key("j", job_id)
        assert client.exists(key), f"job {job_id} not found to rewrite"
        client.hset(key, mapping={k: ("" if v is None else v) for k, v in columns.items()})
        return
    raise AssertionError(f"no way to rewrite a job in {backend!r}")


def rewrite_workflow(journal: Any, workflow_id: str, **columns: Any) -> None:
    """Set ``columns`` of one workflow row in the journal's database."""
    sets = ", ".join(f"{name} = ?" for name in columns)
    with journal._tx() as c:
        c.run(f"UPDATE {{wf}} SET {sets} WHERE id = ?", [*columns.values(), workflow_id])


def rewrite_entry(journal: Any, workflow_id: str, position: int, **columns: Any) -> None:
    """Set ``columns`` of one journal entry (a step's result or error)."""
    sets = ", ".join(f"{name} = ?" for name in columns)
    with journal._tx() as c:
        c.run(
            f"UPDATE {{en}} SET {sets} WHERE workflow_id = ? AND pos = ?",
            [*columns.values(), workflow_id, position],
        )
