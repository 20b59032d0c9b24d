"""Malformed journal rows written straight into each journal engine (issue 12, item 5 for
workflows): each workflow whose row, entry or signal is not what Foundry wrote is set
aside — it ends ``failed`` with a reason naming the bad field, which its handle raises
and ``foundry workflows show`` prints — and every healthy workflow beside it completes,
on a worker that keeps running. Before, one such row (``wakeups='abc'``) raised
``ValueError`` in the claim and killed the worker's claim thread: the whole batch it had
claimed stayed ``running`` for ever, and nothing was claimed again.

Then Hypothesis feeds the journal's decoders arbitrary rows (each yields a record of the
right types or raises :class:`MalformedRecordError`, nothing else), and the SQLite engine
itself arbitrary values in arbitrary columns.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foundry import Foundry
from foundry.backends.journal import open_journal
from foundry.backends.journal._records import (
    CLAIMS_MAX,
    TOKEN_MAX,
    WAKEUPS_MAX,
    decode_claim,
    decode_entry,
    decode_signal,
    decode_state,
)
from foundry.backends.journal.base import (
    Claim,
    Entry,
    EntryKind,
    EntryStatus,
    NewWorkflow,
    SignalRecord,
    WorkflowState,
    WorkflowStatus,
)
from foundry.cli import main as cli
from foundry.deliver.workflow import Worker
from foundry.errors import MalformedRecordError, SubmitError
from tests.adversarial._fuzz import FUZZ
from tests.adversarial._fuzz import anything as any_value
from tests.adversarial._journals import (
    NotUtf8,
    insert_signal,
    wait_status,
    write_entry,
    write_workflow,
)

NAN = float("nan")
# What each engine's columns can hold: PostgreSQL's are typed (but take any value of their
# type: a word Foundry never writes, a counter at the limit of its integers, NaN); SQLite's
# take anything, text that is not UTF-8 included.
ROWS_TYPED: list[tuple[str, Any]] = [
    ("codec", "evil"),
    ("compensation", "maybe"),
    ("cancel_requested", 7),
    ("claims", 2**31 - 1),  # claims + 1 overflowed PostgreSQL's INTEGER: every claim failed
    ("token", 2**63 - 1),  # token + 1 overflowed its BIGINT
    ("wakeups", 2**62),
    ("parent_pos", -5),
    ("created_at", NAN),
]
ROWS_UNTYPED: list[tuple[str, Any]] = [
    *ROWS_TYPED[:6],
    ("wakeups", "abc"),
    ("token", "x"),
    ("claims", 1.5),
    ("args", 12),
    ("parent_pos", "first"),
    ("created_at", "yesterday"),
    ("codec", NotUtf8()),
    ("parent_id", NotUtf8()),
]
ENTRIES_TYPED: list[tuple[str, Any]] = [
    ("kind", "bogus"),
    ("status", "maybe"),
    ("attempts", -1),
    ("started_at", NAN),
    ("ref", -3),
]
ENTRIES_UNTYPED: list[tuple[str, Any]] = [
    *ENTRIES_TYPED[:2],
    ("attempts", "x"),
    ("result", 5),
    ("started_at", "noon"),
    ("name", NotUtf8()),
    ("ref", "r"),
]


def journal_of(app: Foundry) -> Any:
    return app.workflows["doubling"].runtime.journal  # type: ignore[attr-defined]


def sqlite(url: str) -> bool:
    return url.startswith("sqlite")


@contextlib.contextmanager
def worker_of(app: Foundry) -> Iterator[Worker]:
    worker = Worker(app, poll=0.05, lease=10.0, concurrency=4).start()
    try:
        yield worker
        # Then the worker is still alive and claiming: nothing it met stopped it
        assert worker.failure is None, worker.failure
        assert worker._thread is not None
        assert worker._thread.is_alive()
    finally:
        worker.stop(5)


def assert_set_aside(app: Foundry, workflow_id: str, field: str) -> None:
    """The workflow ended failed, its reason naming ``field``, in its record, its handle
    and ``foundry workflows show``."""
    journal = journal_of(app)
    wait_status(journal, workflow_id, WorkflowStatus.FAILED, WorkflowStatus.SUCCEEDED)
    state = journal.get(workflow_id)
    assert state.status is WorkflowStatus.FAILED, (field, state)
    record = json.loads(state.error)
    assert "malformed" in record["message"], record
    assert f"{field}=" in record["message"], record
    with pytest.raises(MalformedRecordError) as info:
        app.workflow_handle(workflow_id).result(timeout=5)
    assert info.value.field == field


def show(url: str, workflow_id: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli(["workflows", "show", workflow_id, "--journal", url])
    return code, out.getvalue(), err.getvalue()


def test_malformed_workflow_rows_are_set_aside_and_the_workflows_beside_them_complete(
    workflow_app: Foundry, journal_url: str
) -> None:
    app = workflow_app
    # Given healthy workflows, and workflows whose row was then altered in the store
    journal = journal_of(app)
    doubling = app.workflows["doubling"]
    cases = ROWS_UNTYPED if sqlite(journal_url) else ROWS_TYPED
    healthy, bad = [], {}
    for i, (field, value) in enumerate(cases):
        healthy.append(doubling.enqueue(i))
        victim = doubling.enqueue(1000 + i)
        write_workflow(journal, victim.id, **{field: value})
        bad[victim.id] = field
    healthy += [doubling.enqueue(i) for i in range(len(cases), len(cases) + 5)]
    # When a worker runs the journal
    with worker_of(app):
        # Then every healthy workflow completes ...
        assert [h.result(timeout=30) for h in healthy] == [2 * i for i in range(len(healthy))]
        # ... and every altered one is set aside, its reason naming the bad field
        for workflow_id, field in bad.items():
            assert_set_aside(app, workflow_id, field)
    # ... which the CLI shows, in the list and in full
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(["workflows", "list", "--journal", journal_url, "--json", "--limit", "1000"]) == 0
    listed = {w["id"]: w for w in json.loads(out.getvalue())}
    assert len(listed) == len(healthy) + len(bad)
    for workflow_id, field in bad.items():
        assert listed[workflow_id]["status"] == "failed"
        assert f"{field}=" in listed[workflow_id]["error"]["message"]
    victim = next(iter(bad))
    code, text, err = show(journal_url, victim)
    assert code == 0, err
    assert "malformed" in text
    assert f"{bad[victim]}=" in text


def test_malformed_entries_and_signals_set_aside_only_their_run(
    workflow_app: Foundry, journal_url: str
) -> None:
    app = workflow_app
    # Given workflows parked on a signal after one step, some of whose entries (or inbox) are
    # then altered in the store
    journal = journal_of(app)
    parked = app.workflows["parked"]
    cases = ENTRIES_UNTYPED if sqlite(journal_url) else ENTRIES_TYPED
    healthy = [parked.enqueue(i) for i in range(4)]
    victims = {parked.enqueue(100 + i).id: field for i, (field, _) in enumerate(cases)}
    foreign_signal = parked.enqueue(200).id if sqlite(journal_url) else None
    with worker_of(app):
        for h in [*healthy, *[app.workflow_handle(v) for v in victims]]:
            wait_status(journal, h.id, WorkflowStatus.WAITING)
        for (workflow_id, field), (_, value) in zip(victims.items(), cases, strict=True):
            write_entry(journal, workflow_id, 0, **{field: value})
        if foreign_signal is not None:
            wait_status(journal, foreign_signal, WorkflowStatus.WAITING)
            insert_signal(journal, foreign_signal, "go", 42)  # a number, not the payload's bytes
            victims[foreign_signal] = "payload"
        # When each is woken and resumes, replaying its journal
        for workflow_id in [*(h.id for h in healthy), *victims]:
            app.signal(workflow_id, "go")
        # Then the healthy ones complete and each altered one is set aside, naming the field
        assert [h.result(timeout=30) for h in healthy] == [0, 2, 4, 6]
        for workflow_id, field in victims.items():
            assert_set_aside(app, workflow_id, field)


@pytest.mark.parametrize("journal_url", ["sqlite"], indirect=True)  # PostgreSQL's TEXT is UTF-8
def test_a_row_whose_id_is_not_utf8_is_set_aside_and_claiming_goes_on(workflow_app: Foundry) -> None:
    # Given a SQLite journal with a copy of a pending row whose id is bytes that are not UTF-8
    app = workflow_app
    journal = journal_of(app)
    doubling = app.workflows["doubling"]
    template = doubling.enqueue(0)
    raw_id = b"doubling-\xff\xfe"
    with journal._tx() as c:
        columns = [r[1] for r in c.all("PRAGMA table_info({wf})")]
        rest = ", ".join(columns[1:])
        c.run(
            f"INSERT INTO {{wf}} (id, {rest}) SELECT CAST(? AS TEXT), {rest} FROM {{wf}} WHERE id = ?",
            (raw_id, template.id),
        )
    healthy = [template, *(doubling.enqueue(i) for i in range(1, 6))]
    # When a worker runs the journal (before: sqlite3's "Could not decode to UTF-8" failed
    # every claim)
    with worker_of(app):
        # Then the healthy workflows complete, and the foreign row ends failed
        assert [h.result(timeout=30) for h in healthy] == [0, 2, 4, 6, 8, 10]
        with journal._auto() as c:
            [(status,)] = c.all("SELECT status FROM {wf} WHERE CAST(id AS BLOB) = ?", (raw_id,))
        assert status == "failed"
    # ... and the listing still lists the others
    assert {s.id for s in journal.workflows()} >= {h.id for h in healthy}


def test_a_row_no_worker_can_claim_is_left_out_of_listings_and_named_by_every_reader(
    workflow_app: Foundry, journal_url: str
) -> None:
    app = workflow_app
    # Given a workflow whose status is a word Foundry never writes, beside healthy ones
    journal = journal_of(app)
    doubling = app.workflows["doubling"]
    odd = doubling.enqueue(1)
    write_workflow(journal, odd.id, status="paused")
    healthy = [doubling.enqueue(i) for i in range(3)]
    with worker_of(app):
        assert [h.result(timeout=30) for h in healthy] == [0, 2, 4]
    # Then a listing leaves it out (it lists the others), and every reader of that one
    # workflow gets the one error naming the field
    assert {s.id for s in journal.workflows()} == {h.id for h in healthy}
    for read in (
        lambda: journal.get(odd.id),
        lambda: journal.load(odd.id),
        lambda: journal.signal(odd.id, "go", b"null"),
        lambda: journal.request_cancel(odd.id),
        lambda: odd.status,
    ):
        with pytest.raises(MalformedRecordError, match="status='paused'"):
            read()
    code, _, err = show(journal_url, odd.id)
    assert code == 1
    assert "status='paused'" in err
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(["workflows", "list", "--journal", journal_url]) == 0
    assert odd.id not in out.getvalue()


def test_a_workflow_the_runtime_fails_on_every_time_is_charged_alone(workflow_app: Foundry) -> None:
    app = workflow_app
    # Given a workflow whose exception cannot even be printed (Foundry's own code raises
    # writing its error record, every time it runs), beside healthy workflows
    poison = app.workflows["unprintable"].enqueue()
    healthy = [app.workflows["doubling"].enqueue(i) for i in range(6)]
    # When a worker runs them
    with worker_of(app):
        # Then the healthy ones complete, and that one ends failed, saying why (before, its
        # run was abandoned: another worker met the same error after every lease, and the
        # workflow stayed running for ever)
        assert [h.result(timeout=30) for h in healthy] == [0, 2, 4, 6, 8, 10]
        with pytest.raises(Exception, match="the runtime failed while running it") as info:
            poison.result(timeout=30)
        assert "RuntimeError: this exception cannot be printed" in str(info.value)


def test_start_refuses_what_the_decoder_would_not_read_back(workflow_app: Foundry) -> None:
    journal = journal_of(workflow_app)
    for wf, field in (
        (NewWorkflow("", "doubling", b"{}"), "id"),
        (NewWorkflow("a\nb", "doubling", b"{}"), "id"),
        (NewWorkflow("x" * 1025, "doubling", b"{}"), "id"),
        (NewWorkflow("ok", "", b"{}"), "name"),
        (NewWorkflow("ok", "doubling", b"{}", codec="yaml"), "codec"),
        (NewWorkflow("ok", "doubling", b"{}", parent_id="p", parent_position=-1), "parent_position"),
    ):
        with pytest.raises(SubmitError, match=f"{field}="):
            journal.start(wf)
    assert journal.workflows() == []


# -- the decoders, fuzzed ------------------------------------------------------------------

anything = st.one_of(
    any_value("json", "pickle", "running", "failed", "step", "ok"),
    st.just("\udcff"),  # how the SQLite engine reads TEXT that is not UTF-8
)
plausible_int = st.one_of(
    st.integers(min_value=-3, max_value=10), st.sampled_from([b"3", "7", 2.0]), anything
)
plausible_name = st.one_of(st.sampled_from(["wf-1", "doubling", "a/3"]), anything)
plausible_text = st.one_of(st.sampled_from(["", "step double", "signal #1"]), anything)
plausible_number = st.one_of(
    st.floats(min_value=0, max_value=2e9), st.sampled_from([math.inf, "12.5", 1]), anything
)
plausible_blob = st.one_of(st.binary(max_size=20), anything)
status = st.one_of(st.sampled_from([s.value for s in WorkflowStatus]), anything)
codec = st.one_of(st.sampled_from(["json", "pickle"]), anything)
flag = st.one_of(st.sampled_from([0, 1]), anything)
compensation = st.one_of(st.sampled_from(["", "running", "done", "partial"]), anything)
kind = st.one_of(st.sampled_from([k.value for k in EntryKind]), anything)
entry_status = st.one_of(st.sampled_from([s.value for s in EntryStatus]), anything)


def maybe(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), values)


def finite(x: float) -> bool:
    return isinstance(x, float) and math.isfinite(x)


def check_state(s: WorkflowState) -> None:
    assert isinstance(s.status, WorkflowStatus)
    for name in (s.id, s.name):
        assert isinstance(name, str)
        assert name
        name.encode()
    assert s.codec in ("json", "pickle")
    assert isinstance(s.args, bytes)
    assert s.result is None or isinstance(s.result, bytes)
    assert s.error is None or isinstance(s.error, bytes)
    assert s.parent_id is None or isinstance(s.parent_id, str)
    assert s.parent_position is None or (type(s.parent_position) is int and s.parent_position >= 0)
    assert type(s.token) is int
    assert 0 <= s.token < TOKEN_MAX
    assert type(s.claims) is int
    assert 0 <= s.claims < CLAIMS_MAX
    assert type(s.wakeups) is int
    assert 0 <= s.wakeups < WAKEUPS_MAX
    assert type(s.position) is int
    assert s.position >= 0
    assert isinstance(s.cancel_requested, bool)
    assert s.compensation in ("", "running", "done", "partial")
    assert s.owner is None or isinstance(s.owner, str)
    assert s.current_step is None or isinstance(s.current_step, str)
    assert finite(s.lease_until)
    assert finite(s.created_at)
    assert finite(s.updated_at)
    assert finite(s.wake_at) or s.wake_at == math.inf
    assert s.step_started_at is None or finite(s.step_started_at)
    assert s.finished_at is None or finite(s.finished_at)


def check_claim(c: Claim) -> None:
    assert isinstance(c.id, str)
    assert c.id
    assert isinstance(c.name, str)
    assert c.name
    assert type(c.token) is int
    assert 1 <= c.token < TOKEN_MAX
    assert isinstance(c.status, WorkflowStatus)
    assert isinstance(c.args, bytes)
    assert c.codec in ("json", "pickle")
    assert c.parent_position is None or (type(c.parent_position) is int and c.parent_position >= 0)
    assert isinstance(c.cancel_requested, bool)
    assert type(c.wakeups) is int
    assert 0 <= c.wakeups < WAKEUPS_MAX
    assert type(c.claims) is int
    assert 1 <= c.claims < CLAIMS_MAX
    assert isinstance(c.suspect, bool)
    assert type(c.crashes) is int
    assert 0 <= c.crashes <= CLAIMS_MAX
    assert finite(c.lease_until)


def check_entry(e: Entry) -> None:
    assert type(e.position) is int
    assert e.position >= 0
    assert e.kind in {k.value for k in EntryKind}
    assert e.status in {s.value for s in EntryStatus}
    assert isinstance(e.name, str)
    assert e.result is None or isinstance(e.result, bytes)
    assert e.error is None or isinstance(e.error, bytes)
    assert type(e.attempts) is int
    assert e.attempts >= 0
    assert finite(e.started_at)
    assert e.finished_at is None or finite(e.finished_at)
    assert e.wake_at is None or finite(e.wake_at) or e.wake_at == math.inf
    assert e.ref is None or (type(e.ref) is int and e.ref >= 0)
    assert e.detail is None or isinstance(e.detail, str)


def check_signal(s: SignalRecord) -> None:
    assert type(s.seq) is int
    assert s.seq >= 1
    assert isinstance(s.workflow_id, str)
    assert isinstance(s.name, str)
    assert isinstance(s.payload, bytes)
    assert finite(s.sent_at)
    assert s.consumed_position is None or (type(s.consumed_position) is int and s.consumed_position >= 0)


# One strategy per column, in the order each decoder reads them.
STATE_ROW = st.tuples(
    plausible_name, plausible_name, status, codec, maybe(plausible_blob), maybe(anything), maybe(anything),
    maybe(plausible_name), maybe(plausible_int), maybe(plausible_text), plausible_int, plausible_number,
    plausible_number, flag, compensation, plausible_int, plausible_int, maybe(plausible_text),
    maybe(plausible_number), plausible_int, plausible_number, plausible_number, maybe(plausible_number),
)  # fmt: skip
CLAIM_ROW = st.tuples(
    plausible_name, plausible_name, plausible_int, plausible_number, status, maybe(plausible_blob), codec,
    maybe(plausible_name), maybe(plausible_int), flag, plausible_int, plausible_int, plausible_int,
    plausible_int,
)  # fmt: skip
ENTRY_ROW = st.tuples(
    plausible_int, kind, plausible_text, entry_status, maybe(anything), maybe(anything), plausible_int,
    plausible_number, maybe(plausible_number), maybe(plausible_number), maybe(plausible_int),
    maybe(plausible_text),
)  # fmt: skip
SIGNAL_ROW = st.tuples(
    plausible_int, plausible_name, plausible_text, plausible_blob, plausible_number, maybe(plausible_int)
)
DECODERS: list[tuple[Callable[[Any], Any], st.SearchStrategy[Any], Callable[[Any], None]]] = [
    (decode_state, STATE_ROW, check_state),
    (decode_claim, CLAIM_ROW, check_claim),
    (lambda row: decode_entry("wf-1", row), ENTRY_ROW, check_entry),
    (decode_signal, SIGNAL_ROW, check_signal),
]


@pytest.mark.parametrize(("decode", "rows", "check"), DECODERS, ids=["state", "claim", "entry", "signal"])
@FUZZ
@given(data=st.data())
def test_journal_rows_decode_to_a_record_or_the_malformed_error(
    decode: Callable[[Any], Any],
    rows: st.SearchStrategy[Any],
    check: Callable[[Any], None],
    data: st.DataObject,
) -> None:
    try:
        record = decode(data.draw(rows))
    except MalformedRecordError:
        return
    check(record)


@FUZZ
@given(st.lists(anything, max_size=30))
def test_rows_of_any_length_decode_or_raise_the_malformed_error(row: list[Any]) -> None:
    for decode in (decode_state, decode_claim, decode_signal, lambda r: decode_entry("wf-1", r)):
        try:
            decode(row)
        except MalformedRecordError:
            pass


def test_foundrys_own_rows_decode(journal_url: str) -> None:
    """The fuzzers' counterpart: what the engine writes always decodes, and a value at a
    limit the engines stop at is refused."""
    journal = open_journal(journal_url)
    try:
        started = journal.start(NewWorkflow("wf-1", "w", b'{"args": [], "kwargs": {}}'), owner="me")
        assert started.claim is not None
        journal.record("wf-1", 1, Entry(0, "sleep", "sleep", "waiting", started_at=1.0, wake_at=math.inf))
        journal.signal("wf-1", "go", b"1")
        state, entries = journal.load("wf-1")
        check_state(state)
        assert [e.wake_at for e in entries] == [math.inf]
        [signal] = journal.signals("wf-1")
        check_signal(signal)
        assert state.wakeups == 1
    finally:
        journal.close()
    row = ("wf", "w", 2**62, 1.0, "running", b"", "json", None, None, 0, 0, 1, 0, 0, None, None)
    with pytest.raises(MalformedRecordError, match="token=4611686018427387904"):
        decode_claim(row)


# -- the SQLite engine itself, fuzzed: any value in any column of a stored workflow ----------

STORED = [
    "status", "codec", "args", "parent_id", "parent_pos", "owner", "token", "lease_until", "wake_at",
    "cancel_requested", "compensation", "claims", "current_step", "wakeups", "created_at", "finished_at",
    "deadline", "published", "origin",
]  # fmt: skip
stored_value = st.one_of(
    st.sampled_from(["pending", "running", "failed", "json", "pickle", "", "0", "-1", "1e400", "nan"]),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=True),
    st.text(max_size=12),
    st.binary(max_size=12),
    st.builds(NotUtf8, st.binary(min_size=1, max_size=6).map(lambda b: b"\xff" + b)),
)


def test_any_value_in_any_column_is_run_or_set_aside_never_a_crash(tmp_path: Path) -> None:
    journal = open_journal(f"sqlite:///{tmp_path / 'fuzz.db'}")

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.dictionaries(st.sampled_from(STORED), stored_value, min_size=1, max_size=3))
    def altered(columns: dict[str, Any]) -> None:
        # Given a pending workflow whose row is then altered, column by column
        workflow_id = f"wf-{uuid.uuid4().hex[:8]}"
        journal.start(NewWorkflow(workflow_id, "w", b"{}"))
        for name, value in columns.items():
            write_workflow(journal, workflow_id, **{name: value})
        # Then every engine call still answers: a claim hands out valid claims or none ...
        for claim in journal.claim("w1", lease=30, limit=5, names=["w"]):
            check_claim(claim)
            journal.finish(claim.id, claim.token, WorkflowStatus.SUCCEEDED, result=b"1")
        # ... a listing lists what it can read ...
        for state in journal.workflows(limit=1000):
            check_state(state)
        # ... and the row reads back as a workflow or as the one malformed-record error
        try:
            check_state(journal.load(workflow_id)[0])
        except MalformedRecordError:
            pass

    try:
        altered()
    finally:
        journal.close()
