"""Hostile codec and error records: nothing read back from a store runs code.

Someone who can write to the store (anyone with the broker's or database's
credentials) rewrites records straight in the engine — a job's codec to ``pickle`` with
a payload whose ``__reduce__`` creates a marker file, an error record that names a
module whose import creates it, or a type whose constructor does — and then the normal
readers run: the submitter's ``handle.result()``, ``app.job(id)``, a worker, a workflow
replay, a stream consumer. On every engine a record is involved in (queue: SQLite,
PostgreSQL, Redis, RabbitMQ; journal: SQLite, PostgreSQL; stream: SQLite, Redis, NATS)
each must end in a clear error or a dead letter with the reason, the other work done,
and the marker file absent. Hypothesis then fuzzes ``decode_error`` and the codec
decode paths with arbitrary records.
"""

from __future__ import annotations

import json
import pickle
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foundry import Foundry
from foundry.backends.journal.base import WorkflowStatus
from foundry.backends.queue import JobState, JobStatus, open_queue_backend
from foundry.backends.stream import NewEvent
from foundry.cli import main as cli
from foundry.deliver.queue import outcome_of
from foundry.deliver.worker import Worker
from foundry.errors import (
    ChildCrashedError,
    DeadLetteredError,
    DeclarationError,
    FoundryError,
    LabInputError,
    RecordError,
    RemoteError,
)
from foundry.serialize import ErrorTypes, decode_call, decode_error, encode_error
from tests.adversarial import _units
from tests.adversarial._hostile import hostile_pickle, rewrite_entry, rewrite_job, rewrite_workflow
from tests.adversarial._other import OtherError, SideEffectError
from tests.backends.queue.engines import ENGINES, close, engine_url
from tests.services import require

