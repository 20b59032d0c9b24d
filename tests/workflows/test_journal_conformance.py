"""The JournalBackend contract (foundry/backends/journal/base.py), on every engine."""

from __future__ import annotations

import threading
import uuid

import pytest

from foundry.backends.journal import JournalBackend, ManualClock, open_journal
from foundry.backends.journal.base import Entry, NewWorkflow, WorkflowStatus
from foundry.errors import LeaseLostError, NotFoundError, SubmitError, WorkflowFinishedError
from tests.adversarial._hostile import rewrite_workflow

LEASE = 10.0


def new(name: str = "wf", **kw: object) -> NewWorkflow:
    return NewWorkflow(id=f"{name}-{uuid.uuid4().hex[:8]}", name=name, args=b"{}", **kw)  # type: ignore[arg-type]


def ok(pos: int, name: str = "s", result: bytes = b"1", kind: str = "step") -> Entry:
    return Entry(pos, kind, name, "ok", result=result, attempts=1, started_at=1.0, finished_at=2.0)


def waiting(pos: int, kind: str = "sleep", name: str = "sleep", wake_at: float = 0.0, **kw: object) -> Entry:
    return Entry(pos, kind, name, "waiting", started_at=1.0, wake_at=wake_at, **kw)  # type: ignore[arg-type]


def started(journal: JournalBackend, owner: str = "w1", **kw: object) -> tuple[str, int]:
    s = journal.start(new(**kw), owner=owner, lease=LEASE)  # type: ignore[arg-type]
    assert s.claim is not None
    return s.state.id, s.claim.token


def test_start_is_idempotent_on_the_id(journal: JournalBackend) -> None:
    wf = new()
    first = journal.start(wf, owner="a", lease=LEASE)
    again = journal.start(NewWorkflow(wf.id, "wf", b'{"other": 1}'), owner="b", lease=LEASE)
    assert first.created
    assert first.claim is not None
    assert first.claim.token == 1
    assert first.claim.fresh
    assert not again.created
    assert again.claim is None
    assert again.state.args == b"{}"
    assert again.state.owner == "a"
    assert [s.id for s in journal.workflows()] == [wf.id]


def test_start_without_owner_is_pending_and_claimable(journal: JournalBackend) -> None:
    wf = new()
    s = journal.start(wf)
    assert s.state.status == WorkflowStatus.PENDING
    assert s.claim is None
    [claim] = journal.claim("w1", lease=LEASE)
    assert claim.id == wf.id
    assert claim.token == 1
    assert claim.status == WorkflowStatus.RUNNING
    assert journal.claim("w2", lease=LEASE) == []


def test_record_stores_every_field_as_given(journal: JournalBackend) -> None:
    # (an engine may write the common entry — no error, timer, ref or detail — with a
    # statement of its own: each shape must come back field for field)
    wid, token = started(journal)
    entries = [
        ok(0),
        Entry(1, "step", "s", "ok", result=None, attempts=2, started_at=1.5, finished_at=2.5, ref=0),
        Entry(2, "step", "s", "error", error=b'{"type": "X"}', attempts=1, started_at=1.0, finished_at=2.0),
        Entry(3, "step", "s", "ok", result=b'"a"', attempts=1, started_at=1.0, finished_at=2.0, detail="d"),
        waiting(4, wake_at=9.0, detail="5s"),
    ]
    for entry in entries:
        rec = journal.record(wid, token, entry)
        assert rec.written
        assert rec.entry == entry
    # a waiting entry resolved by an entry with none of those fields clears them
    resolved = ok(4, name="sleep", kind="sleep", result=b"null")
    assert journal.record(wid, token, resolved).written
    _, loaded = journal.load(wid)
    assert loaded == [*entries[:4], resolved]
    # and a final entry is never replaced
    rec = journal.record(wid, token, ok(0, result=b"2"))
    assert not rec.written
    assert rec.entry == entries[0]


def test_lease_expiry_hands_the_workflow_over_and_fences_the_old_run(
    journal: JournalBackend, clock: ManualClock
) -> None:
    wid, token = started(journal)
    journal.record(wid, token, ok(0))
    assert journal.claim("w2", lease=LEASE) == []
    assert journal.claim_one(wid, "w2", lease=LEASE) is None
    clock.advance(LEASE + 0.1)
    [claim] = journal.claim("w2", lease=LEASE)
    assert claim.token == token + 1
    assert claim.claims == 2
    # The stalled first run can no longer write anything.
    with pytest.raises(LeaseLostError, match="stale"):
        journal.record(wid, token, ok(1))
    with pytest.raises(LeaseLostError):
        journal.finish(wid, token, WorkflowStatus.SUCCEEDED, result=b"1")
    assert not journal.heartbeat(wid, token, lease=LEASE).alive
    state, entries = journal.load(wid)
    assert [e.position for e in entries] == [0]
    assert state.status == WorkflowStatus.RUNNING


