"""One conformance suite for every pool engine: the embedded pool (``local://``, workers
started by the app), the served pool (``local://served``, workers started by ``foundry
pool serve`` in another process, reached over a Unix socket) and NATS (``nats://``,
``foundry pool serve`` behind a NATS server).

Each test states the part of the contract in ``foundry.backends.pool.base`` it checks:
one answer per attempt, deadlines, no-worker fast failure, overload refusal, loss on
worker death (never twice unless idempotent), idempotent retry, cancel before dispatch,
and drain on close. The served engines share one ``foundry pool serve`` per module;
tests that stop or kill a server start their own.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from foundry import Foundry
from foundry.backends.pool.base import LOST, OK, Attempt, Done, Reply
from foundry.errors import (
    CancelledError,
    DeadlineExceededError,
    NoWorkerError,
    OverloadError,
    WorkerLostError,
)
from foundry.units import WorkUnit
from tests.pool import _serve, units
from tests.pool.conftest import lines
from tests.services import require

ENGINES = ("local", "served", "nats")


@dataclass
class Server:
    """Where one engine's workers are: the pool URL the client uses, its home, and the
    ``foundry pool serve`` process (``None`` for the embedded pool)."""

    kind: str
    url: str
    home: Path
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    def stop(self) -> int:
        assert self.proc is not None
        return _serve.stop(self.proc)


def start_server(kind: str, where: Path, names: tuple[str, ...] = units.SERVED) -> Server:
    home = where / "home"
    if kind == "local":
        return Server(kind, "local://", home)
    if kind == "served":
        serve_url, client_url = "local://", "local://served"
    else:
        serve_url = client_url = f"{require('nats')}?prefix=t{uuid.uuid4().hex[:10]}"
    log = where / f"serve-{uuid.uuid4().hex[:6]}.log"
    proc = _serve.serve(serve_url, names, log, FOUNDRY_HOME=str(home), FOUNDRY_POOL=serve_url)
    try:
        _serve.wait_ready(log, len(names), proc)
    except BaseException:
        proc.kill()
        proc.wait(10)
        raise
    return Server(kind, client_url, home, proc, log)


@pytest.fixture(scope="module", params=ENGINES)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    where = tmp_path_factory.mktemp(request.param)
    running = start_server(request.param, where)
    try:
        yield running
    finally:
        if running.proc is not None:
            assert running.stop() == 0, running.log.read_text() if running.log else ""


@dataclass
class Engine:
    """A client app (named like the served one) with the conformance units declared."""

    server: Server
    app: Foundry
    units: dict[str, WorkUnit] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.server.kind


def client(server: Server) -> Engine:
    app = Foundry("served", pool=server.url, home=server.home)
    return Engine(server, app, units.declare(app))


@pytest.fixture
def engine(server: Server) -> Iterator[Engine]:
    made = client(server)
    try:
        yield made
    finally:
        made.app.close(timeout=10)


@contextmanager
def own_server(kind: str, where: Path, names: tuple[str, ...]) -> Iterator[tuple[Server, Engine]]:
    """A server (and a client) of the test's own, for tests that stop or kill it."""
    running = start_server(kind, where, names)
    made = client(running)
    try:
        yield running, made
    finally:
        made.app.close(timeout=5)
        if running.proc is not None and running.proc.poll() is None:
            running.proc.kill()
            running.proc.wait(10)


# -- one answer per attempt ------------------------------------------------------------


def test_every_request_gets_its_own_answer(engine: Engine) -> None:
    # Given a unit on two workers; when 300 requests are in flight at once ...
    square = engine.units["square"]
    assert square(12) == 144
    handles = [square.submit(i) for i in range(300)]
    # ... then each caller gets its own result, exactly once.
    assert [h.result(timeout=60) for h in handles] == [i * i for i in range(300)]

    async def main() -> list[int]:
        pending = [await square.asubmit(i) for i in range(20)]
        return [await h for h in pending]

    assert asyncio.run(main()) == [i * i for i in range(20)]


def test_the_functions_own_exception_reaches_the_caller(engine: Engine) -> None:
    with pytest.raises(ValueError, match="no such order"):
        engine.units["fail"]("no such order")
    assert engine.app.metrics.value("foundry_unit_failed_total", unit="fail", model="pool") == 1


# -- deadlines -------------------------------------------------------------------------


def test_no_free_worker_within_the_deadline_is_a_clear_error_and_nothing_ran(
    engine: Engine, tmp_path: Path
) -> None:
    log = tmp_path / "runs.log"
    slow = engine.units["slow"]  # one worker
    first = slow.submit(str(log), "first", 1.0)
    _wait_for(lambda: len(lines(log)) == 1)  # the one worker is busy with it
    second = slow.options(deadline="0.2s").submit(str(log), "second", 0.0)
    with pytest.raises(DeadlineExceededError, match="no worker was free") as caught:
        second.result(timeout=10)
    assert "did not run" in str(caught.value)
    assert isinstance(first.result(timeout=10), int)
    time.sleep(0.2)
    assert [key for key, _ in lines(log)] == ["first"]


