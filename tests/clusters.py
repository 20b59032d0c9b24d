"""Compute clusters for the ``parallel`` tests: a local Dask ``LocalCluster`` (processes,
two workers) and a private local Ray instance (two CPUs), each started once per test
session and shared, so the conformance tests run on local processes, Dask and Ray
through one fixture (``cluster_url``, defined in ``tests/execute/conftest.py``).

A missing driver (``pip install -e ".[dev]"`` installs both) skips locally and fails
under CI=true, as a missing server does (``tests.services``).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("local", "dask", "ray")
# A chunk whose worker dies is re-run once, then fails (the engines' default is 3: each
# run of the crash test would kill four workers and wait for four restarts).
RAY_URL = "ray://local?num_cpus=2&max_retries=1"
ALLOWED_FAILURES = 1


def require_driver(module: str, extra: str) -> Any:
    """Import ``module`` or skip (locally) / fail (CI=true)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        message = f'{module} is not installed ({exc}); pip install -e ".[{extra}]"'
        if os.environ.get("CI"):
            pytest.fail(f"{message} and CI=true: a missing driver is a failure, not a skip")
        pytest.skip(message)


@contextmanager
def importable_tests() -> Iterator[None]:
    """Workers started by a cluster import the mapped functions by name (``tests.…``):
    give them the repository root on ``PYTHONPATH``, as pytest gives it to this process."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), old) if p)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


@contextmanager
def dask_cluster(workers: int = 2) -> Iterator[Any]:
    """A Dask ``LocalCluster`` of ``workers`` single-threaded worker processes (each under
    a nanny that restarts it if it dies); yields the cluster (``.scheduler_address``)."""
    distributed = require_driver("distributed", "dask")
    import dask

    with importable_tests(), dask.config.set({"distributed.scheduler.allowed-failures": ALLOWED_FAILURES}):
        cluster = distributed.LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address="127.0.0.1:0",
            silence_logs=logging.ERROR,
        )
    try:
        yield cluster
    finally:
        cluster.close(timeout=30)


@contextmanager
def ray_instance() -> Iterator[str]:
    """A private local Ray instance (two CPUs), held open by one engine for the whole
    session so every executor's engine reuses the connection; yields its URL."""
    require_driver("ray", "ray")
    from foundry.backends.cluster import open_cluster

    with importable_tests():
        holder = open_cluster(RAY_URL)
    try:
        yield RAY_URL
    finally:
        holder.close()
