"""A lifespan for Starlette and FastAPI: the Foundry app lives as long as the service.

    from fastapi import FastAPI
    from foundry.integrations.starlette import lifespan

    api = FastAPI(lifespan=lifespan(app))                  # closes the app on shutdown
    api = FastAPI(lifespan=lifespan(app, workers=True))    # development: its workers in-process

On startup the lifespan (with ``workers``) starts what ``foundry run`` would — queue
workers, workflow workers, stream consumers, the scheduler, a served pool
(:class:`foundry.supervisor.Supervisor`) — and yields the state ``{"foundry": app}``
(``request.state.foundry`` in a handler). On shutdown it drains them within ``grace``
seconds and closes the app (its runners, connections and pools), off the event loop.
``then`` chains the service's own lifespan inside this one (its state is merged).

In production run the workers as their own processes (``foundry run app:app``): a web
server's workers are restarted, scaled and killed on its own schedule, and in-process
workers would be too. A component that stops by itself is logged at once, with its
reason (``foundry run`` would exit for its supervisor to restart it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from foundry.app import Foundry
from foundry.errors import ConfigError
from foundry.supervisor import KINDS, Options, Supervisor

__all__ = ["lifespan"]

log = logging.getLogger("foundry.integrations.starlette")

Lifespan = Callable[[Any], AbstractAsyncContextManager[Any]]


def lifespan(
    app: Foundry,
    *,
    workers: bool | Iterable[str] = False,
    options: Options | None = None,
    grace: float = 10.0,
    then: Lifespan | None = None,
) -> Lifespan:
    """The lifespan of ``app`` for ``Starlette(lifespan=...)`` / ``FastAPI(lifespan=...)``.

    ``workers``: ``True`` runs every component the app declares in this process, a list of
    kinds (``"queue"``, ``"workflows"``, ``"streams"``, ``"pool"``, ``"schedules"``) only
    those; ``options`` are ``foundry run``'s (concurrency, lease, …). ``grace``: seconds
    the running work gets on shutdown before it is given back for redelivery."""
    if not isinstance(app, Foundry):
        raise ConfigError(
            f"lifespan(app): {app!r} is not a Foundry app. Fix: pass the Foundry() your units are declared on"
        )
    only: list[str] | None = None
    if not isinstance(workers, bool):
        only = list(workers)
        unknown = sorted(set(only) - set(KINDS))
        if unknown:
            raise ConfigError(
                f"lifespan(workers=...): unknown kind(s) {', '.join(unknown)}. Fix: name some of "
                f"{', '.join(KINDS)}, or pass True for all of them"
            )
    run = bool(workers)

    @contextlib.asynccontextmanager
    async def span(asgi_app: Any) -> AsyncIterator[dict[str, Any]]:
        supervisor: Supervisor | None = None
        done = threading.Event()
        if run:
            supervisor = await asyncio.to_thread(lambda: Supervisor(app, options, only=only).start())
            threading.Thread(
                target=_report, args=(supervisor, done), name="foundry-lifespan-watch", daemon=True
            ).start()
        try:
            if then is None:
                yield {"foundry": app}
            else:
                async with then(asgi_app) as state:
                    yield {**(state if isinstance(state, Mapping) else {}), "foundry": app}
        finally:
            done.set()
            if supervisor is not None:
                await asyncio.to_thread(supervisor.stop, grace)
            await asyncio.to_thread(app.close, grace)

    return span


def _report(supervisor: Supervisor, done: threading.Event) -> None:
    failure = supervisor.watch(done)
    if failure is not None and not done.is_set():
        log.error(
            "foundry: the in-process %s stopped by itself: %s. The service goes on without it; "
            "restart it, or run the workers with `foundry run`",
            failure.component,
            failure.reason,
        )
