"""``Sandbox`` directly (what the fixtures hold): eager jobs behave like the real queue's,
the clock drives what waits on time, and leaving gives the app back."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from foundry import Foundry, RemoteError, Status
from foundry.testing import ManualClock, Sandbox


class Declined(Exception):
    pass


def test_results_and_arguments_go_through_the_codec(tmp_path: Path) -> None:
    app = Foundry("codec")
    seen: list[object] = []

    @app.work(durable=True)
    def pair(items: Any) -> Any:  # Any: plain JSON
        seen.append(items)
        return items

    @app.work(durable=True)
    def typed_pair(items: tuple[int, int]) -> tuple[int, int]:
        seen.append(items)
        return items

    with Sandbox(app, home=tmp_path):
        # JSON has no tuples: an undeclared one arrives as a list, as on a real queue ...
        assert pair.submit((1, 2)).result(timeout=0) == [1, 2]
        # ... and a declared one is rebuilt by its annotation, on both sides
        assert typed_pair.submit((1, 2)).result(timeout=0) == (1, 2)
    assert seen == [[1, 2], (1, 2)]
    assert type(seen[1]) is tuple


def test_a_keyed_job_runs_once_and_its_duplicate_gets_the_first_handle(tmp_path: Path) -> None:
    app = Foundry("keys")
    runs: list[int] = []

    @app.work(durable=True)
    def send(n: int) -> int:
        runs.append(n)
        return n

    with Sandbox(app, home=tmp_path):
        first = send.options(key="mail-1").submit(1)
        again = send.options(key="mail-1").submit(2)
        assert again.id == first.id
        assert again.result(timeout=0) == 1
    assert runs == [1]


def test_a_delayed_job_waits_for_the_clock_and_can_be_cancelled(tmp_path: Path) -> None:
    app = Foundry("delay")
    runs: list[str] = []

    @app.work(durable=True)
    def remind(who: str) -> str:
        runs.append(who)
        return who

    clock = ManualClock()
    with Sandbox(app, home=tmp_path, clock=clock):
        later = remind.options(delay="10m").submit("ann")
        dropped = remind.options(delay="5m").submit("bob")
        assert later.status == Status.QUEUED
        assert dropped.cancel()
        clock.advance(599)
        assert runs == []
        clock.advance(1)
        assert later.result(timeout=0) == "ann"
        assert dropped.status == Status.CANCELLED
    assert runs == ["ann"]


def test_retries_run_at_once_and_the_original_error_arrives(tmp_path: Path) -> None:
    app = Foundry("retry")
    attempts: list[int] = []

    @app.work(durable=True, retries=3, retry_on=(ConnectionError,))
    def fetch(n: int) -> int:
        attempts.append(n)
        if len(attempts) < 3:
            raise ConnectionError("try again")
        raise Declined("no")

    with Sandbox(app, home=tmp_path):
        handle = fetch.submit(7)
        with pytest.raises(Declined, match="no"):
            handle.result(timeout=0)
        assert handle.status == Status.FAILED
    assert attempts == [7, 7, 7]  # two retried ConnectionErrors, then a failure retry_on does not name


def test_an_error_the_real_path_cannot_rebuild_arrives_as_it_would_there(tmp_path: Path) -> None:
    app = Foundry("allow")
    # defined in this function's scope but raised as a type of another module: not allow-listed
    Foreign = type("Foreign", (Exception,), {"__module__": "somewhere.else"})

    @app.work(durable=True)
    def fail() -> None:
        raise Foreign("from elsewhere")

    with Sandbox(app, home=tmp_path), pytest.raises(RemoteError) as caught:
        fail.submit().result(timeout=0)
    assert isinstance(caught.value.__cause__, Foreign)
    assert any("allow-list" in note for note in caught.value.__notes__)


def test_an_async_unit_runs_eagerly_from_sync_and_async_code(tmp_path: Path) -> None:
    app = Foundry("async")

    @app.work(durable=True)
    async def slow_double(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    async def from_a_loop() -> int:
        handle = await slow_double.asubmit(4)
        return int(await handle)

    with Sandbox(app, home=tmp_path):
        assert slow_double.submit(3).result(timeout=0) == 6
        assert asyncio.run(from_a_loop()) == 8


def test_a_workflow_step_submits_an_eager_job(tmp_path: Path) -> None:
    app = Foundry("nested")

    @app.work(durable=True)
    def price(sku: str) -> float:
        return {"a": 2.5}[sku]

    def quote(sku: str) -> float:
        return float(price.submit(sku).result(timeout=0))

    @app.workflow()
    def checkout(wf, sku: str) -> float:  # type: ignore[no-untyped-def]
        wf.sleep("30s")
        return float(wf.step(quote, sku))

    clock = ManualClock()
    with Sandbox(app, home=tmp_path, clock=clock):
        handle = checkout.start("a")
        clock.advance(30)
        assert handle.result(timeout=10) == 2.5


def test_leaving_gives_the_app_its_own_settings_and_deliveries_back(tmp_path: Path) -> None:
    app = Foundry("restore", home=tmp_path / "own")
    before = app.settings

    @app.work(durable=True)
    def noop() -> None:
        return None

    with Sandbox(app, home=tmp_path / "sandbox") as sandbox:
        assert app.settings.home == sandbox.home
        noop.submit().result(timeout=0)
    assert app.settings is before
    assert app._routes == {}
    assert type(noop.runner).__name__ == "QueueRunner"  # the real one again: a worker is needed
    app.close()


def test_one_sandbox_per_app(tmp_path: Path) -> None:
    app = Foundry("twice")
    with Sandbox(app, home=tmp_path / "a"), pytest.raises(Exception, match="already held"):
        Sandbox(app, home=tmp_path / "b").open()


def test_the_clock_refuses_to_go_back() -> None:
    clock = ManualClock(start=1000.0)
    with pytest.raises(Exception, match="only moves forward"):
        clock.advance(-1)
    clock.advance(5)
    assert clock.time() == 1005.0


def test_a_publish_returns_once_the_consumers_have_handled_it(tmp_path: Path) -> None:
    app = Foundry("streams")
    events = app.stream("signups", key="user")
    welcomed: list[str] = []

    @events.consumer(group="welcome", max_deliveries=2, retry_backoff="10ms")
    def welcome(event) -> None:  # type: ignore[no-untyped-def]
        if event["user"] == "mallory":
            raise PermissionError(f"no welcome for {event['user']}")
        welcomed.append(event["user"])

    with Sandbox(app, home=tmp_path) as sandbox:
        events.publish({"user": "ann"})
        assert welcomed == ["ann"]  # handled before publish returned: nothing to drain
        events.publish_many([{"user": "bob"}, {"user": "cy"}])
        assert welcomed == ["ann", "bob", "cy"]
        with pytest.raises(PermissionError, match="no welcome for mallory"):
            events.publish({"user": "mallory"})  # retried, dead-lettered: its own error
        assert len(events.dead_letters("welcome")) == 1
        events.publish({"user": "dee"})  # the group went on past it
        assert welcomed[-1] == "dee"
        asyncio.run(events.apublish({"user": "eve"}))  # the async publish waits for it too
        assert welcomed[-1] == "eve"
        with pytest.raises(PermissionError, match="no welcome for mallory"):
            asyncio.run(events.apublish_many([{"user": "fay"}, {"user": "mallory"}]))
        assert welcomed[-1] == "fay"
        assert (sandbox.home / "stream.db").exists()


def test_advance_stops_at_every_timer_on_the_way(tmp_path: Path) -> None:
    app = Foundry("steps")

    @app.workflow()
    def metronome(wf) -> list[float]:  # type: ignore[no-untyped-def]
        beats = []
        for _ in range(3):
            wf.sleep("20s")
            beats.append(wf.now())
        return beats

    clock = ManualClock(start=1_000_000.0)
    with Sandbox(app, home=tmp_path, clock=clock):
        handle = metronome.start()
        clock.advance(60)  # one call: each sleep ends at its own instant, and the next starts there
        assert handle.result(timeout=10) == [1_000_020.0, 1_000_040.0, 1_000_060.0]
        assert clock.time() == 1_000_060.0