def test_heartbeat_extends_the_lease(journal: JournalBackend, clock: ManualClock) -> None:
    wid, token = started(journal)
    clock.advance(LEASE * 0.9)
    beat = journal.heartbeat(wid, token, lease=LEASE, current_step="deploy", step_started_at=5.0)
    assert beat.alive
    assert not beat.cancel_requested
    clock.advance(LEASE * 0.9)
    assert journal.claim("w2", lease=LEASE) == []
    state = journal.get(wid)
    assert state is not None
    assert state.current_step == "deploy"
    assert state.step_started_at == 5.0


def test_an_entry_is_written_once_per_position(journal: JournalBackend) -> None:
    wid, token = started(journal)
    first = journal.record(wid, token, ok(0, result=b"1"))
    second = journal.record(wid, token, ok(0, result=b"2"))
    assert first.written
    assert not second.written
    assert second.entry.result == b"1"
    _, entries = journal.load(wid)
    assert [(e.position, e.result) for e in entries] == [(0, b"1")]
    state = journal.get(wid)
    assert state is not None
    assert state.position == 1


def test_a_waiting_entry_is_replaced_then_resolved_once(journal: JournalBackend) -> None:
    wid, token = started(journal)
    assert journal.record(wid, token, waiting(0, kind="step", name="s", wake_at=5.0)).written
    assert journal.record(wid, token, waiting(0, kind="step", name="s", wake_at=9.0)).written
    assert journal.record(wid, token, ok(0)).written
    late = journal.record(wid, token, waiting(0, kind="step", name="s", wake_at=20.0))
    assert not late.written
    assert late.entry.status == "ok"


def test_claim_filters_by_name_limits_and_orders_by_due_time(
    journal: JournalBackend, clock: ManualClock
) -> None:
    ids = []
    for _ in range(3):
        ids.append(journal.start(new("a")).state.id)
        clock.advance(1)
    other = journal.start(new("b")).state.id
    assert journal.claim("w", lease=LEASE, names=[]) == []
    got = journal.claim("w", lease=LEASE, limit=2, names=["a"])
    assert [c.id for c in got] == ids[:2]
    rest = journal.claim("w", lease=LEASE, limit=10, names=["a", "c"])
    assert [c.id for c in rest] == ids[2:]
    assert [c.id for c in journal.claim("w", lease=LEASE, limit=10)] == [other]


def test_concurrent_claimers_never_share_a_workflow(journal_url: str, clock: ManualClock) -> None:
    setup = open_journal(journal_url, clock=clock)
    try:
        ids = {setup.start(new()).state.id for _ in range(40)}
    finally:
        setup.close()
    taken: dict[str, list[str]] = {"x": [], "y": []}

    def take(owner: str) -> None:
        j = open_journal(journal_url, clock=clock)
        try:
            while claims := j.claim(owner, lease=LEASE, limit=3):
                taken[owner].extend(c.id for c in claims)
        finally:
            j.close()

    threads = [threading.Thread(target=take, args=(o,)) for o in taken]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not set(taken["x"]) & set(taken["y"])
    assert set(taken["x"]) | set(taken["y"]) == ids


def test_transactional_record_commits_writes_with_the_entry(journal: JournalBackend) -> None:
    wid, token = started(journal)
    table = f"effects_{uuid.uuid4().hex[:8]}"
    with_rows = journal.record_transactional(
        wid, token, 0, lambda tx: (tx.execute(f"CREATE TABLE {table} (k TEXT PRIMARY KEY)"), ok(0))[1]
    )
    assert with_rows.written

    def write(tx: object, key: str, fail: bool) -> Entry:
        tx.execute(f"INSERT INTO {table} (k) VALUES (?)", (key,))  # type: ignore[attr-defined]
        if fail:
            raise RuntimeError("boom")
        return ok(1, "write")

    with pytest.raises(RuntimeError, match="boom"):
        journal.record_transactional(wid, token, 1, lambda tx: write(tx, "a", True))
    assert journal.record_transactional(wid, token, 1, lambda tx: write(tx, "b", False)).written
    # Position 1 is final: the work is not run again.
    again = journal.record_transactional(wid, token, 1, lambda tx: write(tx, "c", False))
    assert not again.written
    rows = journal.record_transactional(
        wid, token, 2, lambda tx: ok(2, result=repr(tx.execute(f"SELECT k FROM {table}")).encode())
    )
    assert rows.entry.result == b"[('b',)]"


