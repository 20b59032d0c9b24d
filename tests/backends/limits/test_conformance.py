"""The limits contract (``foundry.backends.limits.base``), on every engine: the same
tests on SQLite, a private temporary SQLite (``memory://``), PostgreSQL and Redis
(RabbitMQ's jobs use the engine of its state store, one of these)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from foundry.backends.limits import Limit, LimitsBackend, limits_url, open_limits, scope_key
from foundry.errors import ConfigError, SubmitError
from tests.backends.queue.engines import drop_schema, engine_url

ENGINES = ["sqlite", "memory", "postgres", "redis"]


@pytest.fixture(params=ENGINES)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    made = "memory://" if request.param == "memory" else engine_url(request.param, tmp_path)
    yield made
    drop_schema(made)


@pytest.fixture
def store(url: str) -> Iterator[LimitsBackend]:
    backend = open_limits(url)
    try:
        yield backend
    finally:
        destroy = getattr(backend, "destroy", None)
        if callable(destroy):
            destroy()
        backend.close()


def unit() -> str:
    return f"u{uuid.uuid4().hex[:8]}"


def test_a_bucket_grants_its_burst_then_refuses_until_a_token_refills(store: LimitsBackend) -> None:
    limit = Limit(unit(), rate=20.0, burst=3)
    assert [store.acquire(limit, "", f"h{i}", lease=5).granted for i in range(3)] == [True] * 3
    refused = store.acquire(limit, "", "h3", lease=5)
    assert not refused.granted
    assert refused.limit == "rate_limit"
    assert 0 < refused.wait <= 1 / 20.0 + 1e-6
    assert store.tokens(limit.unit, "", limit) < 1
    deadline = time.monotonic() + 5
    while not store.acquire(limit, "", "h3", lease=5).granted:  # refills at 20 per second
        assert time.monotonic() < deadline, "the bucket never refilled"
        time.sleep(refused.wait)


def test_a_bucket_refills_only_up_to_its_burst(store: LimitsBackend) -> None:
    limit = Limit(unit(), rate=1000.0, burst=2)
    assert store.tokens(limit.unit, "", limit) == 2.0  # never used: full
    store.acquire(limit, "", "a", lease=5)
    time.sleep(0.05)  # 50 tokens' worth of time
    assert store.tokens(limit.unit, "", limit) == 2.0
    granted = [store.acquire(limit, "", f"h{i}", lease=5).granted for i in range(3)]
    assert granted.count(True) == 2 or granted == [True, True, True]  # a refill may land in between
    assert store.tokens(limit.unit, "", limit) <= 2.0


def test_slots_are_capped_and_a_release_frees_one_once(store: LimitsBackend) -> None:
    limit = Limit(unit(), slots=2)
    assert store.acquire(limit, "", "a", lease=30).granted
    assert store.acquire(limit, "", "b", lease=30).granted
    refused = store.acquire(limit, "", "c", lease=30)
    assert (refused.granted, refused.limit) == (False, "max_concurrency")
    assert refused.wait > 0
    assert store.in_use(limit.unit, "") == 2
    assert store.release(limit.unit, "", "a") is True
    assert store.release(limit.unit, "", "a") is False  # idempotent
    assert store.release(limit.unit, "", "never") is False
    assert store.acquire(limit, "", "c", lease=30).granted
    assert store.in_use(limit.unit, "") == 2


def test_acquiring_a_slot_it_holds_renews_it_and_takes_no_token(store: LimitsBackend) -> None:
    limit = Limit(unit(), rate=0.001, burst=2, slots=5)
    assert store.acquire(limit, "", "a", lease=30).granted
    assert store.acquire(limit, "", "a", lease=30).granted  # a retried call
    assert store.in_use(limit.unit, "") == 1
    assert store.acquire(limit, "", "b", lease=30).granted  # the second token is still there
    assert not store.acquire(limit, "", "c", lease=30).granted


def test_a_slot_lapses_with_its_lease_unless_renewed(store: LimitsBackend) -> None:
    limit = Limit(unit(), slots=1)
    assert store.acquire(limit, "", "dead", lease=0.3).granted
    assert not store.acquire(limit, "", "next", lease=5).granted
    time.sleep(0.45)
    assert store.in_use(limit.unit, "") == 0
    assert store.renew([(limit.unit, "", "dead")], lease=5) == 0  # lapsed: not taken back
    assert store.release(limit.unit, "", "dead") is False
    assert store.acquire(limit, "", "next", lease=0.5).granted
    for _ in range(3):  # renewed faster than it lapses: held throughout
        time.sleep(0.2)
        assert store.renew([(limit.unit, "", "next")], lease=0.5) == 1
    assert not store.acquire(limit, "", "other", lease=5).granted


def test_all_or_nothing_a_full_cap_takes_no_token_and_an_empty_bucket_no_slot(store: LimitsBackend) -> None:
    limit = Limit(unit(), rate=0.001, burst=2, slots=1)
    assert store.acquire(limit, "", "a", lease=30).granted
    assert not store.acquire(limit, "", "b", lease=30).granted  # refused by the cap
    assert store.tokens(limit.unit, "", limit) == pytest.approx(1.0, abs=0.01)  # its token was not taken
    store.release(limit.unit, "", "a")
    assert store.acquire(limit, "", "b", lease=30).granted  # the last token
    store.release(limit.unit, "", "b")
    refused = store.acquire(limit, "", "c", lease=30)
    assert (refused.granted, refused.limit) == (False, "rate_limit")
    assert store.in_use(limit.unit, "") == 0  # no slot taken by the refused call


def test_scopes_are_independent_per_key_and_per_unit(store: LimitsBackend) -> None:
    first, second = Limit(unit(), slots=1, rate=0.001, burst=1), Limit(unit(), slots=1, rate=0.001, burst=1)
    assert store.acquire(first, "alice", "a", lease=30).granted
    assert not store.acquire(first, "alice", "b", lease=30).granted
    assert store.acquire(first, "bob", "b", lease=30).granted
    assert store.acquire(second, "alice", "c", lease=30).granted
    assert (store.in_use(first.unit, "alice"), store.in_use(first.unit, "bob")) == (1, 1)


@pytest.fixture(params=[e for e in ENGINES if e != "memory"])  # memory:// is one object's own
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    made = engine_url(request.param, tmp_path)
    yield made
    drop_schema(made)


def test_racing_callers_on_their_own_connections_never_overshoot(shared_url: str) -> None:
    url = shared_url
    store = open_limits(url)
    slots, bucket = Limit(unit(), slots=3), Limit(unit(), rate=0.001, burst=5)
    stores = [open_limits(url) for _ in range(4)]
    granted: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(len(stores))

    def race(i: int, backend: LimitsBackend) -> None:
        start.wait(10)
        for n in range(6):
            for limit in (slots, bucket):
                if backend.acquire(limit, "", f"{i}-{n}", lease=30).granted:
                    with lock:
                        granted.append(limit.unit)

    threads = [threading.Thread(target=race, args=(i, s)) for i, s in enumerate(stores)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert granted.count(slots.unit) == 3
        assert granted.count(bucket.unit) == 5
        assert store.in_use(slots.unit, "") == 3
    finally:
        for s in [*stores, store]:
            s.close()


@pytest.mark.parametrize(
    ("limit", "key", "holder", "lease", "says"),
    [
        (Limit("u"), "", "h", 1.0, "neither a rate nor slots"),
        (Limit("u", rate=0.0, burst=1), "", "h", 1.0, "must be positive"),
        (Limit("u", rate=1.0, burst=0), "", "h", 1.0, "must be positive"),
        (Limit("u", slots=0), "", "h", 1.0, "slots=0"),
        (Limit("u", slots=1), "", "", 1.0, "holder"),
        (Limit("u", slots=1), "", "h", 0.0, "lease"),
        (Limit("u", slots=1), "x" * 201, "h", 1.0, "scope_key"),
    ],
)
def test_bad_arguments_are_refused_naming_the_fix(
    store: LimitsBackend, limit: Limit, key: str, holder: str, lease: float, says: str
) -> None:
    with pytest.raises(SubmitError, match=says) as caught:
        store.acquire(limit, key, holder, lease=lease)
    assert "Fix:" in str(caught.value)


def test_scope_keys_are_short_and_distinct() -> None:
    assert scope_key("alice") == "alice"
    assert scope_key(42) == "42"
    values: list[Any] = ["x" * 500, "x" * 501, {"a": 1}, ["a", 1], None, True, 1.5, "#alice"]
    keys = [scope_key(v) for v in values]
    assert len(set(keys)) == len(keys)
    assert all(len(k) <= 100 for k in keys)
    assert scope_key("x" * 500) == scope_key("x" * 500)


def test_the_limits_of_a_queue_live_in_its_engine(tmp_path: Path) -> None:
    assert limits_url("sqlite:///q.db") == "sqlite:///q.db"
    assert (
        limits_url("amqp://guest:guest@h/?prefix=app", tmp_path) == f"sqlite:///{tmp_path}/queue-amqp-app.db"
    )
    assert limits_url("amqp://h/?state=redis%3A%2F%2Fr%3A6379%2F0") == "redis://r:6379/0?prefix=foundry"
    assert limits_url("amqp://h/?state=postgresql%3A%2F%2Fdb%2Fapp").endswith("?prefix=foundry_")
    with pytest.raises(ConfigError, match="SQLite, PostgreSQL or Redis"):
        open_limits("nats://127.0.0.1:4222")
