"""The QueueBackend contract (``foundry/backends/queue/base.py``), clause by clause, on
every engine. Leases here are short (a fraction of a second) and the tests wait for
*states*, never assert how long something took."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from foundry.backends.queue import (
    CancelResult,
    JobProgress,
    JobStatus,
    NewJob,
    QueueBackend,
    open_queue_backend,
)
from foundry.errors import ConfigError, SubmitError
from tests.adversarial._hostile import rewrite_job
from tests.backends.queue._helpers import expect

SHORT = 0.4  # a lease that lapses during the test
LONG = 60.0  # a lease that does not


def job(queue_name: str, /, **fields: Any) -> NewJob:
    fields.setdefault("id", uuid.uuid4().hex)
    fields.setdefault("unit", "unit.test")
    fields.setdefault("payload", b'{"args":[1],"kwargs":{}}')
    fields.setdefault("queue", queue_name)
    return NewJob(**fields)


def claim_one(backend: QueueBackend, queue: str, *, lease: float = LONG, timeout: float = 5.0) -> Any:
    got = backend.claim(queue, "w-test", lease=lease, limit=1, timeout=timeout)
    assert len(got) == 1, f"expected one claimable job in {queue}, got {got}"
    return got[0]


def claim_until(
    backend: QueueBackend, queue: str, predicate: Callable[[Any], bool], *, lease: float = LONG
) -> Any:
    """Claim until a job satisfying ``predicate`` arrives (leases lapse on their own clock)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        for claimed in backend.claim(queue, "w-test", lease=lease, limit=10, timeout=1.0):
            if predicate(claimed):
                return claimed
    raise AssertionError(f"no matching job became claimable in {queue}")


# -- enqueue -------------------------------------------------------------------------


def test_enqueue_then_get_shows_the_queued_job(backend: QueueBackend, queue: str) -> None:
    new = job(queue, priority=3, key=f"k-{uuid.uuid4().hex}", max_retries=2)
    done = backend.enqueue(new)
    assert done.id == new.id
    assert done.created
    state = expect(backend.get(new.id), JobStatus.QUEUED)
    assert (state.unit, state.queue, state.priority, state.key) == ("unit.test", queue, 3, new.key)
    assert state.payload == new.payload
    assert state.deliveries == 0
    assert state.attempts == 0
    assert state.enqueued_at > 0


def test_enqueue_is_idempotent_on_the_key(backend: QueueBackend, queue: str) -> None:
    key = f"order-{uuid.uuid4().hex}"
    first = backend.enqueue(job(queue, key=key))
    second = backend.enqueue(job(queue, key=key, payload=b'"other"'))
    assert first.created
    assert not second.created
    assert second.id == first.id
    found = backend.find(key)
    assert found is not None
    assert found.id == first.id
    assert found.payload == b'{"args":[1],"kwargs":{}}'
    assert backend.stats(queue).depth == 1


def test_enqueue_is_idempotent_on_the_id(backend: QueueBackend, queue: str) -> None:
    new = job(queue)
    assert backend.enqueue(new).created
    again = backend.enqueue(new)
    assert not again.created
    assert again.id == new.id
    assert backend.stats(queue).depth == 1


def test_the_key_stays_taken_while_the_job_is_finished(backend: QueueBackend, queue: str) -> None:
    key = f"k-{uuid.uuid4().hex}"
    first = backend.enqueue(job(queue, key=key))
    c = claim_one(backend, queue)
    assert backend.complete(c.id, c.token, b"1")
    again = backend.enqueue(job(queue, key=key))
    assert not again.created
    assert again.id == first.id
    assert backend.claim(queue, "w", lease=LONG, limit=1, timeout=0) == []


def test_enqueue_many_creates_a_batch_and_reports_duplicates(backend: QueueBackend, queue: str) -> None:
    key = f"k-{uuid.uuid4().hex}"
    existing = backend.enqueue(job(queue, key=key))
    batch = [job(queue) for _ in range(20)] + [job(queue, key=key)]
    done = backend.enqueue_many(batch)
    assert [d.created for d in done] == [True] * 20 + [False]
    assert [d.id for d in done[:20]] == [j.id for j in batch[:20]]
    assert done[20].id == existing.id
    assert backend.stats(queue).depth == 21
    assert backend.enqueue_many([]) == []


def test_enqueue_many_collapses_a_key_repeated_inside_the_batch(backend: QueueBackend, queue: str) -> None:
    key = f"k-{uuid.uuid4().hex}"
    a, b = job(queue, key=key), job(queue, key=key)
    done = backend.enqueue_many([a, b])
    assert done[0].created
    assert not done[1].created
    assert done[1].id == a.id
    assert backend.stats(queue).depth == 1


# -- claim and leases ----------------------------------------------------------------


