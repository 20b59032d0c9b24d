"""Real servers for tests: skip on a laptop without them, fail under CI=true.

Nothing passes by skipping in CI: when ``CI`` is set, a missing server is a failure.
"""

from __future__ import annotations

import os
import socket

import pytest

SERVICES: dict[str, tuple[str, int]] = {
    "postgres": ("127.0.0.1", 5432),
    "redis": ("127.0.0.1", 6379),
    "rabbitmq": ("127.0.0.1", 5672),
    "nats": ("127.0.0.1", 4222),
}

URLS: dict[str, str] = {
    "postgres": os.environ.get("FOUNDRY_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"),
    "redis": os.environ.get("FOUNDRY_TEST_REDIS", "redis://127.0.0.1:6379/0"),
    "rabbitmq": os.environ.get("FOUNDRY_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672/"),
    "nats": os.environ.get("FOUNDRY_TEST_NATS", "nats://127.0.0.1:4222"),
}


def reachable(name: str, timeout: float = 1.0) -> bool:
    host, port = SERVICES[name]
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def require(name: str) -> str:
    """Return the service URL, or skip (locally) / fail (CI) when it is down."""
    if reachable(name):
        return URLS[name]
    message = f"{name} is not reachable at {SERVICES[name][0]}:{SERVICES[name][1]}"
    if os.environ.get("CI"):
        pytest.fail(f"{message} and CI=true: a missing server is a failure, not a skip")
    pytest.skip(message)
    raise AssertionError("unreachable")
