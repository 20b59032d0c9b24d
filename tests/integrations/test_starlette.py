"""The Starlette/FastAPI lifespan against the real frameworks: the example service takes
an order, its in-process worker runs the job, and shutdown closes the app; without
workers the job waits in the store for `foundry worker`; a lifespan of the service's own
runs inside it; bad arguments name the fix."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from foundry import Foundry
from foundry.backends.queue import JobStatus, open_queue_backend
from foundry.errors import ConfigError
from foundry.integrations.starlette import lifespan

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """``examples/fastapi_app.py``, loaded fresh with its state under ``tmp_path``."""
    monkeypatch.setenv("FOUNDRY_HOME", str(tmp_path))
    spec = importlib.util.spec_from_file_location("fastapi_app_example", ROOT / "examples" / "fastapi_app.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the models' annotations through it
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        module.app.close()
        sys.modules.pop(spec.name, None)


def _poll(client: TestClient, job: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        body: dict[str, Any] = client.get(f"/jobs/{job}").json()
        if body["status"] == "succeeded" or time.monotonic() > deadline:
            return body
        time.sleep(0.02)


def test_the_fastapi_example_runs_a_job_on_its_in_process_worker_and_closes_the_app(
    example: ModuleType,
) -> None:
    # Given the example service with its development workers (the default)
    with TestClient(example.api) as client:
        # When an order comes in
        reply = client.post("/orders", json={"order_id": "o-7", "email": "ada@example.com"})
        assert reply.status_code == 202
        # Then the worker running inside the service sends the receipt
        body = _poll(client, reply.json()["job"])
        assert body == {
            "job": reply.json()["job"],
            "status": "succeeded",
            "result": "receipt for o-7 sent to ada@example.com",
        }
        assert client.get("/jobs/nope").status_code == 404
    # And shutdown closed the app: its runners are gone
    assert example.app._runners == {}


def test_without_workers_the_job_waits_in_the_store(
    example: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the example's route under a lifespan without workers (FOUNDRY_DEV_WORKERS=0)
    api = example.FastAPI(lifespan=lifespan(example.app))
    api.post("/orders", status_code=202)(example.create_order)
    with TestClient(api) as client:
        job = client.post("/orders", json={"order_id": "o-8", "email": "b@example.com"}).json()["job"]
    # Then the job is queued, not run: a `foundry worker` elsewhere would take it
    backend = open_queue_backend(example.app.settings.queue)
    try:
        state = backend.get(job)
    finally:
        backend.close()
    assert state is not None
    assert state.status is JobStatus.QUEUED


def test_the_services_own_lifespan_runs_inside_and_its_state_is_merged(tmp_path: Path) -> None:
    app = Foundry("chained", home=tmp_path)
    events: list[str] = []

    @contextlib.asynccontextmanager
    async def own(_: Any) -> AsyncIterator[dict[str, str]]:
        events.append("own up")
        yield {"db": "connected"}
        events.append("own down")

    async def state(request: Request) -> JSONResponse:
        return JSONResponse({"db": request.state.db, "foundry": request.state.foundry.name})

    service = Starlette(routes=[Route("/", state)], lifespan=lifespan(app, workers=["queue"], then=own))
    with TestClient(service) as client:
        assert client.get("/").json() == {"db": "connected", "foundry": "chained"}
    assert events == ["own up", "own down"]


def test_bad_arguments_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a Foundry app"):
        lifespan("app:app")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"unknown kind\(s\) queues.*queue, workflows"):
        lifespan(Foundry("x", home=tmp_path), workers=["queues"])
