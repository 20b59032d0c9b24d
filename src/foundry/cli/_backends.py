"""The one way a command opens a store, runs against it and closes it.

``foundry jobs``, ``streams``, ``workflows`` and ``schedules`` each read or change the
state of one backend family. They all go through :func:`open_store`: the URL comes from the
command's option or the settings (the app's, when the command was given one), one line on
stderr names it with its secrets masked (:func:`foundry.cli._state.store`, which uses
:func:`foundry.config.safe_url`), and the backend is closed however the command ends. What
an engine raises is already masked by the engine (``tests/test_no_secrets.py``), so it goes
through unchanged: the errors and exit codes are the engines' and the store's own.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from foundry.cli._state import full_id, store
from foundry.config import Settings

__all__ = ["Family", "backend_at", "open_store"]

Family = Literal["queue", "stream", "journal"]


def _open(family: Family, url: str, home: Path) -> Any:
    if family == "queue":
        from foundry.backends.queue import open_queue_backend

        return open_queue_backend(url, home=home)
    if family == "stream":
        from foundry.backends.stream import open_stream_backend

        return open_stream_backend(url)
    from foundry.backends.journal import open_journal

    return open_journal(url)


@contextmanager
def backend_at(family: Family, url: str, home: Path) -> Iterator[Any]:
    """The ``family`` backend at ``url`` (already resolved and announced), closed on exit."""
    backend = _open(family, url, home)
    try:
        yield backend
    finally:
        backend.close()


@contextmanager
def open_store(
    command: str,
    family: Family,
    given: str | None,
    flag: str = "--url",
    *,
    settings: Settings | None = None,
    must_exist: bool = True,
    id_of: tuple[argparse.Namespace, str] | None = None,
) -> Iterator[Any]:
    """The ``family`` store named by ``given`` (the command's ``flag``) or else by
    ``settings`` (default: the resolved settings), announced on stderr and closed on exit.

    ``id_of=(args, "job")``: an ``args.id`` that is a unique prefix of an id in the store
    becomes that whole id (:func:`~foundry.cli._state.full_id`) before the command runs.
    """
    url, home = store(command, family, given, flag, settings=settings, must_exist=must_exist)
    with backend_at(family, url, home) as backend:
        if id_of is not None and getattr(id_of[0], "id", None):
            args, what = id_of
            args.id = full_id(backend, args.id, what)
        yield backend