def test_an_attempt_past_its_timeout_is_lost_and_its_worker_replaced(engine: Engine) -> None:
    nap = engine.units["nap"]  # timeout 0.3 s
    started = time.monotonic()
    with pytest.raises(WorkerLostError, match=r"did not answer within 0\.3s"):
        nap(5.0)
    assert time.monotonic() - started < 3.0  # killed at its timeout, not at the end of its work
    assert isinstance(nap(0.0), int)  # a replacement took over


# -- no worker, overload -----------------------------------------------------------------


def test_no_worker_fails_in_under_50_ms(engine: Engine) -> None:
    nobody = units.declare_unserved(engine.app)
    with pytest.raises(NoWorkerError):
        nobody.submit(1).result(timeout=30)  # the first may start (and lose) a worker or connect
    for _ in range(5):
        started = time.perf_counter()
        with pytest.raises(NoWorkerError, match="did not run"):
            nobody.submit(1).result(timeout=5)
        assert time.perf_counter() - started < 0.05


def test_a_full_intake_refuses_at_once_and_nothing_waits_without_limit(engine: Engine) -> None:
    hold = engine.units["hold"]  # max_pending=2
    held = [hold.submit(0.5), hold.submit(0.5)]
    started = time.monotonic()
    with pytest.raises(OverloadError, match="max_pending=2"):
        hold.submit(0.5)
    assert time.monotonic() - started < 0.5
    assert engine.app.metrics.value("foundry_pool_rejected_total", unit="hold") == 1
    assert all(isinstance(h.result(timeout=10), int) for h in held)


# -- loss -----------------------------------------------------------------------------------


def _kill_latest(log: Path, stop: threading.Event, killed: list[int]) -> None:
    """SIGKILL the worker that most recently started a request, every 0.3 s (never twice
    for one key, so an idempotent request's retries are not chased down)."""
    keys: set[str] = set()
    while not stop.wait(0.3):
        recorded = lines(log)
        if not recorded or recorded[-1][1] in killed or recorded[-1][0] in keys:
            continue
        key, pid = recorded[-1]
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        killed.append(pid)
        keys.add(key)


def _drive(unit: WorkUnit, log: Path, prefix: str, n: int = 40) -> tuple[list[Any], list[int]]:
    """``n`` requests from 4 callers while their workers are being SIGKILLed; each
    caller's outcome (a value or the exception), in request order."""
    stop = threading.Event()
    killed: list[int] = []
    killer = threading.Thread(target=_kill_latest, args=(log, stop, killed))

    def one(i: int) -> Any:
        try:
            return unit.submit(str(log), f"{prefix}-{i}", 0.15).result(timeout=60)
        except Exception as exc:
            return exc

    killer.start()
    try:
        with ThreadPoolExecutor(4) as callers:
            outcomes = list(callers.map(one, range(n)))
    finally:
        stop.set()
        killer.join()
    return outcomes, killed


def test_sigkill_mid_request_never_runs_a_non_idempotent_request_twice(
    engine: Engine, tmp_path: Path
) -> None:
    log = tmp_path / "once.log"
    once = engine.units["once"]
    # When: workers are SIGKILLed while they run requests
    outcomes, killed = _drive(once, log, "once")
    # Then: every caller got exactly one answer, a value or WorkerLostError ...
    assert killed, "the test killed no worker, so it proved nothing"
    lost = [o for o in outcomes if isinstance(o, WorkerLostError)]
    assert lost, "no request was in a killed worker"
    assert all(isinstance(o, int | WorkerLostError) for o in outcomes), outcomes
    for error in lost:
        assert "died (SIGKILL)" in str(error)  # the dispatcher saw it die, at once
        assert "may or may not have happened" in str(error)
        assert "not declared idempotent" in str(error)
    # ... and nothing ran twice: each key at most one line; a successful one exactly one
    runs = Counter(key for key, _ in lines(log))
    assert max(runs.values()) == 1, [k for k, n in runs.items() if n > 1]
    assert all(runs[f"once-{i}"] == 1 for i, o in enumerate(outcomes) if isinstance(o, int))
    metrics = engine.app.metrics
    assert metrics.value("foundry_unit_in_flight", unit="once", model="pool") == 0
    assert metrics.value("foundry_pool_lost_total", unit="once") == len(lost)
    assert metrics.value("foundry_pool_retries_total", unit="once") == 0


