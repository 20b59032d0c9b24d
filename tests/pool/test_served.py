"""What only a served pool has: a ``foundry pool serve`` process between the app and its
workers. Killed with SIGKILL, or stopped (SIGSTOP), it never leaves a caller hanging:
every request it held is answered with a clear error within its deadline, and later
submits fail fast. On ``local://`` it owns its socket: a second server refuses, a dead
one's socket is taken over."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from foundry import Foundry
from foundry.backends.pool.served import socket_path
from foundry.errors import ConfigError, DeadlineExceededError, NoWorkerError, WorkerLostError
from tests.pool import _serve, work
from tests.pool.conftest import alive, lines
from tests.pool.test_conformance import _wait_for, own_server


@pytest.mark.parametrize("kind", ["served", "nats"])
def test_sigkill_of_the_serve_process_answers_every_caller_within_its_deadline(
    kind: str, tmp_path: Path
) -> None:
    log = tmp_path / "runs.log"
    with own_server(kind, tmp_path, ("once",)) as (own, made):
        once = made.units["once"]  # two workers, deadline 20 s
        # Given two requests running and two waiting in the server's line ...
        handles = [once.submit(str(log), f"r{i}", 3.0) for i in range(4)]
        _wait_for(lambda: len(lines(log)) == 2)
        time.sleep(0.3)  # past the server's "it waits here" notice
        assert own.proc is not None
        # ... when the serve process is SIGKILLed,
        killed = time.monotonic()
        own.proc.kill()
        own.proc.wait(10)
        # then every caller gets a clear error, long before the deadline, and its
        # workers die with it.
        for h in handles:
            with pytest.raises(WorkerLostError, match="may or may not have happened"):
                h.result(timeout=10)
        assert time.monotonic() - killed < 5.0
        _wait_for(lambda: not any(alive(pid) for _, pid in lines(log)))
        started = time.perf_counter()
        with pytest.raises(NoWorkerError):
            once.submit(str(log), "after", 0.0).result(timeout=5)
        assert time.perf_counter() - started < 0.5
    assert sorted(k for k, _ in lines(log)) == ["r0", "r1"]  # the waiting ones never ran


def test_a_stopped_serve_process_is_a_deadline_error_not_a_hang(tmp_path: Path) -> None:
    log = tmp_path / "runs.log"
    with own_server("served", tmp_path, ("once",)) as (own, made):
        once = made.units["once"]
        assert isinstance(once(str(log), "warm-up", 0.0), int)  # connected
        assert own.proc is not None
        os.kill(own.proc.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(DeadlineExceededError, match="may be hung"):
                once.options(deadline="1s").submit(str(log), "r", 0.0).result(timeout=10)
            assert time.monotonic() - started < 4.0  # deadline + attempt timeout + 0.25 s
        finally:
            os.kill(own.proc.pid, signal.SIGCONT)


def test_one_server_per_socket_and_a_dead_ones_socket_is_taken_over(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = _serve.serve("local://", ["square"], first_log, FOUNDRY_HOME=str(home), FOUNDRY_POOL="local://")
    try:
        _serve.wait_ready(first_log, 1, first)
        # A second server on the same home refuses, naming the fix.
        second = _serve.serve(
            "local://", ["square"], second_log, FOUNDRY_HOME=str(home), FOUNDRY_POOL="local://"
        )
        assert second.wait(60) != 0
        assert "already served" in second_log.read_text()
        # A server that died leaves its socket; the next one takes it over.
        first.kill()
        first.wait(10)
        third = _serve.serve(
            "local://", ["square"], second_log, FOUNDRY_HOME=str(home), FOUNDRY_POOL="local://"
        )
        try:
            _serve.wait_ready(second_log, 1, third)
            app = Foundry("served", pool="local://served", home=home)
            try:
                square = app.work(model="pool", idempotent=True, workers=2, name="square")(work.square)
                assert square(9) == 81
            finally:
                app.close()
        finally:
            assert _serve.stop(third) == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)


def test_the_embedded_pool_url_is_local_or_local_served(home: Path) -> None:
    with pytest.raises(ConfigError, match="local://served"):
        Foundry("x", pool="local://elsewhere")
    Foundry("x", pool="local://served").close()


def test_foundry_pool_serve_prints_where_it_serves(tmp_path: Path) -> None:
    home = tmp_path / "home"
    log = tmp_path / "serve.log"
    proc = _serve.serve("local://", ["square"], log, FOUNDRY_HOME=str(home), FOUNDRY_POOL="local://")
    try:
        _serve.wait_ready(log, 1, proc)
        # under the home, or (a home too deep for a socket path) a hashed name in a private dir
        where = Path(socket_path(str(home.resolve()), "served", "square"))
        assert f"square on {where}" in log.read_text()
        assert where.exists()
    finally:
        assert _serve.stop(proc) == 0
    assert not where.exists()  # removed on a clean stop