def test_claim_returns_the_job_with_a_token_and_counts_the_delivery(
    backend: QueueBackend, queue: str
) -> None:
    new = job(queue, max_retries=3, max_deliveries=4, timeout=12.5)
    backend.enqueue(new)
    before = time.time()
    c = claim_one(backend, queue, lease=LONG)
    assert (c.id, c.queue, c.unit, c.payload, c.codec) == (new.id, queue, "unit.test", new.payload, "json")
    assert c.token
    assert c.deliveries == 1
    assert c.attempts == 0
    assert (c.max_retries, c.max_deliveries, c.timeout) == (3, 4, 12.5)
    assert c.lease_until >= before + LONG - 1
    state = expect(backend.get(new.id), JobStatus.RUNNING)
    assert state.deliveries == 1


def test_a_leased_job_is_not_claimable_again(backend: QueueBackend, queue: str) -> None:
    backend.enqueue(job(queue))
    claim_one(backend, queue)
    assert backend.claim(queue, "w2", lease=LONG, limit=5, timeout=0.2) == []


def test_queues_are_separate(backend: QueueBackend, queue: str) -> None:
    backend.enqueue(job(queue))
    assert backend.claim(queue + "-other", "w", lease=LONG, limit=5, timeout=0) == []
    assert backend.stats(queue + "-other").depth == 0
    claim_one(backend, queue)


def test_claim_respects_the_limit(backend: QueueBackend, queue: str) -> None:
    backend.enqueue_many([job(queue) for _ in range(7)])
    got = backend.claim(queue, "w", lease=LONG, limit=3, timeout=1)
    assert len(got) == 3
    rest = backend.claim(queue, "w", lease=LONG, limit=10, timeout=1)
    assert len(rest) == 4
    assert {c.id for c in got}.isdisjoint({c.id for c in rest})