def test_the_time_a_transactional_step_holds_the_run_is_given_back_to_its_lease(
    journal: JournalBackend, clock: ManualClock
) -> None:
    # No heartbeat can extend the lease while the step holds the workflow's row; a run
    # that was alive throughout must not leave the step with a lapsed lease that another
    # worker claims before its next heartbeat.
    wid, token = started(journal)
    clock.advance(LEASE / 2)

    def long_step(tx: object) -> Entry:
        clock.advance(3 * LEASE)
        return ok(0)

    assert journal.record_transactional(wid, token, 0, long_step).written
    assert journal.claim("w2", lease=LEASE) == []
    assert journal.claim_one(wid, "w2", lease=LEASE) is None
    clock.advance(LEASE / 2 + 0.1)  # the half lease it had left when the step began
    [taken] = journal.claim("w2", lease=LEASE)
    assert taken.id == wid


def test_a_step_that_fails_gives_nothing_back(journal: JournalBackend, clock: ManualClock) -> None:
    wid, token = started(journal)

    def failing(tx: object) -> Entry:
        clock.advance(2 * LEASE)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        journal.record_transactional(wid, token, 0, failing)
    [taken] = journal.claim("w2", lease=LEASE)  # rolled back: the lease lapsed as it would have
    assert taken.id == wid


def test_transactional_record_is_fenced(journal: JournalBackend, clock: ManualClock) -> None:
    wid, token = started(journal)
    clock.advance(LEASE + 1)
    journal.claim("w2", lease=LEASE)
    ran = []
    with pytest.raises(LeaseLostError):
        journal.record_transactional(wid, token, 0, lambda tx: (ran.append(1), ok(0))[1])
    assert ran == []


def test_signals_are_a_fifo_inbox_consumed_once(journal: JournalBackend) -> None:
    wid, token = started(journal)
    journal.signal(wid, "approve", b'"first"')
    journal.signal(wid, "other", b'"x"')
    journal.signal(wid, "approve", b'"second"')
    assert journal.consume_signal(wid, token, 0, "missing") is None
    journal.record(wid, token, waiting(0, kind="signal", name="approve", wake_at=99.0))
    got = journal.consume_signal(wid, token, 0, "approve")
    assert got is not None
    assert got.written
    assert got.entry.result == b'"first"'
    assert got.entry.wake_at == 99.0
    replay = journal.consume_signal(wid, token, 0, "approve")
    assert replay is not None
    assert not replay.written
    assert replay.entry.result == b'"first"'
    second = journal.consume_signal(wid, token, 1, "approve")
    assert second is not None
    assert second.entry.result == b'"second"'
    inbox = journal.signals(wid)
    assert [(s.name, s.consumed_position) for s in inbox] == [("approve", 0), ("other", None), ("approve", 1)]


def test_signal_to_a_finished_or_unknown_workflow_is_refused(journal: JournalBackend) -> None:
    wid, token = started(journal)
    journal.record(wid, token, ok(0))
    journal.finish(wid, token, WorkflowStatus.SUCCEEDED, result=b"1")
    before = journal.load(wid)
    with pytest.raises(WorkflowFinishedError, match="already finished"):
        journal.signal(wid, "late", b"1")
    assert journal.load(wid) == before
    assert journal.signals(wid) == []
    with pytest.raises(NotFoundError):
        journal.signal("nope", "x", b"1")
    with pytest.raises(NotFoundError):
        journal.load("nope")
    assert journal.get("nope") is None


def test_suspend_parks_until_due_or_woken(journal: JournalBackend, clock: ManualClock) -> None:
    wid, token = started(journal)
    now = clock.time()
    journal.suspend(wid, token, wake_at=now + 100, seen_wakeups=0, current_step="sleep")
    state = journal.get(wid)
    assert state is not None
    assert state.status == WorkflowStatus.WAITING
    assert state.owner is None
    assert journal.claim("w", lease=LEASE) == []
    clock.advance(100)
    [claim] = journal.claim("w", lease=LEASE)
    assert claim.status == WorkflowStatus.RUNNING
    # A signal wakes a parked workflow before its timer.
    journal.suspend(wid, claim.token, wake_at=now + 10_000, seen_wakeups=claim.wakeups, current_step="wait")
    journal.signal(wid, "go", b"1")
    [again] = journal.claim("w", lease=LEASE)
    # An event that arrived while the run was deciding to park is not lost.
    journal.signal(wid, "go", b"2")
    journal.suspend(wid, again.token, wake_at=now + 10_000, seen_wakeups=again.wakeups, current_step="wait")
    assert [c.id for c in journal.claim("w", lease=LEASE)] == [wid]


