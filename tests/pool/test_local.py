"""What only the embedded pool (``local://``) has; the contract every engine shares is in
``test_conformance.py``. Here: workers are processes of the app's own, a worker that
cannot start says why, a SIGKILLed worker is counted and replaced, and the traits and
options a pool (or any other unit) cannot honour are refused."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from foundry import Foundry
from foundry.errors import DeclarationError, NoWorkerError, SubmitError
from tests.pool import broken, work


def test_workers_are_processes_of_their_own(app: Foundry) -> None:
    pid = app.work(model="pool", name="pid", workers=1)(work.pid)
    assert pid.decision.delivery == "pool"
    assert pid() != os.getpid()


def test_arguments_the_codec_cannot_carry_are_refused_at_submit(app: Foundry) -> None:
    square = app.work(model="pool", workers=1)(work.square)
    with pytest.raises(SubmitError, match="JSON"):
        square.submit(object())


def test_no_worker_names_why_none_could_start(app: Foundry) -> None:
    never = app.work(model="pool", workers=1)(broken.never)
    with pytest.raises(NoWorkerError, match="refuses to load"):
        never.submit(1).result(timeout=30)


def test_a_sigkilled_worker_is_counted_and_replaced(app: Foundry) -> None:
    pid = app.work(model="pool", name="pid", workers=1)(work.pid)
    first = pid()
    os.kill(first, signal.SIGKILL)
    end = time.monotonic() + 20
    while app.metrics.value("foundry_child_restarts_total", unit="pid") < 1 and time.monotonic() < end:
        time.sleep(0.05)
    assert app.metrics.value("foundry_child_restarts_total", unit="pid") == 1
    assert app.metrics.value("foundry_child_exits_total", unit="pid", code="SIGKILL") == 1
    assert pid() not in (first, os.getpid())


def test_pool_traits_are_validated_at_declaration(app: Foundry) -> None:
    with pytest.raises(DeclarationError, match="not idempotent"):
        app.work(model="pool", retries=2, name="a")(work.square)
    with pytest.raises(DeclarationError, match="longer than deadline"):
        app.work(model="pool", timeout="5s", deadline="1s", name="b")(work.square)
    with pytest.raises(DeclarationError, match="max_workers"):
        app.work(model="pool", min_workers=4, max_workers=2, name="c")(work.square)
    with pytest.raises(DeclarationError, match="elastic"):
        app.work(model="pool", workers=2, max_workers=4, name="d")(work.square)
    with pytest.raises(DeclarationError, match="deadline"):
        app.work(model="pool", deadline="0s", name="e")(work.square)


def test_a_deadline_is_refused_where_nothing_would_enforce_it(home: Path) -> None:
    app = Foundry("nodeadline")
    try:
        direct = app.work(name="direct")(work.square)
        assert direct.decision.delivery == "direct"
        # per call: refused at once, naming what does bound a run
        with pytest.raises(SubmitError, match=r"deadline='1s'.*would ignore it.*timeout="):
            direct.options(deadline="1s")
        assert direct.options(timeout="1s").submit(3).result(timeout=5) == 9
        # per unit: refused at declaration
        with pytest.raises(DeclarationError, match="would ignore it"):
            app.work(deadline="1s", name="direct2")(work.square)
    finally:
        app.close()