def test_concurrent_claimers_each_get_different_jobs(
    open_backend: Callable[[], QueueBackend], queue: str
) -> None:
    producer = open_backend()
    ids = {j.id for j in (job(queue) for _ in range(60))}
    producer.enqueue_many([job(queue, id=i) for i in ids])
    seen: list[list[str]] = []
    lock = threading.Lock()

    def consume(backend: QueueBackend) -> None:
        mine: list[str] = []
        while True:
            got = backend.claim(queue, f"w-{id(backend)}", lease=LONG, limit=4, timeout=0.5)
            if not got:
                break
            mine.extend(c.id for c in got)
        with lock:
            seen.append(mine)

    consumers = [open_backend() for _ in range(3)]
    threads = [threading.Thread(target=consume, args=(b,)) for b in consumers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    flat = [i for mine in seen for i in mine]
    assert sorted(flat) == sorted(ids)  # every job once, none twice


def claims_a_job_enqueued_meanwhile(consumer: QueueBackend, producer: QueueBackend, queue: str) -> None:
    """A claim waiting on the empty ``queue`` returns the job ``producer`` enqueues 0.3 s later."""
    new = job(queue)
    timer = threading.Timer(0.3, producer.enqueue, args=(new,))
    timer.start()
    try:
        got = consumer.claim(queue, "w", lease=LONG, limit=1, timeout=30)
    finally:
        timer.join()
    assert [c.id for c in got] == [new.id]


def test_claim_blocks_until_a_job_arrives(backend: QueueBackend, queue: str) -> None:
    claims_a_job_enqueued_meanwhile(backend, backend, queue)


def test_claim_wakes_for_a_job_enqueued_by_another_connection(
    open_backend: Callable[[], QueueBackend], queue: str
) -> None:
    consumer, producer = open_backend(), open_backend()
    claims_a_job_enqueued_meanwhile(consumer, producer, queue)


def test_claim_on_an_empty_queue_returns_nothing_after_its_timeout(backend: QueueBackend, queue: str) -> None:
    assert backend.claim(queue, "w", lease=LONG, limit=1, timeout=0.2) == []
    assert backend.claim(queue, "w", lease=LONG, limit=1, timeout=0) == []


def test_a_lapsed_lease_redelivers_only_that_job(backend: QueueBackend, queue: str) -> None:
    # Given two jobs: one leased briefly, one leased for a minute
    short, long_ = job(queue), job(queue)
    backend.enqueue(short)
    first = claim_one(backend, queue, lease=SHORT)
    backend.enqueue(long_)
    claim_one(backend, queue, lease=LONG)
    assert first.id == short.id
    # When the short lease lapses, then only that job comes back, counted as a redelivery
    again = claim_until(backend, queue, lambda c: True)
    assert again.id == short.id
    assert again.deliveries == 2
    assert again.token != first.token
    assert backend.claim(queue, "w", lease=LONG, limit=5, timeout=0.3) == []
    state = expect(backend.get(long_.id), JobStatus.RUNNING)
    assert state.deliveries == 1


def test_heartbeat_extends_the_lease(backend: QueueBackend, queue: str) -> None:
    backend.enqueue(job(queue))
    c = claim_one(backend, queue, lease=SHORT)
    assert backend.heartbeat(c.id, c.token, lease=LONG)
    time.sleep(SHORT * 2)
    assert backend.claim(queue, "w2", lease=LONG, limit=1, timeout=0.2) == []
    assert backend.complete(c.id, c.token, b"done")


def test_stale_tokens_are_fenced(backend: QueueBackend, queue: str) -> None:
    # Given a job whose first lease lapsed and which was redelivered
    backend.enqueue(job(queue))
    old = claim_one(backend, queue, lease=SHORT)
    new = claim_until(backend, queue, lambda c: c.id == old.id)
    # Then the old token can neither extend, fail nor release it
    assert not backend.heartbeat(old.id, old.token, lease=LONG)
    assert not backend.fail(old.id, old.token, b"{}", retry_at=time.time())
    assert not backend.release(old.id, old.token)
    state = expect(backend.get(old.id), JobStatus.RUNNING)
    assert state.attempts == 0
    # The current token still can
    assert backend.heartbeat(new.id, new.token, lease=LONG)


def test_a_stale_completion_is_kept_once_and_the_current_one_is_refused(
    backend: QueueBackend, queue: str
) -> None:
    backend.enqueue(job(queue))
    old = claim_one(backend, queue, lease=SHORT)
    new = claim_until(backend, queue, lambda c: c.id == old.id)
    assert backend.complete(old.id, old.token, b'"from the old worker"')  # the work was done
    assert not backend.complete(new.id, new.token, b'"from the new worker"')
    assert not backend.heartbeat(new.id, new.token, lease=LONG)
    state = expect(backend.get(old.id), JobStatus.SUCCEEDED)
    assert state.result == b'"from the old worker"'


def test_completion_is_written_once(backend: QueueBackend, queue: str) -> None:
    backend.enqueue(job(queue))
    c = claim_one(backend, queue, lease=SHORT)
    assert backend.complete(c.id, c.token, b"\x00binary\xff")
    assert not backend.complete(c.id, c.token, b"second")
    # A completed job is never claimed again, even after its lease would have lapsed
    time.sleep(SHORT * 2)
    assert backend.claim(queue, "w", lease=LONG, limit=5, timeout=0.2) == []
    state = expect(backend.get(c.id), JobStatus.SUCCEEDED)
    assert state.result == b"\x00binary\xff"
    assert state.finished_at is not None


def test_a_job_completed_while_queued_for_redelivery_is_not_run_again(
    backend: QueueBackend, queue: str
) -> None:
    backend.enqueue(job(queue))
    c = claim_one(backend, queue, lease=SHORT)
    time.sleep(SHORT * 2)  # its lease lapsed; nobody claimed it yet
    assert backend.complete(c.id, c.token, b"1")
    assert backend.claim(queue, "w", lease=LONG, limit=5, timeout=0.2) == []


# -- failures, retries, dead letters --------------------------------------------------


def test_fail_with_retry_at_schedules_the_retry_in_the_store(backend: QueueBackend, queue: str) -> None:
    backend.enqueue(job(queue, max_retries=2))
    c = claim_one(backend, queue)
    retry_at = time.time() + 0.6
    assert backend.fail(c.id, c.token, b'{"type":"builtins.ValueError"}', retry_at=retry_at)
    state = expect(backend.get(c.id), JobStatus.QUEUED)
    assert state.attempts == 1
    assert state.error == b'{"type":"builtins.ValueError"}'
    assert backend.stats(queue).scheduled == 1
    assert backend.claim(queue, "w", lease=LONG, limit=1, timeout=0) == []
    # A claimer waiting past retry_at gets it, with the attempt counted
    again = backend.claim(queue, "w", lease=LONG, limit=1, timeout=30)
    assert [a.id for a in again] == [c.id]
    assert again[0].attempts == 1
    assert again[0].deliveries == 2
    assert time.time() >= retry_at


def test_fail_with_a_dead_reason_dead_letters_and_requeue_restores(backend: QueueBackend, queue: str) -> None:
    backend.enqueue(job(queue))
    c = claim_one(backend, queue)
    assert backend.fail(c.id, c.token, b'{"message":"bad"}', dead_reason="unknown unit 'x'")
    state = expect(backend.get(c.id), JobStatus.DEAD)
    assert state.dead_reason == "unknown unit 'x'"
    dead = backend.dead_letters(queue)
    assert [d.id for d in dead] == [c.id]
    assert dead[0].dead_reason == "unknown unit 'x'"
    assert c.id in {d.id for d in backend.dead_letters()}
    assert backend.stats(queue).dead == 1
    assert backend.claim(queue, "w", lease=LONG, limit=1, timeout=0) == []
    # Requeue: back in the queue with fresh counters
    assert backend.requeue(c.id)
    state = expect(backend.get(c.id), JobStatus.QUEUED)
    assert (state.attempts, state.deliveries, state.dead_reason) == (0, 0, None)
    assert backend.dead_letters(queue) == []
    again = claim_one(backend, queue)
    assert again.deliveries == 1
    assert not backend.requeue(c.id)  # not dead any more


def test_fail_for_good_and_requeue(backend: QueueBackend, queue: str) -> None:
    backend.enqueue(job(queue))
    c = claim_one(backend, queue)
    assert backend.fail(c.id, c.token, b'{"message":"no"}')
    state = expect(backend.get(c.id), JobStatus.FAILED)
    assert state.error == b'{"message":"no"}'
    assert state.finished_at is not None
    assert not backend.fail(c.id, c.token, b"{}")
    assert backend.requeue(c.id)
    assert claim_one(backend, queue).id == c.id


def wait_dead(backend: QueueBackend, queue: str, job_id: str) -> Any:
    """Claim (nothing may come back) until ``job_id``'s lapsed lease dead-letters it."""
    deadline = time.monotonic() + 15
    state = backend.get(job_id)
    while state is not None and state.status is not JobStatus.DEAD and time.monotonic() < deadline:
        assert backend.claim(queue, "w", lease=LONG, limit=1, timeout=0.3) == []
        state = backend.get(job_id)
    return expect(state, JobStatus.DEAD)


def test_a_job_that_keeps_killing_its_worker_while_alone_is_dead_lettered(
    backend: QueueBackend, queue: str
) -> None:
    backend.enqueue(job(queue, max_deliveries=2))
    first = claim_one(backend, queue, lease=SHORT)
    assert not first.suspect
    # Its first lease lapses while it ran beside others (not marked alone): not charged,
    # and the next delivery is a suspect
    second = claim_until(backend, queue, lambda c: c.id == first.id, lease=SHORT)
    assert (second.deliveries, second.suspect) == (2, True)
    # Run alone twice, and twice its worker dies
    assert backend.mark_alone(second.id, second.token)
    third = claim_until(backend, queue, lambda c: c.id == first.id, lease=SHORT)
    assert third.suspect
    assert backend.mark_alone(third.id, third.token)
    # Its second lone lease lapses: the next claim dead-letters it instead of delivering it
    state = wait_dead(backend, queue, first.id)
    assert state.dead_reason
    assert "alone" in state.dead_reason
    assert "keeps killing or hanging its worker" in state.dead_reason
    assert [d.id for d in backend.dead_letters(queue)] == [first.id]


def test_only_the_delivery_marked_alone_is_charged_with_the_death(backend: QueueBackend, queue: str) -> None:
    # Given two jobs that may kill their worker only once, held by one worker; one ran alone
    lone, beside = job(queue, max_deliveries=1), job(queue, max_deliveries=1)
    backend.enqueue_many([lone, beside])
    got = {c.id: c for c in backend.claim(queue, "w", lease=SHORT, limit=2, timeout=5)}
    assert set(got) == {lone.id, beside.id}
    assert backend.mark_alone(lone.id, got[lone.id].token)
    # When the worker dies (both leases lapse), the one beside it comes back, a suspect ...
    back = claim_until(backend, queue, lambda c: True)
    assert (back.id, back.suspect) == (beside.id, True)
    assert backend.complete(back.id, back.token, b"1")
    # ... and only the one that ran alone is dead-lettered
    assert "keeps killing" in (expect(backend.get(lone.id), JobStatus.DEAD).dead_reason or "")
    assert backend.claim(queue, "w", lease=LONG, limit=2, timeout=0.2) == []


def test_mark_alone_is_fenced_by_the_token(backend: QueueBackend, queue: str) -> None:
    backend.enqueue(job(queue))
    c = claim_one(backend, queue, lease=LONG)
    assert not backend.mark_alone(c.id, "stale-token")
    assert backend.mark_alone(c.id, c.token)
    assert backend.complete(c.id, c.token, b"1")
    assert not backend.mark_alone(c.id, c.token)
    assert not backend.mark_alone("no-such-job", c.token)


def test_progress_is_fenced_kept_after_the_end_and_cleared_by_requeue(
    backend: QueueBackend, queue: str
) -> None:
    backend.enqueue(job(queue, max_retries=0))
    c = claim_one(backend, queue, lease=LONG)
    assert expect(backend.get(c.id), JobStatus.RUNNING).progress is None
    assert not backend.progress(c.id, "stale-token", JobProgress(1, 10, "nope", at=1.0))
    assert backend.progress(c.id, c.token, JobProgress(3, 10, "frame 3/10", at=100.0))
    assert backend.progress(c.id, c.token, JobProgress(4, 10, "frame 4/10", at=101.0))
    running = expect(backend.get(c.id), JobStatus.RUNNING)
    assert running.progress == JobProgress(4.0, 10.0, "frame 4/10", 101.0)
    assert running.progress.fraction == 0.4
    assert backend.fail(c.id, c.token, b'{"type": "RuntimeError", "message": "boom"}')
    # the last record stays on the finished job (how far it got), and nothing writes over it
    failed = expect(backend.get(c.id), JobStatus.FAILED)
    assert failed.progress == running.progress
    assert not backend.progress(c.id, c.token, JobProgress(9, 10, "late", at=102.0))
    assert backend.requeue(c.id)
    assert expect(backend.get(c.id), JobStatus.QUEUED).progress is None
    assert not backend.progress("no-such-job", c.token, JobProgress(1))


TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\nrojo=00f067aa0ba902b7,congo=t61rcWkgMzE"


def test_the_trace_context_travels_with_every_delivery_and_a_bad_one_reads_as_none(
    backend: QueueBackend, queue: str
) -> None:
    # Given a traced job, an untraced one (as an older Foundry wrote them) and a traced
    # job whose stored context was then overwritten with junk, as a foreign writer could
    traced, plain, tampered = job(queue, trace=TRACE), job(queue), job(queue, trace=TRACE)
    backend.enqueue_many([traced, plain])
    backend.enqueue(tampered)
    rewrite_job(backend, tampered.id, trace="00-" + "f" * 5000)
    # When they are claimed, and the traced one is given back and claimed again
    first = {c.id: c for c in backend.claim(queue, "w-test", lease=LONG, limit=3, timeout=5.0)}
    assert set(first) == {traced.id, plain.id, tampered.id}
    assert backend.release(traced.id, first[traced.id].token)
    again = claim_one(backend, queue)
    # Then the context comes back as stored on every delivery; the junk is ignored, not fatal
    assert first[traced.id].trace == TRACE
    assert (again.id, again.trace) == (traced.id, TRACE)
    assert first[plain.id].trace is None
    assert first[tampered.id].trace is None
    assert backend.complete(tampered.id, first[tampered.id].token, b"1")


def test_requeue_forgets_the_deaths(backend: QueueBackend, queue: str) -> None:
    backend.enqueue(job(queue, max_deliveries=1))
    c = claim_one(backend, queue, lease=SHORT)
    assert backend.mark_alone(c.id, c.token)
    wait_dead(backend, queue, c.id)
    assert backend.requeue(c.id)
    again = claim_one(backend, queue, lease=SHORT)
    assert (again.deliveries, again.suspect) == (1, False)
    assert backend.mark_alone(again.id, again.token)
    assert "alone in it, 1 time(s)" in (wait_dead(backend, queue, c.id).dead_reason or "")


def test_released_deliveries_do_not_poison_a_job(backend: QueueBackend, queue: str) -> None:
    backend.enqueue(job(queue, max_deliveries=1))
    for _ in range(3):
        c = claim_one(backend, queue, lease=LONG)
        assert c.deliveries == 1
        assert backend.release(c.id, c.token)
    c = claim_one(backend, queue, lease=LONG)
    assert backend.complete(c.id, c.token, b"1")


def test_release_makes_the_job_claimable_at_once(backend: QueueBackend, queue: str) -> None:
    backend.enqueue(job(queue))
    c = claim_one(backend, queue, lease=LONG)
    assert backend.release(c.id, c.token)
    assert not backend.release(c.id, c.token)
    expect(backend.get(c.id), JobStatus.QUEUED)
    again = claim_one(backend, queue, lease=LONG, timeout=0.5)
    assert again.id == c.id
    assert again.token != c.token


# -- delays, priorities, cancel ---------------------------------------------------------


def test_a_delayed_job_is_not_claimable_before_its_eta(backend: QueueBackend, queue: str) -> None:
    eta = time.time() + 0.8
    backend.enqueue(job(queue, eta=eta))
    assert backend.claim(queue, "w", lease=LONG, limit=1, timeout=0) == []
    stats = backend.stats(queue)
    assert (stats.depth, stats.scheduled) == (0, 1)
    got = backend.claim(queue, "w", lease=LONG, limit=1, timeout=30)
    assert len(got) == 1
    assert time.time() >= eta


def test_a_delayed_job_survives_in_the_store(open_backend: Callable[[], QueueBackend], queue: str) -> None:
    first = open_backend()
    new = job(queue, eta=time.time() + 0.5)
    first.enqueue(new)
    other = open_backend()  # another process's view: the delay lives in the store, not in memory
    got = other.claim(queue, "w", lease=LONG, limit=1, timeout=30)
    assert [c.id for c in got] == [new.id]


def test_priorities_order_claims_then_fifo(backend: QueueBackend, queue: str) -> None:
    if not backend.capabilities.priority:
        pytest.skip(f"{type(backend).__name__} does not order by priority (capabilities.priority=False)")
    jobs = [
        job(queue, id=f"p0-a-{uuid.uuid4().hex[:6]}", priority=0),
        job(queue, id=f"p5-a-{uuid.uuid4().hex[:6]}", priority=5),
        job(queue, id=f"p1-a-{uuid.uuid4().hex[:6]}", priority=1),
        job(queue, id=f"p5-b-{uuid.uuid4().hex[:6]}", priority=5),
        job(queue, id=f"p0-b-{uuid.uuid4().hex[:6]}", priority=0),
    ]
    for j in jobs:
        backend.enqueue(j)
        time.sleep(0.002)  # distinct enqueue times
    order = [claim_one(backend, queue).id[:4] for _ in jobs]
    assert order == ["p5-a", "p5-b", "p1-a", "p0-a", "p0-b"]


def test_cancel_a_queued_job(backend: QueueBackend, queue: str) -> None:
    new = job(queue)
    backend.enqueue(new)
    assert backend.cancel(new.id) is CancelResult.CANCELLED
    assert backend.cancel(new.id) is CancelResult.CANCELLED  # still will not run
    state = expect(backend.get(new.id), JobStatus.CANCELLED)
    assert state.deliveries == 0
    assert backend.claim(queue, "w", lease=LONG, limit=1, timeout=0.2) == []


def test_cancel_a_delayed_job(backend: QueueBackend, queue: str) -> None:
    new = job(queue, eta=time.time() + 0.5)
    backend.enqueue(new)
    assert backend.cancel(new.id) is CancelResult.CANCELLED
    assert backend.claim(queue, "w", lease=LONG, limit=1, timeout=1.0) == []


def test_cancel_of_a_running_job_is_a_request_every_worker_host_sees(
    open_backend: Callable[[], QueueBackend], queue: str
) -> None:
    # Given a job leased by a worker on one connection ("host"), and another running beside it
    worker, admin = open_backend(), open_backend()
    worker.enqueue(job(queue))
    worker.enqueue(job(queue))
    c, other = worker.claim(queue, "w", lease=LONG, limit=2, timeout=5)
    assert worker.cancel_requests([c.id, other.id], timeout=0) == []
    # When somebody else cancels it
    assert admin.cancel(c.id) is CancelResult.REQUESTED
    # Then the request is in the store, the job still runs, and its worker is told
    state = expect(admin.get(c.id), JobStatus.RUNNING)
    assert state.cancel_requested_at is not None
    assert worker.cancel_requests([c.id, other.id], timeout=10) == [c.id]
    assert expect(worker.get(other.id), JobStatus.RUNNING).cancel_requested_at is None
    # A repeated cancel keeps the first request
    assert admin.cancel(c.id) is CancelResult.REQUESTED
    assert expect(admin.get(c.id), JobStatus.RUNNING).cancel_requested_at == state.cancel_requested_at
    assert worker.heartbeat(c.id, c.token, lease=LONG)  # it is still that worker's to stop


def test_a_cancel_request_wakes_a_worker_waiting_for_one(
    open_backend: Callable[[], QueueBackend], queue: str
) -> None:
    worker, admin = open_backend(), open_backend()
    worker.enqueue(job(queue))
    c = claim_one(worker, queue)
    heard: list[list[str]] = []
    # Given a worker waiting (up to a minute) for a cancel request of the job it runs
    t = threading.Thread(target=lambda: heard.append(worker.cancel_requests([c.id], timeout=60)))
    t.start()
    try:
        time.sleep(0.2)
        # When another connection requests it, then the waiter returns with it
        assert admin.cancel(c.id) is CancelResult.REQUESTED
    finally:
        t.join(30)
    assert not t.is_alive()
    assert heard == [[c.id]]


def test_cancel_requests_waits_at_most_its_timeout(backend: QueueBackend, queue: str) -> None:
    backend.enqueue(job(queue))
    c = claim_one(backend, queue)
    waiting = job(queue)
    backend.enqueue(waiting)
    assert backend.cancel_requests([c.id, waiting.id, "no-such-job"], timeout=0.3) == []
    assert backend.cancel_requests([], timeout=5) == []


@pytest.mark.parametrize("end", ["complete", "retry", "dead", "fail", "release"])
def test_every_end_of_a_delivery_whose_cancel_was_requested_is_cancelled(
    backend: QueueBackend, queue: str, end: str
) -> None:
    # Given a running job, retries left, whose cancel was requested
    new = job(queue, max_retries=3)
    backend.enqueue(new)
    c = claim_one(backend, queue)
    assert backend.cancel(c.id) is CancelResult.REQUESTED
    # When its worker ends the delivery in any way
    error = b'{"type": "foundry.errors.CancelledError", "message": "stopped"}'
    if end == "complete":
        assert not backend.complete(c.id, c.token, b'"late result"')  # not recorded: dropped
    elif end == "retry":
        assert backend.fail(c.id, c.token, error, retry_at=time.time())
    elif end == "dead":
        assert backend.fail(c.id, c.token, error, dead_reason="would have been poison")
    elif end == "fail":
        assert backend.fail(c.id, c.token, error)
    else:
        assert backend.release(c.id, c.token)
    # Then it ended cancelled, once: never retried, dead-lettered or delivered again
    state = expect(backend.wait(c.id, timeout=5), JobStatus.CANCELLED)
    assert state.result is None
    assert state.finished_at is not None
    assert state.dead_reason is None
    assert (state.error == error) is (end in ("retry", "dead", "fail"))
    assert backend.claim(queue, "w", lease=LONG, limit=5, timeout=0.3) == []
    assert [d.id for d in backend.dead_letters(queue)] == []
    assert not backend.complete(c.id, c.token, b"1")
    assert not backend.fail(c.id, c.token, b"{}", retry_at=time.time())
    assert not backend.requeue(c.id)
    assert backend.cancel(c.id) is CancelResult.CANCELLED
    expect(backend.get(c.id), JobStatus.CANCELLED)


def test_a_lapsed_lease_of_a_job_whose_cancel_was_requested_ends_it_cancelled(
    backend: QueueBackend, queue: str
) -> None:
    # Given a running job whose cancel was requested, and whose worker then died
    backend.enqueue(job(queue))
    c = claim_one(backend, queue, lease=1.0)
    assert backend.cancel(c.id) is CancelResult.REQUESTED
    # When its lease lapses (claimers put lapsed leases back), then it ends cancelled
    deadline = time.monotonic() + 15
    while (state := backend.get(c.id)) is not None and state.status is JobStatus.RUNNING:
        assert time.monotonic() < deadline, "the lapsed lease was never recovered"
        assert backend.claim(queue, "w", lease=LONG, limit=1, timeout=0.3) == []  # never redelivered
    expect(state, JobStatus.CANCELLED)
    assert backend.claim(queue, "w", lease=LONG, limit=1, timeout=0.2) == []


def test_cancel_of_a_job_held_by_a_worker_that_is_gone_ends_it_at_once(
    backend: QueueBackend, queue: str
) -> None:
    backend.enqueue(job(queue))
    c = claim_one(backend, queue, lease=SHORT)
    time.sleep(SHORT * 2)  # its worker died: the lease lapsed, nobody recovered it yet
    assert backend.cancel(c.id) is CancelResult.CANCELLED
    expect(backend.get(c.id), JobStatus.CANCELLED)
    assert backend.claim(queue, "w", lease=LONG, limit=1, timeout=0.2) == []


def test_a_job_that_finished_before_the_cancel_keeps_its_outcome(backend: QueueBackend, queue: str) -> None:
    for end in ("complete", "fail", "dead"):
        backend.enqueue(job(queue))
        c = claim_one(backend, queue)
        if end == "complete":
            assert backend.complete(c.id, c.token, b'"done"')
        else:
            assert backend.fail(c.id, c.token, b"{}", dead_reason="poison" if end == "dead" else None)
        assert backend.cancel(c.id) is CancelResult.FINISHED
        state = backend.get(c.id)
        assert state is not None
        assert state.status is {"complete": JobStatus.SUCCEEDED, "fail": JobStatus.FAILED}.get(
            end, JobStatus.DEAD
        )
        assert state.cancel_requested_at is None
    assert backend.cancel("no-such-job") is CancelResult.UNKNOWN


def test_cancel_can_leave_running_jobs_alone(backend: QueueBackend, queue: str) -> None:
    backend.enqueue(job(queue))
    c = claim_one(backend, queue)
    waiting = job(queue)
    backend.enqueue(waiting)
    assert backend.cancel(c.id, running=False) is CancelResult.RUNNING
    assert expect(backend.get(c.id), JobStatus.RUNNING).cancel_requested_at is None
    assert backend.cancel(waiting.id, running=False) is CancelResult.CANCELLED
    assert backend.complete(c.id, c.token, b"1")


def test_a_stale_worker_cannot_end_a_job_whose_cancel_was_requested(
    backend: QueueBackend, queue: str
) -> None:
    backend.enqueue(job(queue))
    old = claim_one(backend, queue, lease=SHORT)
    new = claim_until(backend, queue, lambda c: c.id == old.id)
    assert backend.cancel(new.id) is CancelResult.REQUESTED
    assert not backend.fail(old.id, old.token, b"{}")
    assert not backend.release(old.id, old.token)
    expect(backend.get(new.id), JobStatus.RUNNING)
    assert backend.fail(new.id, new.token, b"{}", retry_at=time.time())
    expect(backend.get(new.id), JobStatus.CANCELLED)


# -- waiting and results across processes ------------------------------------------------


def test_wait_returns_when_another_connection_completes(
    open_backend: Callable[[], QueueBackend], queue: str
) -> None:
    submitter, worker = open_backend(), open_backend()
    new = job(queue)
    submitter.enqueue(new)

    def work() -> None:
        c = worker.claim(queue, "w", lease=LONG, limit=1, timeout=10)[0]
        time.sleep(0.2)
        worker.complete(c.id, c.token, b'{"ok":true}')

    t = threading.Thread(target=work)
    t.start()
    try:
        state = submitter.wait(new.id, timeout=30)
    finally:
        t.join()
    assert expect(state, JobStatus.SUCCEEDED).result == b'{"ok":true}'


def test_wait_times_out_with_the_current_state(backend: QueueBackend, queue: str) -> None:
    new = job(queue)
    backend.enqueue(new)
    expect(backend.wait(new.id, timeout=0.2), JobStatus.QUEUED)
    assert backend.wait("no-such-job", timeout=0.1) is None


def test_wait_sees_every_end(backend: QueueBackend, queue: str) -> None:
    ids = []
    for outcome in ("fail", "dead", "cancel"):
        new = job(queue)
        backend.enqueue(new)
        ids.append((outcome, new.id))
        if outcome == "cancel":
            backend.cancel(new.id)
            continue
        c = claim_one(backend, queue)
        if outcome == "fail":
            backend.fail(c.id, c.token, b"{}")
        else:
            backend.fail(c.id, c.token, b"{}", dead_reason="poison")
    ends = {o: backend.wait(i, timeout=5) for o, i in ids}
    assert {o: s.status for o, s in ends.items() if s} == {
        "fail": JobStatus.FAILED,
        "dead": JobStatus.DEAD,
        "cancel": JobStatus.CANCELLED,
    }


# -- stats and purge -----------------------------------------------------------------------


def test_stats_count_depth_age_running_scheduled_and_dead(backend: QueueBackend, queue: str) -> None:
    assert backend.stats(queue).depth == 0
    assert backend.stats(queue).oldest_age == 0.0
    backend.enqueue_many([job(queue) for _ in range(4)])
    backend.enqueue(job(queue, eta=time.time() + 3600))
    time.sleep(0.3)
    _, b = backend.claim(queue, "w", lease=LONG, limit=2, timeout=1)
    backend.fail(b.id, b.token, b"{}", dead_reason="test")
    stats = backend.stats(queue)
    assert (stats.depth, stats.scheduled, stats.running, stats.dead) == (2, 1, 1, 1)
    assert stats.oldest_age >= 0.2


def test_purge_removes_expired_results_and_frees_the_key(backend: QueueBackend, queue: str) -> None:
    key = f"k-{uuid.uuid4().hex}"
    new = job(queue, key=key, result_ttl=5.0)
    keep = job(queue, result_ttl=3600.0)
    backend.enqueue(new)
    backend.enqueue(keep)
    for c in backend.claim(queue, "w", lease=LONG, limit=2, timeout=1):
        backend.complete(c.id, c.token, b"1")
    pending = job(queue)
    backend.enqueue(pending)
    assert backend.purge() == 0
    assert backend.purge(now=time.time() + 60) >= 1
    assert backend.get(new.id) is None
    assert backend.get(keep.id) is not None
    assert backend.get(pending.id) is not None  # unfinished jobs are never purged
    assert backend.find(key) is None
    assert backend.enqueue(job(queue, key=key)).created


# -- bad input -------------------------------------------------------------------------------


BAD_JOBS: list[tuple[str, Any]] = [
    ("queue", ""),
    ("unit", ""),
    ("id", ""),
    ("codec", "yaml"),
    ("key", ""),
    ("priority", "high"),
    ("eta", float("nan")),
    ("max_retries", -1),
    ("max_deliveries", 0),
    ("timeout", 0),
    ("result_ttl", -5),
    ("payload", "not bytes"),
    ("trace", "00-not-a-trace-01"),
]


def test_bad_jobs_are_refused_and_nothing_is_stored(backend: QueueBackend, queue: str) -> None:
    for field, value in BAD_JOBS:
        good = job(queue)
        bad = job(queue, **{field: value})
        with pytest.raises(SubmitError, match=field):
            backend.enqueue(bad)
        with pytest.raises(SubmitError, match=field):
            backend.enqueue_many([good, bad])
        assert backend.get(good.id) is None  # the batch was refused whole
    assert backend.stats(queue).depth == 0


def test_bad_claims_are_refused(backend: QueueBackend, queue: str) -> None:
    for field, value in [("limit", 0), ("lease", 0), ("lease", -1.0)]:
        args: dict[str, Any] = {"lease": LONG, "limit": 1, "timeout": 0, field: value}
        with pytest.raises(SubmitError, match=field):
            backend.claim(queue, "w", **args)


def test_operations_on_unknown_jobs_change_nothing(backend: QueueBackend) -> None:
    assert backend.get("nope") is None
    assert backend.find("nope") is None
    assert not backend.heartbeat("nope", "t", lease=1)
    assert not backend.complete("nope", "t", b"1")
    assert not backend.fail("nope", "t", b"{}")
    assert not backend.release("nope", "t")
    assert not backend.requeue("nope")
    assert backend.cancel("nope") is CancelResult.UNKNOWN
    assert backend.cancel_requests(["nope"], timeout=0) == []


def test_bad_urls_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="sqlite"):
        open_queue_backend("sqlte:///queue.db")
    with pytest.raises(ConfigError, match="scheme"):
        open_queue_backend("queue.db")
    with pytest.raises(ConfigError, match="names no file"):
        open_queue_backend("sqlite://")
    with pytest.raises(ConfigError, match="prefix"):
        open_queue_backend("memory://?prefix=bad-name")
    with pytest.raises(ConfigError, match="unknown option"):
        open_queue_backend("memory://?synchronus=full")
