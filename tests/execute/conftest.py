from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from foundry import Foundry
from tests.clusters import ENGINES, dask_cluster, ray_instance


@pytest.fixture
def app(home: Path, request: pytest.FixtureRequest) -> Iterator[Foundry]:
    """An app in a private FOUNDRY_HOME, closed (drained, then stopped) after the test."""
    app = Foundry(f"exec-{request.module.__name__.rsplit('.', 1)[-1]}")
    try:
        yield app
    finally:
        app.close(timeout=5)


@pytest.fixture(scope="session")
def dask_scheduler() -> Iterator[Any]:
    """One Dask LocalCluster (2 worker processes) for the whole session."""
    with dask_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def ray_url() -> Iterator[str]:
    """One private local Ray instance (2 CPUs) for the whole session."""
    with ray_instance() as url:
        yield url


@pytest.fixture(scope="session", params=ENGINES)
def cluster_url(request: pytest.FixtureRequest) -> str:
    """Where ``parallel`` computes its chunks: ``local://`` (this machine's processes),
    a Dask LocalCluster, or a local Ray instance; the conformance tests take this."""
    if request.param == "local":
        return "local://"
    if request.param == "dask":
        cluster = request.getfixturevalue("dask_scheduler")
        return str(cluster.scheduler_address)
    return str(request.getfixturevalue("ray_url"))
