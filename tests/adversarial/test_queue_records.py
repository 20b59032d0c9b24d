"""Malformed job records written straight into each engine's store (issue 12, item 5):
each is dead-lettered with a reason naming the bad field, every healthy job beside it
completes, and the worker keeps claiming (with ``--burst`` it drains the queue and exits
0; before, its claim thread died on the first bad record and it never exited). Then
Hypothesis feeds every engine's record decoders arbitrary records: each either yields a
valid job or raises :class:`MalformedRecordError`, never anything else."""

from __future__ import annotations

import math
import subprocess
import time
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foundry.backends.queue import Claimed, JobState, JobStatus, NewJob, open_queue_backend
from foundry.backends.queue._amqp_client import parse_body
from foundry.backends.queue._sql import claimed_from_row, state_from_row
from foundry.backends.queue.redis import _lease_row, claimed_from_reply, state_from_hash
from foundry.errors import MalformedRecordError
from tests.adversarial import _queue_app
from tests.adversarial._fuzz import FUZZ
from tests.adversarial._fuzz import anything as any_value
from tests.adversarial._queue_helpers import queue_url, start_worker, write_field

__all__ = ["queue_url"]

# What each engine's columns can hold: PostgreSQL's are typed, SQLite's and Redis's take anything.
TYPED = [("attempts", -1), ("max_deliveries", 0), ("codec", "evil"), ("timeout", -5.0), ("unit", "")]
UNTYPED = [*TYPED, ("attempts", "abc"), ("priority", "high"), ("enqueued_at", "yesterday")]


def engine_of(url: str) -> str:
    return url.split("://", 1)[0]


def test_malformed_records_are_dead_lettered_and_the_worker_goes_on(queue_url: str) -> None:
    # Given healthy jobs, and jobs whose record was then altered in the store
    app = _queue_app.make_app(queue_url, name=f"records-{uuid.uuid4().hex[:6]}")
    try:
        healthy = app.units["healthy"]
        cases = TYPED if engine_of(queue_url) == "postgresql" else UNTYPED
        bad: dict[str, str] = {}
        handles = []
        for i, (field, value) in enumerate(cases):
            handles.append(healthy.submit(i))
            victim = healthy.submit(1000 + i)
            write_field(queue_url, victim.id, field, value)
            bad[victim.id] = field
        handles += [healthy.submit(i) for i in range(len(cases), len(cases) + 5)]
        # When a worker drains the queue
        proc = start_worker(queue_url, "-c", "2", "--burst", "-q", stderr=subprocess.PIPE)
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            raise AssertionError(
                f"the worker stopped claiming, the queue never drained: {err[-2000:]}"
            ) from None
        # Then it exits cleanly, every healthy job completed ...
        assert proc.returncode == 0, err[-2000:]
        assert [h.result(timeout=10) for h in handles] == [2 * i for i in range(len(handles))]
        # ... and every altered record is a dead letter whose reason names the bad field
        backend = open_queue_backend(queue_url)
        try:
            for job_id, field in bad.items():
                state = backend.get(job_id)
                assert state is not None
                assert state.status is JobStatus.DEAD, (field, state)
                assert "malformed" in (state.dead_reason or ""), state.dead_reason
                assert f"{field}=" in (state.dead_reason or ""), state.dead_reason
        finally:
            backend.close()
    finally:
        app.close()


def test_a_running_record_altered_in_the_store_is_dead_lettered_when_its_lease_lapses(queue_url: str) -> None:
    backend = open_queue_backend(queue_url)
    try:
        # Given a claimed job whose record is altered while it runs, and a healthy one
        queue = f"q-{uuid.uuid4().hex[:8]}"
        altered = NewJob(id=uuid.uuid4().hex, queue=queue, unit="u", payload=b"{}")
        backend.enqueue(altered)
        [c] = backend.claim(queue, "w", lease=0.3, limit=1, timeout=5)
        write_field(queue_url, c.id, "max_deliveries", 0 if engine_of(queue_url) == "postgresql" else "x")
        other = NewJob(id=uuid.uuid4().hex, queue=queue, unit="u", payload=b"{}")
        backend.enqueue(other)
        # When its lease lapses (its worker died), the claims that follow recover it
        deadline = time.monotonic() + 15
        got: list[Claimed] = []
        while not got and time.monotonic() < deadline:
            got = backend.claim(queue, "w", lease=30, limit=2, timeout=0.5)
        # Then the healthy job is claimed, the altered one dead-lettered with the reason
        assert [g.id for g in got] == [other.id]
        state = backend.get(c.id)
        while state is not None and state.status is JobStatus.RUNNING and time.monotonic() < deadline:
            backend.claim(queue, "w", lease=30, limit=1, timeout=0.3)
            state = backend.get(c.id)
        assert state is not None
        assert state.status is JobStatus.DEAD, state
        assert "max_deliveries=" in (state.dead_reason or "")
    finally:
        backend.close()


