"""Payload sizes on every engine: an argument over ``max_payload`` is refused at submit
and nothing is enqueued; a *result* over it fails its job with a clear error (the unit,
the size, the limit, the fix) and is not stored, while the unit's other jobs go on; a
workflow's arguments, step results and result obey the workflow's limit. (A stream
event over the stream's 1 MiB limit is refused on every engine by
``tests/streams/test_runtime.py::test_malformed_events_are_rejected_and_nothing_is_lost``.)"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from foundry import Foundry
from foundry.backends.queue import JobStatus, open_queue_backend
from foundry.deliver.queue import queue_of
from foundry.errors import PayloadTooLargeError, SubmitError
from tests.adversarial import _units
from tests.adversarial.conftest import QueueEnv

LIMIT = 64 * 1024
DEFAULT_MAX_PAYLOAD = 1 << 20  # foundry.payload.DEFAULT_MAX_PAYLOAD, as documented


def test_a_result_over_max_payload_fails_its_job_and_is_not_stored(queue_env: QueueEnv) -> None:
    # Given: a unit whose results may be at most 64 KiB, and a worker
    unit = queue_env.work(_units.blob, max_payload="64KiB", name="maker")
    queue_env.worker()
    # When: one job returns 100 KB, its neighbours return at and under the limit
    big, exact, small = unit.submit(100_000), unit.submit(LIMIT), unit.submit(10)
    # Then: the big one fails, saying what, how large, the limit and the fix
    with pytest.raises(PayloadTooLargeError) as info:
        big.result(timeout=60)
    text = str(info.value)
    assert "unit 'maker'" in text
    assert "100000 bytes" in text
    assert f"max_payload={LIMIT}" in text
    assert "Fix:" in text
    assert "reference" in text
    # ... the others succeed, the one at the limit included
    assert len(exact.result(timeout=60)) == LIMIT - 2
    assert small.result(timeout=60) == "x" * 8
    # ... and the failed job keeps no result in the store, and was not retried
    backend = open_queue_backend(queue_env.url)
    try:
        state = backend.get(big.id)
        assert state is not None
        assert state.status is JobStatus.FAILED
        assert state.result is None
        assert state.deliveries == 1
    finally:
        backend.close()


def test_results_obey_the_default_limit_when_none_is_declared(queue_env: QueueEnv) -> None:
    unit = queue_env.work(_units.blob, name="default_maker")
    queue_env.worker()
    with pytest.raises(PayloadTooLargeError, match=f"max_payload={DEFAULT_MAX_PAYLOAD}"):
        unit.submit(DEFAULT_MAX_PAYLOAD + 1000).result(timeout=60)
    assert len(unit.submit(1000).result(timeout=60)) == 998


def test_a_result_that_cannot_be_encoded_fails_its_job_and_the_worker_goes_on(queue_env: QueueEnv) -> None:
    # Given: a unit whose result may be too deeply nested for the JSON encoder, one whose
    # result raises when read, and a worker
    unit = queue_env.work(_units.nested, name="deep", retries=3)
    broken = queue_env.work(_units.unreadable, name="broken", retries=3)
    worker = queue_env.worker(concurrency=1)
    # When: jobs return values the encoder gives up on (RecursionError, RuntimeError), another not
    deep, odd, shallow = unit.submit(100_000), broken.submit(), unit.submit(2)
    # Then: they fail at once (not retried: encoding again cannot work), naming the unit and the cause
    with pytest.raises(SubmitError, match=r"unit 'deep'.*recursion"):
        deep.result(timeout=60)
    with pytest.raises(SubmitError, match=r"unit 'broken'.*RuntimeError.*is broken"):
        odd.result(timeout=60)
    # ... the worker is still alive and runs the next one
    assert shallow.result(timeout=60) == [[[]]]
    assert worker.failure is None
    assert not worker.stopping.is_set()
    backend = open_queue_backend(queue_env.url)
    try:
        state = backend.get(deep.id)
        assert state is not None
        assert state.status is JobStatus.FAILED
        assert state.deliveries == 1
    finally:
        backend.close()


def test_an_argument_over_max_payload_is_refused_and_nothing_is_enqueued(queue_env: QueueEnv) -> None:
    unit = queue_env.work(_units.length, max_payload="64KiB", name="measure")
    with pytest.raises(PayloadTooLargeError, match="nothing was enqueued"):
        unit.submit("y" * 100_000)
    backend = open_queue_backend(queue_env.url)
    try:
        stats = backend.stats(queue_of(unit.spec))
        assert (stats.depth, stats.scheduled, stats.running) == (0, 0, 0)
    finally:
        backend.close()
    queue_env.worker()
    assert unit.submit("y" * 60_000).result(timeout=60) == 60_000


def test_a_large_argument_and_result_round_trip_intact(queue_env: QueueEnv) -> None:
    # The chunked paths (JSON in chunks, a reserved blob written in pieces, large RESP
    # arguments sent as themselves) carry every byte: 3 MB with escapes and non-ASCII.
    unit = queue_env.work(_units.echo, max_payload="16MB", name="mirror")
    queue_env.worker()
    value = {"text": ('é"\\\n' + "x" * 1000) * 3000, "n": [1, 2.5, None]}
    assert unit.submit(value).result(timeout=120) == value


# -- workflows ---------------------------------------------------------------------------


def test_a_workflow_step_result_over_max_payload_fails_the_workflow(journal_url: str, tmp_path: Path) -> None:
    app = Foundry(f"wf-{uuid.uuid4().hex[:6]}", home=tmp_path / "home", journal=journal_url)
    try:
        made: list[int] = []

        def make(size: int) -> str:
            made.append(size)
            return "x" * size

        @app.workflow(max_payload="64KiB")
        def flow(wf: object, size: int, pad: str = "") -> int:
            return len(wf.step(make, size))  # type: ignore[attr-defined]

        assert flow.run(1000) == 1000
        with pytest.raises(PayloadTooLargeError) as info:
            flow.run(100_000)
        text = str(info.value)
        assert "workflow 'flow'" in text
        assert "make'" in text
        assert f"max_payload={LIMIT}" in text
        assert made == [1000, 100_000]  # the oversized step failed at once, not retried
        with pytest.raises(PayloadTooLargeError, match=r"its arguments.*nothing was started"):
            flow.run(
                1, "y" * 100_000
            )  # (an int where the flow declares one: typed payloads check that first)
    finally:
        app.close(timeout=5)
