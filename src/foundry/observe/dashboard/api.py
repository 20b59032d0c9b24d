"""The dashboard's HTTP API, independent of the HTTP server: ``Api.handle(method,
path, query, body)`` -> ``(status, json)``. Reads are GET and cached for ``ttl``
seconds per distinct request (every open tab shares one engine query); actions are
POST and drop the caches they make stale. The server (``server.py``) adds transport
and security.

=======================================  ======================================================
GET  /api/meta                           app, engines (passwords masked), poll interval
GET  /api/live?since=T                   plan figures, fleet, queues, history points after T
GET  /api/plan                           every unit and phase with its decision and bill
GET  /api/jobs?queue&status&unit&since   jobs, newest first
GET  /api/jobs/ID                        one job: arguments, attempts, traceback, timeline
POST /api/jobs/ID/retry | /cancel        re-queue a dead/failed job; cancel a queued one
POST /api/queues/Q/purge {"what"}        "queued" (cancel waiting jobs) or "expired"
GET  /api/workflows?status&name          workflow runs, newest first
GET  /api/workflows/ID                   history, compensation, inbox, timers, children
POST /api/workflows/ID/signal {name,payload} | /cancel
GET  /api/streams                        streams, groups, partitions, owners, lag
GET  /api/streams/S/dead?group           dead letters
POST /api/streams/S/groups/G/replay {offset|time|ago|beginning|end, partitions}
=======================================  ======================================================
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote

import foundry.observe.dashboard.jobs as jobs_api
import foundry.observe.dashboard.streams as streams_api
import foundry.observe.dashboard.workflows as workflows_api
from foundry.errors import BackendUnavailableError, FoundryError, NotFoundError
from foundry.observe.dashboard.cache import TTLCache
from foundry.observe.dashboard.jobs import ActionRefused
from foundry.observe.dashboard.live import Live
from foundry.observe.dashboard.sources import Sources

__all__ = ["Api", "BadRequest"]

log = logging.getLogger("foundry.dashboard")

Reply = tuple[int, Any]


class BadRequest(FoundryError):
    """The request itself is wrong (a parameter, a body)."""


def _one(query: Mapping[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    if not values or values[0] == "":
        return None
    value = values[0]
    if len(value) > 500:
        raise BadRequest(f"{name} is too long (at most 500 characters)")
    return value


def _number(query: Mapping[str, list[str]], name: str, default: float | None = None) -> float | None:
    value = _one(query, name)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise BadRequest(f"{name}={value!r} is not a number") from None
    if not math.isfinite(number):
        raise BadRequest(f"{name}={value!r} is not a finite number")
    return number


class Api:
    """Routes and caches; see the module docstring for the routes."""

    def __init__(
        self, sources: Sources, *, ttl: float = 1.0, poll: float = 2.0, live: Live | None = None
    ) -> None:
        self.sources = sources
        self.ttl = ttl
        self.poll = max(poll, ttl)
        self.cache = TTLCache()
        self.live = live or Live(sources, step=self.poll)

    # -- helpers -----------------------------------------------------------------------

    def _cached(self, key: tuple[Any, ...], compute: Callable[[], Any], ttl: float | None = None) -> Any:
        return self.cache.get(key, self.ttl if ttl is None else ttl, compute)

    def _fleet_rows(self) -> list[dict[str, Any]]:
        live = self._cached(("live",), self.live.sample)
        return list(live["fleet"])

    # -- entry point -------------------------------------------------------------------

    def handle(self, method: str, path: str, query: Mapping[str, list[str]], body: Any) -> Reply:
        """``(status, payload)`` for one request; never raises."""
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if not parts or parts[0] != "api":
            return 404, {"error": f"no such endpoint {path!r}"}
        try:
            route = parts[1:]
            if method == "GET":
                return 200, self._get(route, query)
            if method == "POST":
                if not isinstance(body, dict):
                    raise BadRequest("the body must be a JSON object")
                result = self._post(route, body)
                return 200, result
            return 405, {"error": f"{method} is not allowed; reads are GET, actions are POST"}
        except BadRequest as exc:
            return 400, {"error": str(exc)}
        except (ActionRefused, NotFoundError) as exc:
            return 409 if isinstance(exc, ActionRefused) else 404, {"error": self.sources.redact(str(exc))}
        except LookupError:
            return 404, {"error": f"no such endpoint {path!r}"}
        except BackendUnavailableError as exc:
            return 503, {"error": self.sources.redact(str(exc))}
        except FoundryError as exc:
            return 500, {"error": self.sources.redact(str(exc))}
        except Exception as exc:  # a bug: say so without leaking internals
            log.exception("dashboard: %s %s failed", method, path)
            return 500, {"error": f"internal error ({type(exc).__name__}); see the dashboard's log"}

    # -- reads -------------------------------------------------------------------------

    def _get(self, route: list[str], query: Mapping[str, list[str]]) -> Any:
        match route:
            case ["meta"]:
                return {
                    "app": self.sources.app_name,
                    "engines": self.sources.engines(),
                    "exporters": [self.sources.redact(u) for u in self.sources.exporters],
                    "poll": self.poll,
                    "window": self.live.window,
                    "states": list(jobs_api.STATES),
                    "workflow_statuses": list(workflows_api.STATUSES),
                }
            case ["plan"]:
                return {"units": self.live.plan()}
            case ["live"]:
                since = _number(query, "since", 0.0) or 0.0
                sample = dict(self._cached(("live",), self.live.sample))
                sample["history"] = self.live.since(since)
                return sample
            case ["jobs"]:
                status = _one(query, "status")
                if status is not None and status not in jobs_api.STATES:
                    raise BadRequest(f"status={status!r}: one of {', '.join(jobs_api.STATES)}")
                args: dict[str, Any] = {
                    "queue": _one(query, "queue"),
                    "status": status,
                    "unit": _one(query, "unit"),
                    "since": _number(query, "since"),
                    "until": _number(query, "until"),
                    "limit": int(_number(query, "limit", 100) or 100),
                }

                def read() -> Any:
                    with self.sources.using("queue") as backend:
                        return jobs_api.list_jobs(backend, **args)

                return self._cached(("jobs", tuple(sorted(args.items(), key=lambda kv: kv[0]))), read)
            case ["jobs", job_id]:

                def one() -> Any:
                    with self.sources.using("queue") as backend:
                        state = backend.get(job_id)
                    if state is None:
                        raise NotFoundError(f"no job {job_id!r} in the queue store. Fix: check the id")
                    return jobs_api.job_detail(state)

                return self._cached(("jobs:one", job_id), one)
            case ["queues"]:
                live = self._cached(("live",), self.live.sample)
                return {"queues": live["queues"]}
            case ["workflows"]:
                wf_args: dict[str, Any] = {
                    "status": _one(query, "status"),
                    "name": _one(query, "name"),
                    "limit": int(_number(query, "limit", 100) or 100),
                }

                def wfs() -> Any:
                    with self.sources.using("journal") as journal:
                        return workflows_api.list_workflows(journal, **wf_args)

                return self._cached(("workflows", tuple(sorted(wf_args.items()))), wfs)
            case ["workflows", workflow_id]:

                def wf() -> Any:
                    with self.sources.using("journal") as journal:
                        return workflows_api.workflow_detail(journal, workflow_id)

                return self._cached(("workflows:one", workflow_id), wf)
            case ["streams"]:

                def streams() -> Any:
                    members = self._fleet_rows()
                    with self.sources.using("stream") as backend:
                        return streams_api.list_streams(backend, members)

                return self._cached(("streams",), streams)
            case ["streams", stream, "dead"]:
                group = _one(query, "group")
                limit = int(_number(query, "limit", 50) or 50)

                def dead() -> Any:
                    with self.sources.using("stream") as backend:
                        return streams_api.dead_letters(backend, stream, group, limit)

                return self._cached(("streams:dead", stream, group, limit), dead)
            case ["fleet"]:
                return {"fleet": self._fleet_rows()}
        raise LookupError(route)

    # -- actions -----------------------------------------------------------------------

    def _post(self, route: list[str], body: dict[str, Any]) -> Any:
        match route:
            case ["jobs", job_id, ("retry" | "cancel") as action]:
                with self.sources.using("queue") as backend:
                    fn = jobs_api.retry if action == "retry" else jobs_api.cancel
                    result = fn(backend, job_id)
                self._stale("jobs", "live")
                return result
            case ["queues", queue, "purge"]:
                what = body.get("what")
                if what not in ("queued", "expired"):
                    raise BadRequest('purge needs {"what": "queued"} or {"what": "expired"}')
                if what == "queued" and body.get("confirm") != queue:
                    raise BadRequest(
                        f'purging queue {queue!r} needs {{"confirm": "{queue}"}} (type its name)'
                    )
                with self.sources.using("queue") as backend:
                    result = jobs_api.purge(backend, queue, what)
                self._stale("jobs", "live")
                return result
            case ["workflows", workflow_id, "signal"]:
                with self.sources.using("journal") as journal:
                    result = workflows_api.signal(journal, workflow_id, body.get("name"), body.get("payload"))
                self._stale("workflows", "live")
                return result
            case ["workflows", workflow_id, "cancel"]:
                with self.sources.using("journal") as journal:
                    result = workflows_api.cancel(journal, workflow_id)
                self._stale("workflows", "live")
                return result
            case ["streams", stream, "groups", group, "replay"]:
                with self.sources.using("stream") as backend:
                    result = streams_api.replay(backend, stream, group, body)
                self._stale("streams", "live")
                return result
        raise LookupError(route)

    def _stale(self, *prefixes: str) -> None:
        for prefix in prefixes:
            self.cache.invalidate(prefix)