# -- the decoders, fuzzed ---------------------------------------------------------------------

anything = any_value("json", "pickle", "queued", "running", "dead", "succeeded")
# Values that are usually right, so that most records get deep into the decoder
plausible_int = st.one_of(
    st.integers(min_value=-3, max_value=10), st.sampled_from([b"3", "7", 2.0]), anything
)
plausible_text = st.one_of(st.sampled_from(["a-job", b"unit.x", "q"]), anything)
plausible_number = st.one_of(st.floats(min_value=0, max_value=2e9), st.sampled_from([b"12.5", "1"]), anything)
plausible_blob = st.one_of(st.binary(max_size=20), anything)
status = st.one_of(
    st.sampled_from([s.value for s in JobStatus] + [s.value.encode() for s in JobStatus]), anything
)
codec = st.one_of(st.sampled_from(["json", "pickle", b"json"]), anything)


def check_claimed(c: Claimed) -> None:
    assert isinstance(c.id, str)
    assert c.id
    assert isinstance(c.unit, str)
    assert c.unit
    assert isinstance(c.payload, bytes)
    assert c.codec in ("json", "pickle")
    assert c.deliveries >= 1
    assert c.attempts >= 0
    assert c.max_retries >= 0
    assert c.max_deliveries >= 1
    assert c.timeout is None or (math.isfinite(c.timeout) and c.timeout > 0)
    assert math.isfinite(c.enqueued_at)
    assert math.isfinite(c.lease_until)


def check_state(s: JobState | None) -> None:
    if s is None:
        return
    assert isinstance(s.status, JobStatus)
    assert isinstance(s.id, str)
    assert isinstance(s.unit, str)
    assert s.deliveries >= 0
    assert s.attempts >= 0
    assert s.codec in ("json", "pickle")
    assert math.isfinite(s.enqueued_at)
    assert s.eta is not None
    assert math.isfinite(s.eta)
    assert s.result is None or isinstance(s.result, bytes)


@FUZZ
@given(
    st.tuples(
        plausible_text, plausible_text, plausible_text, plausible_blob, codec, plausible_text,
        plausible_number, plausible_int, plausible_int, plausible_int, plausible_int,
        st.one_of(st.none(), plausible_number), plausible_number, plausible_int, plausible_number,
        st.integers(min_value=1, max_value=10**9),
    )
)  # fmt: skip
def test_sql_claim_rows_decode_to_a_job_or_the_malformed_error(row: tuple[Any, ...]) -> None:
    try:
        check_claimed(claimed_from_row(row))
    except MalformedRecordError:
        pass


@FUZZ
@given(
    st.tuples(
        plausible_text, plausible_text, plausible_text, status, plausible_int, plausible_int,
        st.one_of(st.none(), plausible_blob), st.one_of(st.none(), plausible_blob),
        st.one_of(st.none(), plausible_text), codec, plausible_number,
        st.one_of(st.none(), plausible_number), plausible_number, plausible_int,
        st.one_of(st.none(), plausible_text), plausible_blob,
    )
)  # fmt: skip
def test_sql_state_rows_decode_to_a_state_or_the_malformed_error(row: tuple[Any, ...]) -> None:
    try:
        check_state(state_from_row(row))
    except MalformedRecordError:
        pass


@FUZZ
@given(
    st.lists(
        st.one_of(plausible_text, plausible_blob, plausible_int, plausible_number, anything),
        min_size=0,
        max_size=12,
    )
)
def test_redis_lease_replies_decode_to_a_job_or_the_malformed_error(row: list[Any]) -> None:
    try:
        check_claimed(claimed_from_reply(row, "q", "token", 100.0))
    except MalformedRecordError:
        pass


@FUZZ
@given(st.one_of(st.binary(max_size=300), st.lists(st.binary(max_size=30), max_size=14).map(
    lambda fields: b"".join(b"%d:%b" % (len(f), f) for f in fields)
)))  # fmt: skip
def test_packed_redis_lease_replies_decode_to_a_job_or_the_malformed_error(packed: bytes) -> None:
    """A claim's reply for one job is ``[id, b"<len>:<bytes>..."]``: whatever the bytes,
    unpacking never raises and the row decodes to a job or is refused."""
    try:
        check_claimed(claimed_from_reply(_lease_row([b"id1", packed]), "q", "token", 100.0))
    except MalformedRecordError:
        pass


def test_a_packed_lease_reply_unpacks_to_the_row() -> None:
    fields = [b"u", b"{}", b"json", b"1", b"0", b"0", b"5", b"", b"1.5", b"0", b""]
    packed = b"".join(b"%d:%b" % (len(f), f) for f in fields)
    assert _lease_row([b"id1", packed]) == [b"id1", *fields]
    assert claimed_from_reply(_lease_row([b"id1", packed]), "q", "tok", 10.0).enqueued_at == 1.5
    assert _lease_row([b"id1", b"3:ab"]) == [b"id1", b"3:ab"]  # short: left as it is, then refused
    with pytest.raises(MalformedRecordError):
        claimed_from_reply(_lease_row([b"id1", b"3:ab"]), "q", "tok", 10.0)


