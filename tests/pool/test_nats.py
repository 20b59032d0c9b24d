"""What only the pool over NATS has (the contract every engine shares is in
``test_conformance.py``): a fully busy pool queues a request at a host instead of making
its client poll — each attempt is at most two publishes, the free subject and then the
waiting line — and the host announces what waits there so a client can watch it."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from foundry import Foundry
from tests.pool import _serve, units
from tests.pool.conftest import lines
from tests.services import require


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    url = f"{require('nats')}?prefix=t{uuid.uuid4().hex[:10]}"
    log = tmp_path / "serve.log"
    proc = _serve.serve(url, ["slow"], log, FOUNDRY_POOL=url)
    try:
        _serve.wait_ready(log, 1, proc)
        yield url
    finally:
        assert _serve.stop(proc) == 0, log.read_text()


def test_a_busy_pool_queues_at_a_host_and_the_client_never_polls(served: str, tmp_path: Path) -> None:
    app = Foundry("served", pool=served, home=tmp_path / "home")
    try:
        slow = units.declare(app)["slow"]  # one worker
        log = str(tmp_path / "runs.log")
        assert isinstance(slow(log, "warm-up", 0.0), int)
        nc = slow.runner.engine._io.nc  # type: ignore[attr-defined]
        before = nc.stats["out_msgs"]
        # Given ten requests for one worker: nine wait, most of them far longer than the
        # 0.1 s after which the host says "it waits here"
        started = time.monotonic()
        handles = [slow.submit(log, f"r{i}", 0.1) for i in range(10)]
        assert all(isinstance(h.result(timeout=30), int) for h in handles)
        # Then each request cost at most two publishes (free subject, waiting line): no
        # client polled while the worker was busy ...
        assert nc.stats["out_msgs"] - before <= 20
        # ... and they ran one after the other on the one worker, no slower than that.
        assert time.monotonic() - started < 10
    finally:
        app.close()


def test_churning_subscriptions_never_drop_a_request(tmp_path: Path) -> None:
    """A host subscribes to the free subject and drops it again many times a second. NATS
    may deliver a message it routed just before the UNSUB after it; the host must still
    serve it (a request dropped there would only end at its deadline, "may or may not have
    happened", though it never ran). 3000 requests from 8 callers on 2 workers: every one
    answered well within its deadline."""
    url = f"{require('nats')}?prefix=t{uuid.uuid4().hex[:10]}"
    log = tmp_path / "serve.log"
    proc = _serve.serve(url, ["square"], log, FOUNDRY_POOL=url)
    app = Foundry("served", pool=url, home=tmp_path / "home")
    try:
        _serve.wait_ready(log, 1, proc)
        square = units.declare(app)["square"]

        def one(i: int) -> object:
            try:
                return square.options(deadline="5s").submit(i).result(timeout=30)
            except Exception as exc:
                return exc

        with ThreadPoolExecutor(8) as callers:
            outcomes = list(callers.map(one, range(3000)))
        failed = [o for o in outcomes if not isinstance(o, int)]
        assert not failed, failed[:3]
        assert outcomes == [i * i for i in range(3000)]
    finally:
        app.close()
        assert _serve.stop(proc) == 0, log.read_text()


def test_a_draining_host_sends_back_what_waits_and_another_host_runs_it(tmp_path: Path) -> None:
    """SIGTERM on a host: the request it runs finishes there; the ones waiting in its line
    never ran, so they are sent back and the clients send them to another host."""
    url = f"{require('nats')}?prefix=t{uuid.uuid4().hex[:10]}"
    runs = tmp_path / "runs.log"
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    host_a = _serve.serve(url, ["slow"], log_a, FOUNDRY_POOL=url)  # one worker each
    host_b = None
    app = Foundry("served", pool=url, home=tmp_path / "home")
    try:
        _serve.wait_ready(log_a, 1, host_a)
        slow = units.declare(app)["slow"]
        # Given host A alone: r0 runs on its one worker (long enough for B to start),
        # r1..r3 wait in its line
        handles = [slow.submit(str(runs), "r0", 10.0)]
        _wait_for_lines(runs, 1)
        handles += [slow.submit(str(runs), f"r{i}", 0.1) for i in (1, 2, 3)]
        time.sleep(0.3)
        host_b = _serve.serve(url, ["slow"], log_b, FOUNDRY_POOL=url)
        _serve.wait_ready(log_b, 1, host_b)
        assert len(lines(runs)) == 1, "A's worker finished r0 before B was up: the test proved nothing"
        # When A drains
        host_a.send_signal(signal.SIGTERM)
        # Then every caller gets its value: r0 from A, the others from B
        assert all(isinstance(h.result(timeout=30), int) for h in handles)
        assert host_a.wait(30) == 0
        ran = dict(lines(runs))
        assert sorted(ran) == ["r0", "r1", "r2", "r3"]
        assert ran["r1"] == ran["r2"] == ran["r3"] != ran["r0"]
    finally:
        app.close()
        if host_a.poll() is None:
            host_a.kill()
        if host_b is not None:
            assert _serve.stop(host_b) == 0, log_b.read_text()


def _wait_for_lines(path: Path, n: int, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while len(lines(path)) < n:
        assert time.monotonic() < end, f"{path} has {len(lines(path))} lines, not {n}"
        time.sleep(0.01)


class _FakeHost:
    """A host of unit ``square`` as NATS sees one, played by the test: subscribed to the
    free subject (in the queue group) and to its own, heartbeating ``beat`` every 0.25 s
    while ``beating``; each request is handed to :meth:`take` on its event loop."""

    def __init__(self, url: str, name: str) -> None:
        from foundry.backends.pool.nats import parse_url, subjects_for

        servers, prefix = parse_url(url)
        self.name = name
        self.subjects = subjects_for(prefix, "served", "square")
        self.taken = 0
        self.beating = True
        self.beat = b"2"
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.nc: Any = asyncio.run_coroutine_threadsafe(self._connect(servers), self.loop).result(10)

    async def _connect(self, servers: list[str]) -> Any:
        import nats

        nc = await nats.connect(servers=servers)

        async def take(msg: Any) -> None:
            if msg.data:  # (an empty one is a client's probe)
                self.taken += 1
                await self.take(nc, msg)

        await nc.subscribe(self.subjects.work, queue=self.subjects.queue, cb=take)
        await nc.subscribe(self.subjects.at(self.name), cb=take)

        async def beat() -> None:
            while self.beating:
                await nc.publish(f"{self.subjects.heartbeat}.{self.name}", self.beat)
                await asyncio.sleep(0.25)

        self._beat = self.loop.create_task(beat())
        return nc

    async def take(self, nc: Any, msg: Any) -> None:
        """What this host does with a request: nothing (a cut-off host never answers)."""

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.beating = False
        try:
            asyncio.run_coroutine_threadsafe(self.nc.close(), self.loop).result(10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
            self.loop.close()


class _Zombie(_FakeHost):
    """A host as NATS sees one that was cut off: subscribed, heartbeating at first, then
    silent (``beating = False``) and never answering."""

    def __init__(self, url: str) -> None:
        super().__init__(url, "zombie")


class _Drainer(_FakeHost):
    """A host that takes a request, says it holds it (QUEUED), then starts to close — it
    beats "bye" from then on — and answers it 1.3 s later, as a draining host finishes
    what it runs."""

    def __init__(self, url: str) -> None:
        super().__init__(url, "drainer")

    async def take(self, nc: Any, msg: Any) -> None:
        from foundry.backends.pool._common import QUEUED, decode_request, encode_reply
        from foundry.backends.pool.base import OK
        from foundry.backends.pool.nats import BYE

        await nc.publish(msg.reply, encode_reply(QUEUED, self.name.encode()))
        _, body = decode_request(msg.data)
        [x], _ = json.loads(body)

        async def drain_then_answer() -> None:
            await asyncio.sleep(1.2)  # past the client's 1 s of silence after the notice
            self.beat = BYE
            await asyncio.sleep(1.3)
            await nc.publish(msg.reply, encode_reply(OK, json.dumps(x * x).encode(), 0.001))

        self._answering = self.loop.create_task(drain_then_answer())


def test_a_host_that_falls_silent_but_stays_subscribed_is_steered_around(tmp_path: Path) -> None:
    """nats-server does not notice a cut-off host while it has messages to deliver to it
    (it delays its PINGs on traffic), so the host keeps its share of the free subject for
    as long as requests flow: each attempt sent there is lost after its timeout. A client
    that stopped hearing a host's heartbeat sends around it, to a live host's own line,
    until the server answers "no responders" on the silent host's own subject."""
    url = f"{require('nats')}?prefix=t{uuid.uuid4().hex[:10]}"
    log = tmp_path / "serve.log"
    proc = _serve.serve(url, ["square"], log, FOUNDRY_POOL=url)
    app = Foundry("served", pool=url, home=tmp_path / "home")
    zombie = None
    try:
        _serve.wait_ready(log, 1, proc)
        square = units.declare(app)["square"]
        assert square(3) == 9  # the client listens to the hosts' heartbeats from now on
        engine = square.runner.engine  # type: ignore[attr-defined]
        zombie = _Zombie(url)
        end = time.monotonic() + 10
        while "zombie" not in engine._heard:
            assert time.monotonic() < end, "the client never heard the second host"
            time.sleep(0.05)
        # Given the zombie falls silent and the client has held it suspect
        zombie.beating = False
        end = time.monotonic() + 10
        while "zombie" not in engine._suspects:
            assert time.monotonic() < end, "the client never held the silent host suspect"
            time.sleep(0.05)
        # When 40 requests go out while the zombie is still subscribed
        taken_before = zombie.taken
        with ThreadPoolExecutor(4) as callers:
            results = list(callers.map(lambda i: square.submit(i).result(timeout=30), range(40)))
        # Then every one was answered by the live host: none was handed to the zombie
        assert results == [i * i for i in range(40)]
        assert zombie.taken == taken_before, "requests were sent to a host that fell silent"
        assert app.metrics.value("foundry_pool_retries_total", unit="square") == 0
        # And once the server dropped the zombie's subscriptions, the client forgets it
        zombie.close()
        end = time.monotonic() + 10
        while "zombie" in engine._suspects:
            assert time.monotonic() < end, "the probe never saw the silent host's subject go"
            time.sleep(0.05)
        assert square(4) == 16
    finally:
        app.close()
        if zombie is not None:
            zombie.close()
        assert _serve.stop(proc) == 0, log.read_text()


def test_a_draining_host_still_running_a_request_is_not_taken_for_dead(tmp_path: Path) -> None:
    """A host that closes says "bye" (it holds no subscription, so no client may hold it
    suspect) and goes on finishing what it runs; its heartbeats, "bye" from then on, keep
    what it holds alive for the client, which gets the answer, not a loss."""
    url = f"{require('nats')}?prefix=t{uuid.uuid4().hex[:10]}"
    app = Foundry("served", pool=url, home=tmp_path / "home")
    drainer = _Drainer(url)
    try:
        square = units.declare(app)["square"]
        # Given a host that holds a request and then starts to drain ...
        handle = square.submit(7)
        # ... then the request is answered when the host finishes it, 2.5 s later
        assert handle.result(timeout=10) == 49
        assert drainer.taken == 1
        engine = square.runner.engine  # type: ignore[attr-defined]
        assert "drainer" in engine._closing
        assert "drainer" not in engine._suspects
        assert app.metrics.value("foundry_pool_lost_total", unit="square") == 0
    finally:
        app.close()
        drainer.close()