def test_release_makes_it_claimable_at_once(journal: JournalBackend) -> None:
    wid, token = started(journal)
    assert journal.release(wid, token)
    # A heartbeat racing the release must not lease the workflow again
    assert not journal.heartbeat(wid, token, lease=LEASE).alive
    [claim] = journal.claim("w2", lease=LEASE)
    assert claim.id == wid
    assert not journal.release(wid, token)


TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\nrojo=00f067aa0ba902b7"


def test_the_trace_context_travels_with_every_claim_and_a_bad_one_reads_as_none(
    journal: JournalBackend,
) -> None:
    # Given a workflow started in a trace (and run at once), one started without, and a
    # bad context offered at the door
    traced = journal.start(new(trace=TRACE), owner="w1", lease=LEASE)
    assert traced.claim is not None
    assert traced.claim.trace == TRACE
    plain = journal.start(new())
    with pytest.raises(SubmitError, match="trace"):
        journal.start(new(trace="00-zz-01"))
    # When the traced run is handed back and both are claimed
    assert journal.release(traced.state.id, traced.claim.token)
    claims = {c.id: c for c in journal.claim("w2", lease=LEASE, limit=10)}
    # Then every claim carries what was stored, and the untraced one nothing
    assert claims[traced.state.id].trace == TRACE
    assert claims[plain.state.id].trace is None
    # And a value overwritten in the store with junk is ignored, not a malformed row
    rewrite_workflow(journal, plain.state.id, trace="00-" + "0" * 52, owner=None, lease_until=0.0)
    [again] = journal.claim("w3", lease=LEASE)
    assert (again.id, again.trace) == (plain.state.id, None)


def test_cancellation_is_requested_cascades_and_beats_success(journal: JournalBackend) -> None:
    wid, token = started(journal)
    child = journal.start(new("child", parent_id=wid, parent_position=0)).state.id
    assert journal.request_cancel(wid)
    assert journal.heartbeat(wid, token, lease=LEASE).cancel_requested
    child_state = journal.get(child)
    assert child_state is not None
    assert child_state.cancel_requested
    assert journal.record(wid, token, ok(0)).cancel_requested
    assert journal.finish(wid, token, WorkflowStatus.SUCCEEDED, result=b"1") is False
    journal.set_compensating(wid, token)
    assert journal.finish(wid, token, WorkflowStatus.CANCELLED, error=b"{}", compensation="done")
    state = journal.get(wid)
    assert state is not None
    assert state.status == WorkflowStatus.CANCELLED
    assert state.compensation == "done"
    assert journal.request_cancel(wid) is False
    with pytest.raises(NotFoundError):
        journal.request_cancel("nope")


def test_finishing_a_child_resolves_and_wakes_its_parent(journal: JournalBackend) -> None:
    parent, ptoken = started(journal, name="parent")
    child_id = f"{parent}/0"
    journal.record(
        parent, ptoken, waiting(0, kind="child", name="child", wake_at=float("inf"), detail=child_id)
    )
    journal.suspend(parent, ptoken, wake_at=float("inf"), seen_wakeups=0, current_step="child")
    s = journal.start(
        NewWorkflow(child_id, "child", b"{}", parent_id=parent, parent_position=0), owner="w", lease=LEASE
    )
    assert s.claim is not None
    assert journal.finish(child_id, s.claim.token, WorkflowStatus.SUCCEEDED, result=b'"vm-1"')
    _, entries = journal.load(parent)
    assert entries[0].status == "ok"
    assert entries[0].result == b'"vm-1"'
    assert [c.id for c in journal.claim("w", lease=LEASE, names=["parent"])] == [parent]
    assert [w.id for w in journal.workflows(parent_id=parent)] == [child_id]