@FUZZ
@given(
    st.tuples(
        plausible_blob, plausible_blob, plausible_blob, status, plausible_int, plausible_int,
        st.one_of(st.none(), plausible_blob), st.one_of(st.none(), plausible_blob),
        st.one_of(st.none(), plausible_blob), codec, plausible_number,
        st.one_of(st.none(), plausible_number), plausible_number, plausible_int,
        st.one_of(st.none(), plausible_blob), st.one_of(st.none(), plausible_blob),
    )
)  # fmt: skip
def test_redis_hashes_decode_to_a_state_or_the_malformed_error(values: tuple[Any, ...]) -> None:
    try:
        check_state(state_from_hash("job-1", values))
    except MalformedRecordError:
        pass


line = st.one_of(
    st.builds(
        lambda i, p, e: f"{i} {p} {e}",
        st.text(min_size=1, max_size=20),
        st.one_of(st.integers(min_value=-300, max_value=300), st.text(max_size=4)),
        st.one_of(st.just("-"), st.floats(allow_nan=True), st.text(max_size=6)),
    ),
    st.text(max_size=40),
)


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=200),
        st.lists(line, min_size=1, max_size=20).map(
            lambda lines: "\n".join(lines).encode("utf-8", "surrogatepass")
        ),
    )
)
def test_amqp_message_bodies_decode_to_jobs_or_the_malformed_error(body: bytes) -> None:
    try:
        jobs = parse_body(body, "foundry.q")
    except MalformedRecordError:
        return
    assert 1 <= len(jobs) <= 16
    for job_id, priority, eta in jobs:
        assert isinstance(job_id, str)
        assert job_id
        assert job_id.isprintable()
        assert isinstance(priority, int)
        assert eta is None or math.isfinite(eta)


def test_foundrys_own_records_decode() -> None:
    """The fuzzers' counterpart: what Foundry writes always decodes."""
    row = ("id1", "q", "u", b"{}", "json", "tok", 10.0, 1, 0, 0, 5, None, 1.0, 0, 1.0, 7)
    assert claimed_from_row(row).id == "id1"
    reply = [b"id1", b"u", b"{}", b"json", 1, b"0", b"0", b"5", b"", b"1.5", b"0"]
    assert claimed_from_reply(reply, "q", "tok", 10.0).enqueued_at == 1.5
    assert parse_body(b"id1 3 -\nid2 0 1700000000.5", "q") == [("id1", 3, None), ("id2", 0, 1700000000.5)]
    with pytest.raises(MalformedRecordError, match="is not UTF-8"):
        parse_body(b"\xff\xfe 1 -", "q")


# -- the engines themselves, fuzzed: any value in any field of a stored job ----------------

STORED = [
    "status", "attempts", "deliveries", "max_retries", "max_deliveries", "timeout", "enqueued_at",
    "priority", "codec", "unit", "payload", "eta", "lease_until", "crashes", "result_ttl",
]  # fmt: skip
stored_value = st.one_of(
    st.sampled_from(["queued", "running", "dead", "json", "pickle", "", "0", "-1", "1e400", "nan"]),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.binary(max_size=12),
)


@pytest.mark.parametrize("engine", ["sqlite", "redis"])  # their fields take any type
def test_any_value_in_any_field_is_run_or_dead_lettered_never_a_crash(engine: str, tmp_path: Any) -> None:
    from tests.adversarial._queue_helpers import private_url
    from tests.backends.queue.engines import close

    url = private_url(engine, tmp_path)
    backend = open_queue_backend(url)
    queue = f"fuzz-{uuid.uuid4().hex[:8]}"

    @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.dictionaries(st.sampled_from(STORED), stored_value, min_size=1, max_size=3))
    def altered(fields: dict[str, Any]) -> None:
        # Given a job whose stored record is then altered, field by field
        job = NewJob(id=uuid.uuid4().hex, queue=queue, unit="u", payload=b"{}")
        backend.enqueue(job)
        for field, value in fields.items():
            if engine == "sqlite" and (value is None or (isinstance(value, float) and math.isnan(value))):
                continue  # SQLite stores NaN as NULL, and these columns refuse NULL
            if engine == "redis" and isinstance(value, float) and not math.isfinite(value):
                value = repr(value)
            write_field(url, job.id, field, value)
        # Then every engine call still answers: claims hand out valid jobs or none ...
        for c in backend.claim(queue, "w", lease=30, limit=5, timeout=0):
            check_claimed(c)
            backend.complete(c.id, c.token, b"1")
        backend.stats(queue)
        # ... and the record reads back as a state or as the one malformed-record error
        try:
            check_state(backend.get(job.id))
        except MalformedRecordError:
            pass

    try:
        altered()
    finally:
        close(backend, url)
