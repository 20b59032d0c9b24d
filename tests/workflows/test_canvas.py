"""chain / group / chord of durable queue units, built as workflows: results flow from
link to link, a crash of the workflow's run mid-chain neither loses a finished link nor
submits the running link's job twice, and a failing link fails the chain."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from foundry import Foundry
from foundry.backends.journal import ManualClock
from foundry.canvas import chain, chord, group
from foundry.deliver.worker import Worker as QueueWorker
from foundry.deliver.workflow import Worker, configure
from foundry.errors import DeclarationError
from tests.workflows.conftest import Crash

RAN: Counter[str] = Counter()
_LOCK = threading.Lock()


def _ran(what: str) -> None:
    with _LOCK:
        RAN[what] += 1


class Declined(RuntimeError):
    pass


class Canvas:
    def __init__(self, tmp_path: Path, journal_url: str) -> None:
        self.app = Foundry(f"canvas-{uuid.uuid4().hex[:6]}", queue=f"sqlite:///{tmp_path / 'queue.db'}")
        app = self.app

        @app.work(durable=True)
        def fetch(url: str) -> str:
            _ran("fetch")
            return f"<{url}>"

        @app.work(durable=True)
        def parse(page: str) -> list[str]:
            _ran("parse")
            return [page, "parsed"]

        @app.work(durable=True)
        def store(rows: list[str]) -> int:
            _ran("store")
            return len(rows)

        @app.work(durable=True)
        def resize(n: int) -> int:
            _ran(f"resize {n}")
            if n < 0:
                raise Declined(f"cannot resize {n}")
            return n * 2

        @app.work(durable=True)
        def total(sizes: list[int]) -> int:
            _ran("total")
            return sum(sizes)

        self.etl = chain(app, fetch, parse, store)
        self.thumbs = group(app, resize, concurrency=2)
        self.report = chord(app, resize, total)
        self.rt = configure(app, journal=journal_url, clock=ManualClock(), poll=0.02)
        self.queue = QueueWorker(app, concurrency=4, poll=0.02).start()

    def close(self) -> None:
        self.queue.stop(5)
        self.app.close(5)
        self.rt.close(5)


@pytest.fixture
def canvas(tmp_path: Path, journal_url: str) -> Iterator[Canvas]:
    RAN.clear()
    c = Canvas(tmp_path, journal_url)
    try:
        yield c
    finally:
        c.close()


def test_a_chain_feeds_each_result_to_the_next_job(canvas: Canvas) -> None:
    assert canvas.etl.run("a.html", id="etl-1", timeout=20) == 2
    assert RAN == {"fetch": 1, "parse": 1, "store": 1}
    _, entries = canvas.rt.journal.load("etl-1")
    assert [(e.name, e.status) for e in entries] == [("fetch", "ok"), ("parse", "ok"), ("store", "ok")]


def test_a_group_and_a_chord_fan_out_and_in(canvas: Canvas) -> None:
    assert canvas.thumbs.run([1, 2, 3], id="g", timeout=20) == [2, 4, 6]
    assert canvas.report.run([1, 2, 3], id="c", timeout=20) == 12
    assert RAN["total"] == 1


def test_a_crash_mid_chain_loses_nothing_and_submits_no_job_twice(
    canvas: Canvas, monkeypatch: pytest.MonkeyPatch
) -> None:
    import foundry.canvas as canvas_module

    waits: Counter[str] = Counter()
    real = canvas_module._await

    def dies_waiting_for_parse(handle: Any, wait: float) -> Any:
        waits[handle.unit] += 1
        if handle.unit == "parse" and waits[handle.unit] == 1:
            handle.result(wait)  # the job finishes on the queue meanwhile ...
            raise Crash("... and the workflow's process dies before recording it")
        return real(handle, wait)

    monkeypatch.setattr(canvas_module, "_await", dies_waiting_for_parse)
    with pytest.raises(Crash):
        canvas.etl.run("b.html", id="etl-2", timeout=20)
    canvas.rt.journal.clock.advance(canvas.rt.lease + 1)  # type: ignore[attr-defined]
    worker = Worker(canvas.app, journal=canvas.rt.journal, poll=0.02)
    try:
        worker.drain()
    finally:
        worker.stop(5)
    assert canvas.etl.handle("etl-2").result(20) == 2
    # fetch was replayed from the journal, parse's job was found again by its key, not rerun
    assert RAN == {"fetch": 1, "parse": 1, "store": 1}
    # and the resumed run asked the queue for parse's job again (its key found the first one)
    assert waits == {"fetch": 1, "parse": 2, "store": 1}


def test_a_failing_link_fails_the_group_with_its_error(canvas: Canvas) -> None:
    with pytest.raises(Declined, match="cannot resize -1"):
        canvas.thumbs.run([1, -1, 3], id="bad", timeout=20)


def test_an_empty_chain_is_refused() -> None:
    with pytest.raises(DeclarationError, match="links"):
        chain(Foundry("empty"))
