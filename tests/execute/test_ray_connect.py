"""Connecting to a Ray cluster: a per-client server that died at birth is retried, and
nothing else is (a fake ``ray`` module stands in for the client)."""

from __future__ import annotations

from typing import Any

import pytest

from foundry.backends.cluster import ray as ray_cluster
from foundry.errors import ClusterUnavailableError


class _FakeRay:
    def __init__(self, failures: list[BaseException]) -> None:
        self.failures = failures
        self.inits = 0
        self.shutdowns = 0

    def init(self, **kwargs: Any) -> None:
        self.inits += 1
        if self.failures:
            raise self.failures.pop(0)

    def shutdown(self) -> None:
        self.shutdowns += 1


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("foundry.backends.cluster.ray.time.sleep", lambda seconds: None)


def test_a_server_that_died_at_birth_is_retried() -> None:
    fake = _FakeRay([ConnectionAbortedError("Initialization failure from server:\n...")])
    ray_cluster._init(fake, {"address": "ray://h:10001"}, "ray", "ray://h:10001")
    assert (fake.inits, fake.shutdowns) == (2, 1)


def test_it_gives_up_after_three_births_with_the_fix() -> None:
    fake = _FakeRay([ConnectionAbortedError("Initialization failure from server") for _ in range(5)])
    with pytest.raises(ClusterUnavailableError, match="Fix:"):
        ray_cluster._init(fake, {}, "ray", "ray://h:10001")
    assert fake.inits == 3


def test_any_other_connection_error_fails_at_once() -> None:
    fake = _FakeRay([ConnectionRefusedError("refused")])
    with pytest.raises(ClusterUnavailableError, match="ConnectionRefusedError"):
        ray_cluster._init(fake, {}, "ray", "ray://h:10001")
    assert fake.inits == 1