def test_queries_and_purge(journal: JournalBackend, clock: ManualClock) -> None:
    done, token = started(journal)
    journal.finish(done, token, WorkflowStatus.FAILED, error=b'{"type": "x"}', compensation="done")
    clock.advance(1)
    live, _ = started(journal)
    assert {w.id for w in journal.workflows(status="failed")} == {done}
    assert [w.id for w in journal.workflows(limit=1)] == [live]
    clock.advance(60)
    assert journal.purge(clock.time()) == 1
    assert journal.get(done) is None
    assert journal.get(live) is not None


def test_a_transactional_step_may_not_end_the_transaction_itself(journal: JournalBackend) -> None:
    wid, token = started(journal)
    with pytest.raises(SubmitError, match="never commit"):
        journal.record_transactional(wid, token, 0, lambda tx: (tx.execute("COMMIT"), ok(0))[1])
    _, entries = journal.load(wid)
    assert entries == []


# -- a suspect runs alone; only a run marked alone is charged with its worker's death ---------


def test_a_claim_after_a_lapsed_run_is_a_suspect_and_after_a_hand_back_is_not(
    journal: JournalBackend, clock: ManualClock
) -> None:
    lapsed, _ = started(journal, name="lapsed")
    handed, token = started(journal, name="handed")
    assert journal.release(handed, token)
    clock.advance(LEASE + 1)  # the first one's worker died holding it
    claims = {c.id: c for c in journal.claim("w2", lease=LEASE, limit=5)}
    assert claims[lapsed].suspect
    assert not claims[handed].suspect
    assert claims[lapsed].crashes == 0  # it shared its worker: nobody is charged


def test_a_run_marked_alone_is_charged_and_set_aside_at_max_crashes(
    journal: JournalBackend, clock: ManualClock
) -> None:
    from foundry.backends.journal._records import MAX_CRASHES

    wid, token = started(journal)
    clock.advance(LEASE + 1)
    for crash in range(MAX_CRASHES):
        [claim] = journal.claim("w", lease=LEASE)
        assert claim.suspect
        assert claim.crashes == crash
        assert journal.mark_alone(wid, claim.token)
        clock.advance(LEASE + 1)  # and its worker dies again, while it runs alone
    # Then the claim that finds the last death sets it aside instead of handing it out
    assert journal.claim("w", lease=LEASE) == []
    state = journal.get(wid)
    assert state is not None
    assert state.status == WorkflowStatus.FAILED
    assert b"ran alone in it, 3 times" in (state.error or b"")
    assert not journal.mark_alone(wid, token)  # a stale token marks nothing


def test_a_suspect_handed_back_stays_a_suspect_and_parking_clears_its_crashes(
    journal: JournalBackend, clock: ManualClock
) -> None:
    wid, _ = started(journal)
    clock.advance(LEASE + 1)
    [claim] = journal.claim("w", lease=LEASE)
    assert journal.release(wid, claim.token, suspect=True)  # handed back before it ran
    [claim] = journal.claim("w", lease=LEASE)
    assert claim.suspect
    assert claim.crashes == 0  # not marked alone: not charged
    assert journal.mark_alone(wid, claim.token)
    clock.advance(LEASE + 1)
    [claim] = journal.claim("w", lease=LEASE)
    assert claim.crashes == 1
    journal.suspend(wid, claim.token, wake_at=clock.time(), seen_wakeups=claim.wakeups, current_step="s")
    [claim] = journal.claim("w", lease=LEASE)
    assert not claim.suspect
    assert claim.crashes == 0


def test_a_journal_from_before_the_crash_columns_is_upgraded_on_open(journal_url: str) -> None:
    # Given a journal whose workflows table lacks the columns added later, with a workflow
    first = open_journal(journal_url)
    try:
        wid, _ = started(first)
        with first._tx() as c:  # type: ignore[attr-defined]
            for column in ("alone", "crashes", "deadline", "published", "origin", "trace"):
                c.run(f"ALTER TABLE {{wf}} DROP COLUMN {column}")
    finally:
        first.close()
    # When it is opened again, then it works as before, the old workflow included
    again = open_journal(journal_url)
    try:
        assert again.get(wid) is not None
        assert started(again, name="new")[1] == 1
    finally:
        again.close()


# -- deadlines, published state, forks, async wake-ups (issue 19) ---------------------------