EVIL_MODULE = "tests.adversarial._evil"


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The file whose appearance proves code ran from a record (never there at the end)."""
    path = tmp_path / "MARKER"
    monkeypatch.setenv("FOUNDRY_TEST_MARKER", str(path))
    yield path
    sys.modules.pop(EVIL_MODULE, None)  # a failing (pre-fix) run imported it: forget it


class Store:
    """An app on a private queue of one engine, its workers, and an attacker's raw
    connection to the same store."""

    def __init__(self, engine: str, tmp_path: Path) -> None:
        self.url = engine_url(engine, tmp_path)
        self.home = tmp_path / "home"
        self.app = _units.declare(Foundry(f"adv-{uuid.uuid4().hex[:6]}", queue=self.url, home=self.home))
        self.raw = open_queue_backend(self.url, home=self.home)

    def unit(self, name: str) -> Any:
        return self.app.units[name]

    def run(self, *job_ids: str, timeout: float = 30.0) -> None:
        """A worker runs until every job in ``job_ids`` finished (in the store)."""
        worker = Worker(self.app, concurrency=2, lease=5.0, poll=0.1).start()
        try:
            deadline = time.monotonic() + timeout
            for job_id in job_ids:
                while True:
                    state = self.raw.get(job_id)
                    if state is not None and state.status.value in ("succeeded", "failed", "dead"):
                        break
                    assert time.monotonic() < deadline, f"job {job_id} did not finish: {state}"
                    time.sleep(0.02)
        finally:
            worker.stop(2.0)

    def close(self) -> None:
        self.app.close()
        close(self.raw, self.url)


@pytest.fixture(params=ENGINES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = Store(str(request.param), tmp_path)
    try:
        yield s
    finally:
        s.close()


# -- the result: the submitter's declared codec, never the stored one ----------------------


def test_a_result_rewritten_to_pickle_runs_nothing_in_the_submitter(
    store: Store, marker: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FOUNDRY_HOME", str(store.home))  # the CLI finds RabbitMQ's state store
    # Given a job that succeeded, whose record an attacker rewrote to codec=pickle
    handle = store.unit("add").submit(2, 3)
    store.run(handle.id)
    rewrite_job(store.raw, handle.id, codec="pickle", result=hostile_pickle(marker))
    # When the submitter, another process's app.job() and the CLI read it
    with pytest.raises(RecordError) as info:
        handle.result(timeout=10)
    with pytest.raises(RecordError):
        store.app.job(handle.id).result(timeout=10)
    assert cli(["jobs", "show", handle.id, "--url", store.url]) == 0
    # Then nothing was unpickled, and the error names the unit and both codecs
    assert not marker.exists(), "a pickle from the store was loaded"
    message = str(info.value)
    for part in ("'add'", "'pickle'", "codec='json'"):
        assert part in message, message
    assert "<pickle," in capsys.readouterr().out


def test_a_result_in_an_unknown_codec_or_not_json_is_a_clear_error(store: Store, marker: Path) -> None:
    first = store.unit("add").submit(1, 1)
    second = store.unit("add").submit(2, 2)
    store.run(first.id, second.id)
    rewrite_job(store.raw, first.id, codec="x" * 300)
    rewrite_job(store.raw, second.id, result=hostile_pickle(marker))  # codec still json
    # (a codec name Foundry does not know is refused by the typed record decoder, before
    # the codec is compared with the unit's: a MalformedRecordError, which is a RecordError)
    with pytest.raises(RecordError, match=r"codec='xxxx.*longer than 16 characters.*Fix:"):
        first.result(timeout=10)
    with pytest.raises(RecordError, match=r"not valid json"):
        second.result(timeout=10)
    assert not marker.exists()


def test_a_result_read_for_a_unit_this_app_does_not_declare_is_json_only(store: Store, marker: Path) -> None:
    handle = store.unit("add").submit(4, 4)
    store.run(handle.id)
    rewrite_job(
        store.raw, handle.id, unit="nobody_declares_this", codec="pickle", result=hostile_pickle(marker)
    )
    with pytest.raises(RecordError, match=r"not declared in this process|declares codec='json'"):
        store.app.job(handle.id).result(timeout=10)
    with pytest.raises(RecordError, match=r"now names unit 'nobody_declares_this'"):
        handle.result(timeout=10)  # the submitter's handle knows whose job it is
    assert not marker.exists()


# -- the arguments: the worker's declared codec, a mismatch is a dead letter ---------------


def test_arguments_rewritten_to_pickle_are_dead_lettered_and_never_loaded(store: Store, marker: Path) -> None:
    bad = store.unit("add").submit(1, 1)
    good = store.unit("add").submit(2, 2)
    rewrite_job(store.raw, bad.id, codec="pickle", payload=hostile_pickle(marker))
    store.run(bad.id, good.id)
    state = store.raw.get(bad.id)
    assert state is not None
    assert state.status is JobStatus.DEAD
    for part in ("'pickle'", "codec='json'", "'add'"):
        assert part in (state.dead_reason or ""), state.dead_reason
    with pytest.raises(DeadLetteredError):
        bad.result(timeout=10)
    assert good.result(timeout=10) == 4
    assert not marker.exists()


def test_a_pickle_unit_refuses_a_record_that_names_another_codec(store: Store) -> None:
    # The declared codec decides both ways: a pickle unit does not run a JSON record either.
    kept = store.unit("pickled_echo").submit({1, 2})
    forged = store.unit("pickled_echo").submit({3})
    rewrite_job(store.raw, forged.id, codec="json", payload=b'{"args": [1], "kwargs": {}}')
    store.run(kept.id, forged.id)
    assert kept.result(timeout=10) == {1, 2}  # pickle, declared by the unit: still works
    state = store.raw.get(forged.id)
    assert state is not None
    assert state.status is JobStatus.DEAD, state
    assert "codec 'json' refused" in (state.dead_reason or "")
    assert "codec='pickle'" in (state.dead_reason or "")


# -- error records: allow-listed types only, nothing imported ------------------------------


def _rewrite_error(store: Store, job_id: str, record: dict[str, Any]) -> BaseException:
    rewrite_job(store.raw, job_id, error=json.dumps(record).encode())
    with pytest.raises(BaseException) as info:  # a fresh handle: nothing cached
        store.app.job(job_id).result(timeout=10)
    return info.value


def test_error_records_never_import_or_construct_what_they_name(store: Store, marker: Path) -> None:
    handle = store.unit("value_error").submit("boom")
    store.run(handle.id)
    with pytest.raises(ValueError, match="boom"):
        handle.result(timeout=10)  # the real record: a builtin type, rebuilt
    # A module nobody imported: RemoteError, and the module stays unimported.
    error = _rewrite_error(store, handle.id, {"type": f"{EVIL_MODULE}.Evil", "message": "x", "args": []})
    assert isinstance(error, RemoteError)
    assert error.type_name == f"{EVIL_MODULE}.Evil"
    assert EVIL_MODULE not in sys.modules
    # A type of an imported module no rule admits: its constructor never runs.
    path = "tests.adversarial._other.SideEffectError"
    error = _rewrite_error(store, handle.id, {"type": path, "message": "x", "args": ["x"]})
    assert isinstance(error, RemoteError)
    assert error.type_name == path
    # Not exceptions at all, and exceptions that would stop the reader.
    for path, args in [("os.system", [f"touch {marker}"]), ("builtins.SystemExit", [3])]:
        error = _rewrite_error(store, handle.id, {"type": path, "message": "m", "args": args})
        assert isinstance(error, RemoteError), (path, error)
    assert not marker.exists(), marker.read_text()


def test_allowed_error_types_come_back_with_their_fields(store: Store) -> None:
    quota = store.unit("over_quota").submit("acme")
    crashed = store.unit("crashed").submit("transcode")
    other = store.unit("other").submit("upstream said no")
    declared = store.unit("other_declared").submit("upstream said no")
    store.run(quota.id, crashed.id, other.id, declared.id)
    # The unit's own module: its type, with the constructor's fields and a later attribute.
    with pytest.raises(_units.QuotaError) as q:
        quota.result(timeout=10)
    assert (q.value.account, q.value.limit, q.value.retry_after) == ("acme", 10, 30)  # type: ignore[attr-defined]
    # Foundry's own errors keep their structured fields.
    with pytest.raises(ChildCrashedError) as c:
        crashed.result(timeout=10)
    assert (c.value.unit, c.value.exitcode, c.value.signal_name) == ("transcode", -11, "SIGSEGV")
    # Another module's type: RemoteError, unless the unit (errors=) or the app registers it.
    with pytest.raises(RemoteError) as r:
        other.result(timeout=10)
    assert r.value.type_name == "tests.adversarial._other.OtherError"
    assert "upstream said no" in str(r.value)
    assert "Traceback" in r.value.traceback_text
    with pytest.raises(OtherError):
        declared.result(timeout=10)
    store.app.errors.register(OtherError)
    with pytest.raises(OtherError, match="upstream said no"):
        store.app.job(other.id).result(timeout=10)


# -- workflows: the journal's records ------------------------------------------------------


def double(x: int) -> int:
    return x * 2


def refuse() -> None:
    raise OtherError("the step's library raised its own error type")


def fail_value() -> None:
    raise ValueError("no")


@pytest.fixture
def journal_app(journal_url: str, tmp_path: Path) -> Iterator[Foundry]:
    app = Foundry(f"wadv-{uuid.uuid4().hex[:6]}", journal=journal_url, home=tmp_path / "home")

    @app.workflow()
    def doubling(wf: Any, x: int) -> int:
        return int(wf.step(double, x))

    @app.workflow()
    def catching(wf: Any) -> str:
        try:
            wf.step(fail_value)
        except ValueError:
            pass
        wf.wait_for("go", timeout=600)
        return "done"

    @app.workflow()
    def portable(wf: Any) -> str:
        try:
            wf.step(refuse)
        except RemoteError as exc:  # not admitted: the first run sees what a replay will
            seen = exc.type_name
        wf.wait_for("go", timeout=600)
        return seen

    try:
        yield app
    finally:
        app.close()


def _journal(app: Foundry) -> Any:
    return app.workflows["doubling"].runtime.journal


def _wait_status(app: Foundry, workflow_id: str, *statuses: WorkflowStatus, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        state = _journal(app).get(workflow_id)
        if state is not None and state.status in statuses:
            return
        assert time.monotonic() < deadline, f"{workflow_id}: {state}"
        time.sleep(0.02)


def test_workflow_arguments_rewritten_to_pickle_fail_the_run_and_load_nothing(
    journal_app: Foundry, marker: Path
) -> None:
    from foundry.deliver.workflow import Worker as WorkflowWorker

    unit = journal_app.workflows["doubling"]
    handle = unit.enqueue(21)
    good = unit.enqueue(2)
    rewrite_workflow(_journal(journal_app), handle.id, codec="pickle", args=hostile_pickle(marker))
    worker = WorkflowWorker(journal_app, poll=0.05)
    try:
        worker.drain()
    finally:
        worker.stop(5)
    with pytest.raises(RecordError) as info:
        handle.result(timeout=10)
    assert "'pickle'" in str(info.value)
    assert "codec='json'" in str(info.value)
    assert good.result(timeout=10) == 4
    assert not marker.exists()


def test_a_workflow_result_rewritten_to_pickle_is_refused(journal_app: Foundry, marker: Path) -> None:
    workflow_id = f"doubling-{uuid.uuid4().hex[:8]}"
    assert journal_app.workflows["doubling"].run(5, id=workflow_id) == 10
    rewrite_workflow(_journal(journal_app), workflow_id, codec="pickle", result=hostile_pickle(marker))
    with pytest.raises(RecordError, match=r"'pickle'"):
        journal_app.workflow_handle(workflow_id).result(timeout=10)
    rewrite_workflow(_journal(journal_app), workflow_id, codec="json")
    with pytest.raises(RecordError, match=r"not valid JSON"):
        journal_app.workflow_handle(workflow_id).result(timeout=10)
    assert not marker.exists()


def test_a_replayed_step_error_naming_a_module_imports_nothing(journal_app: Foundry, marker: Path) -> None:
    # Given a run that caught its step's ValueError and waits for a signal (parked)
    handle = journal_app.workflows["catching"].start()
    _wait_status(journal_app, handle.id, WorkflowStatus.WAITING)
    # When the step's error record is rewritten to name a module, and the run replays
    record = {"type": f"{EVIL_MODULE}.Evil", "message": "m", "args": [], "traceback": ""}
    rewrite_entry(_journal(journal_app), handle.id, 0, error=json.dumps(record).encode())
    journal_app.signal(handle.id, "go")
    # Then the replay raises RemoteError there (the workflow no longer catches it): no import
    with pytest.raises(RemoteError) as info:
        handle.result(timeout=30)
    assert info.value.type_name == f"{EVIL_MODULE}.Evil"
    assert EVIL_MODULE not in sys.modules
    assert not marker.exists()


def test_a_step_error_of_an_unlisted_type_is_the_same_on_the_first_run_and_on_replay(
    journal_app: Foundry,
) -> None:
    handle = journal_app.workflows["portable"].start()
    _wait_status(journal_app, handle.id, WorkflowStatus.WAITING)
    journal_app.signal(handle.id, "go")  # resumes: replays the step's recorded error
    assert handle.result(timeout=30) == "tests.adversarial._other.OtherError"


# -- streams: the stream's declared codec --------------------------------------------------


@pytest.mark.parametrize("engine", ["sqlite", "redis", "nats"])
def test_a_pickle_event_in_a_json_stream_is_dead_lettered_not_loaded(
    engine: str, tmp_path: Path, marker: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'stream.db'}" if engine == "sqlite" else require(engine)
    app = Foundry(f"sadv-{uuid.uuid4().hex[:6]}", stream=url, home=tmp_path / "home")
    stream = app.stream(f"adv-{uuid.uuid4().hex[:10]}")
    seen: list[Any] = []

    @stream.consumer(group="g", max_deliveries=2)
    def handle(event: Any) -> None:
        seen.append(event.data)

    try:
        stream.publish({"n": 1})
        stream.runtime.backend.append(stream.name, [NewEvent("forged", hostile_pickle(marker))])
        stream.publish({"n": 2})
        stream.drain(["g"], timeout=30)
        assert seen == [{"n": 1}, {"n": 2}]
        letters = stream.dead_letters("g")
        assert [d.id for d in letters] == ["forged"], letters
        assert "not valid json" in letters[0].reason
        assert not marker.exists()
    finally:
        stream.runtime.backend.delete_stream(stream.name)
        app.close()


# -- the allow-list itself -----------------------------------------------------------------


def test_registration_takes_exception_classes_only() -> None:
    errors = ErrorTypes()
    assert errors.register(OtherError) is OtherError
    with pytest.raises(DeclarationError, match="not an exception type"):
        errors.register("tests.adversarial._other.OtherError")  # type: ignore[arg-type]
    with pytest.raises(DeclarationError, match="errors"):
        Foundry("x").work(durable=True, errors=["OtherError"])(_units.add)


@pytest.mark.parametrize(
    "error",
    [
        ChildCrashedError("u", -11, "SIGSEGV"),
        DeclarationError("u", "est", "soon", "is not a duration", "write est='35ms'"),
        DeadLetteredError("j1", "poison"),
        RemoteError("x.Y", "m", "tb"),
        LabInputError("rate", -1, "is negative", "give a positive rate"),
        KeyError("row 7"),
    ],
)
def test_foundry_errors_with_fields_round_trip(error: BaseException) -> None:
    rebuilt = decode_error(json.loads(json.dumps(encode_error(error))))
    assert type(rebuilt) is type(error)
    assert str(rebuilt) == str(error)
    fields = {k: v for k, v in vars(error).items() if not k.startswith("_")}
    assert {k: getattr(rebuilt, k) for k in fields} == fields


# -- Hypothesis: arbitrary records ---------------------------------------------------------

# A path in a directory that exists (so unpickling *would* create it), unique per run.
_FUZZ_MARKER = Path(tempfile.gettempdir()) / f"foundry-adv-{uuid.uuid4().hex}-MARKER"
_FUZZ_SPEC = _units.declare(Foundry("fuzz")).units["add"].spec
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_TYPES = st.sampled_from(
    [
        f"{EVIL_MODULE}.Evil",
        "tests.adversarial._other.SideEffectError",
        "tests.adversarial._other.OtherError",
        "tests.adversarial._units.QuotaError",
        "tests.adversarial._units.QuotaError.__init__",
        "tests.adversarial._units.Foundry",
        "builtins.SystemExit",
        "builtins.KeyboardInterrupt",
        "builtins.BaseExceptionGroup",
        "builtins.ExceptionGroup",
        "builtins.KeyError",
        "builtins.object",
        "builtins.eval",
        "foundry.errors.ChildCrashedError",
        "foundry.errors.DeclarationError",
        "foundry.errors.Any",
        "foundry.config.Path",
        "os.system",
        "subprocess.Popen",
        "pickle.loads",
        "KeyError",
        "",
    ]
)
_records = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "type": _TYPES | st.text(max_size=60) | _json,
            "message": st.text(max_size=40) | _json,
            "args": st.lists(_json, max_size=5) | _json,
            "attrs": st.dictionaries(st.text(max_size=12), _json, max_size=4) | _json,
            "traceback": st.text(max_size=40) | _json,
        },
    ),
    _json,
)
_ADMITTED = ErrorTypes().scoped(modules=("tests.adversarial._units",))


@settings(max_examples=400, deadline=None)
@given(record=_records)
def test_decode_error_never_raises_imports_or_runs_what_a_record_names(record: Any) -> None:
    before = set(sys.modules)
    error = decode_error(record, _ADMITTED)
    assert isinstance(error, Exception)  # never SystemExit, KeyboardInterrupt, GeneratorExit
    assert set(sys.modules) <= before, set(sys.modules) - before
    assert not isinstance(error, SideEffectError | OtherError)
    cls = type(error)
    assert cls is RemoteError or cls.__module__ in ("builtins", "foundry.errors", "tests.adversarial._units")
    if cls.__module__ == "foundry.errors":
        assert issubclass(cls, FoundryError)


_payloads = st.one_of(
    st.binary(max_size=60),
    _json.map(lambda v: json.dumps(v).encode()),
    st.builds(lambda a, k: json.dumps({"args": a, "kwargs": k}).encode(), _json, _json),
    st.just(hostile_pickle(_FUZZ_MARKER)),
    st.just(pickle.dumps({"args": [1], "kwargs": {}})),
)
_codecs = st.sampled_from(["json", "pickle", "", "JSON", "yaml"]) | st.text(max_size=10)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=_payloads, stored=_codecs)
def test_a_json_unit_decodes_any_stored_call_or_result_without_unpickling(
    payload: bytes, stored: str
) -> None:
    spec = _FUZZ_SPEC
    try:
        args, kwargs = decode_call(payload, stored, "json", unit="add", what="arguments")
    except RecordError:
        pass
    else:
        assert stored == "json"
        assert isinstance(args, list)
        assert isinstance(kwargs, dict)
    state = JobState("j", "add", "q", JobStatus.SUCCEEDED, result=payload, codec=stored)
    outcome = outcome_of(state, spec)
    assert outcome.error is None or isinstance(outcome.error, RecordError)
    failed = JobState("j", "add", "q", JobStatus.FAILED, error=payload, codec=stored)
    assert isinstance(outcome_of(failed, spec).error, Exception)
    assert not _FUZZ_MARKER.exists()