def test_sigkill_mid_request_retries_an_idempotent_unit_and_each_caller_sees_one_result(
    engine: Engine, tmp_path: Path
) -> None:
    log = tmp_path / "keep.log"
    keep = engine.units["keep"]
    outcomes, killed = _drive(keep, log, "keep")
    assert killed, "the test killed no worker, so it proved nothing"
    assert all(isinstance(o, int) for o in outcomes), [o for o in outcomes if not isinstance(o, int)]
    runs = Counter(key for key, _ in lines(log))
    assert all(runs[f"keep-{i}"] >= 1 for i in range(len(outcomes)))
    retried = engine.app.metrics.value("foundry_pool_retries_total", unit="keep")
    assert retried >= 1, "no attempt was lost, so the retry path was not exercised"
    assert sum(runs.values()) - len(outcomes) <= retried  # an extra run is a retried attempt, no more


def test_a_lost_attempt_of_an_idempotent_unit_goes_to_another_worker_with_the_same_key(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "keep.log"
    keep = engine.units["keep"]  # idempotent, two workers
    assert isinstance(keep(str(log), "warm", 0.0), int)
    # Given: every attempt the runtime hands to the engine, and what came back of it
    attempts: list[tuple[Attempt, Reply]] = []
    pool = keep.runner.engine
    send = pool.send

    def seen(attempt: Attempt, done: Done) -> None:
        def answered(reply: Reply) -> None:
            attempts.append((attempt, reply))
            done(reply)

        send(attempt, answered)

    monkeypatch.setattr(pool, "send", seen)
    # When: the worker running a keyed request is SIGKILLed mid-request
    handle = keep.options(key="sign-42").submit(str(log), "sig", 1.0)
    _wait_for(lambda: "sig" in dict(lines(log)))
    killed = dict(lines(log))["sig"]
    os.kill(killed, signal.SIGKILL)
    # Then: the caller gets one result, from another worker ...
    ran_on = handle.result(timeout=30)
    assert ran_on != killed
    assert [key for key, _ in lines(log)] == ["warm", "sig", "sig"]
    assert lines(log)[-1][1] == ran_on
    # ... and both attempts of the request carried the caller's idempotency key
    assert [(a.request, a.key, a.number) for a, _ in attempts] == [
        (handle.id, "sign-42", 1),
        (handle.id, "sign-42", 2),
    ]
    assert [reply.kind for _, reply in attempts] == [LOST, OK]
    assert "died (SIGKILL)" in attempts[0][1].detail
    assert engine.app.metrics.value("foundry_pool_retries_total", unit="keep") == 1


# -- cancel ------------------------------------------------------------------------------


def test_cancel_takes_back_a_request_no_worker_has_and_never_a_running_one(
    engine: Engine, tmp_path: Path
) -> None:
    log = tmp_path / "runs.log"
    slow = engine.units["slow"]  # one worker
    running = slow.submit(str(log), "running", 1.0)
    _wait_for(lambda: len(lines(log)) == 1)
    waiting = slow.submit(str(log), "waiting", 0.0)
    time.sleep(0.1)
    # A request a worker holds cannot be recalled: False, and it runs to its answer.
    assert running.cancel() is False
    if engine.kind == "nats":
        # Handed to NATS, it may already sit in a host's line: not recalled, and answered.
        assert waiting.cancel() is False
        assert isinstance(waiting.result(timeout=10), int)
    else:
        # Still waiting for the one worker: taken back, and it never runs.
        assert waiting.cancel() is True
        assert waiting.status.value == "cancelled"
        with pytest.raises(CancelledError, match="did not run"):
            waiting.result(timeout=1)
    assert isinstance(running.result(timeout=10), int)
    time.sleep(0.2)
    expected = ["running", "waiting"] if engine.kind == "nats" else ["running"]
    assert [key for key, _ in lines(log)] == expected
    assert engine.app.metrics.value("foundry_unit_in_flight", unit="slow", model="pool") == 0


# -- drain -------------------------------------------------------------------------------


def test_close_drains_requests_in_flight(server: Server, tmp_path: Path) -> None:
    """The embedded pool drains on ``app.close``; a served one on SIGTERM of
    ``foundry pool serve``: running requests finish, none is lost."""
    log = tmp_path / "runs.log"
    with own_server(server.kind, tmp_path, ("drain",)) as (own, made):
        drain = made.units["drain"]  # two workers
        handles = [drain.submit(str(log), f"d{i}", 0.3) for i in range(2)]
        _wait_for(lambda: len(lines(log)) == 2)
        if own.proc is None:
            made.app.close(timeout=10)
        else:
            own.proc.send_signal(signal.SIGTERM)
        assert all(isinstance(h.result(timeout=20), int) for h in handles)
        if own.proc is not None:
            assert own.proc.wait(20) == 0
            with pytest.raises(NoWorkerError):  # nobody serves it any more
                drain.submit(str(log), "after", 0.0).result(timeout=5)
    assert sorted(key for key, _ in lines(log)) == ["d0", "d1"]


def _wait_for(condition: Any, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("the condition did not hold in time")
        time.sleep(0.01)