def test_a_deadline_is_stored_and_no_suspension_parks_past_it(
    journal: JournalBackend, clock: ManualClock
) -> None:
    start = clock.time()
    s = journal.start(new(timeout=60.0), owner="w", lease=LEASE)
    assert s.claim is not None
    assert s.state.deadline == s.claim.deadline == start + 60
    wid = s.state.id
    journal.suspend(wid, s.claim.token, wake_at=start + 3600, seen_wakeups=0, current_step="sleep")
    state = journal.get(wid)
    assert state is not None
    assert (state.deadline, state.wake_at) == (start + 60, start + 60)
    assert journal.claim("w", lease=LEASE) == []
    clock.advance(60)
    [claim] = journal.claim("w", lease=LEASE)  # whoever claims it next finds it expired
    assert claim.deadline == start + 60
    assert journal.finish(wid, claim.token, WorkflowStatus.TIMED_OUT, error=b"{}", compensation="done")
    state = journal.get(wid)
    assert state is not None
    assert state.status == WorkflowStatus.TIMED_OUT
    assert state.status.finished
    assert [w.id for w in journal.workflows(status="timed_out")] == [wid]
    with pytest.raises(WorkflowFinishedError):
        journal.signal(wid, "late", b"1")
    # without a timeout there is no deadline and a suspension parks as asked
    other, token = started(journal)
    journal.suspend(other, token, wake_at=start + 3600, seen_wakeups=0, current_step="sleep")
    parked = journal.get(other)
    assert parked is not None
    assert (parked.deadline, parked.wake_at) == (None, start + 3600)


def test_published_state_is_fenced_and_read_without_touching_the_run(
    journal: JournalBackend, clock: ManualClock
) -> None:
    wid, token = started(journal)
    assert journal.get(wid).published is None  # type: ignore[union-attr]
    journal.publish(wid, token, b'{"progress": 1}')
    before = journal.get(wid)
    assert before is not None
    assert before.published == b'{"progress": 1}'
    assert journal.get(wid) == before  # reading it changed nothing
    clock.advance(LEASE + 1)
    journal.claim("w2", lease=LEASE)
    with pytest.raises(LeaseLostError):
        journal.publish(wid, token, b'{"progress": 2}')
    assert journal.get(wid).published == b'{"progress": 1}'  # type: ignore[union-attr]


def test_a_fork_copies_the_entries_before_a_position_into_a_new_pending_workflow(
    journal: JournalBackend,
) -> None:
    wid, token = started(journal)
    for pos in range(4):
        journal.record(wid, token, ok(pos, name=f"s{pos}", result=str(pos).encode()))
    journal.finish(wid, token, WorkflowStatus.FAILED, error=b'{"type": "x"}')
    fork = journal.fork(wid, NewWorkflow(f"{wid}-b", "wf", b"{}", origin=f"reset of {wid}"), upto=2)
    assert fork.created
    assert fork.state.status == WorkflowStatus.PENDING
    state, entries = journal.load(f"{wid}-b")
    assert state.origin == f"reset of {wid}"
    assert [(e.position, e.name, e.result) for e in entries] == [(0, "s0", b"0"), (1, "s1", b"1")]
    assert len(journal.load(wid)[1]) == 4  # the source is left as it was
    [claim] = journal.claim("w", lease=LEASE)
    assert claim.id == f"{wid}-b"
    again = journal.fork(wid, NewWorkflow(f"{wid}-b", "wf", b"{}"), upto=4)
    assert not again.created
    assert len(journal.load(f"{wid}-b")[1]) == 2
    with pytest.raises(NotFoundError):
        journal.fork("nope", NewWorkflow("x-1", "wf", b"{}"), upto=1)
    assert journal.get("x-1") is None


def test_an_async_waiter_is_woken_by_a_commit_of_another_journal(journal_url: str) -> None:
    import asyncio

    waiting = open_journal(journal_url)
    other = open_journal(journal_url)
    try:
        wid = other.start(new(), owner="w", lease=LEASE).state.id

        async def wait() -> list[bool]:
            # a waiter's loop: mark, look, wait; the other journal signals meanwhile
            asyncio.get_running_loop().call_later(0.1, lambda: other.signal(wid, "go", b"1"))
            woken: list[bool] = []
            while True:
                mark = waiting.changes.mark()
                if waiting.signals(wid):
                    return woken
                woken.append(await waiting.changes.wait_async(mark, 5.0))

        assert waiting.changes.cross_process
        woken = asyncio.run(wait())
        assert woken  # it did wait
        assert all(woken)  # and every wait ended by a wake-up, none by its timeout
        # and a wait with nothing to wake it times out, returning False
        assert asyncio.run(waiting.changes.wait_async(waiting.changes.mark(), 0.05)) is False
    finally:
        waiting.close()
        other.close()
