"""Errors keep their type and their fields across the queue: a durable ``isolate=True``
unit whose child segfaults raises ``ChildCrashedError`` with ``exitcode`` and
``signal_name`` in the submitter (it was a ``RemoteError`` carrying the text), on every
queue engine; a Foundry error with structured fields raised by a unit keeps them; and
the record is JSON, the type rebuilt (when allowed) by calling it with the arguments
its ``__reduce__`` gives, never by unpickling."""

from __future__ import annotations

import json

import pytest

from foundry.errors import (
    ChildCrashedError,
    DeadLetteredError,
    DeclarationError,
    FoundryError,
    LabInputError,
    RemoteError,
    UnknownTraitError,
)
from foundry.serialize import decode_error, encode_error
from tests.adversarial import _units
from tests.adversarial.conftest import QueueEnv


def test_a_segfaulting_isolated_job_raises_child_crashed_error_with_its_exit_code(
    queue_env: QueueEnv,
) -> None:
    # Given: a durable isolated unit, and a worker
    unit = queue_env.work(_units.segfault, isolate=True, name="native")
    queue_env.worker()
    # When: one job segfaults its child, another exits with a code, a third is fine
    segv, exited, fine = unit.submit("segv"), unit.submit("exit"), unit.submit("fine")
    # Then: the submitter gets the crash as ChildCrashedError, with its fields
    with pytest.raises(ChildCrashedError) as info:
        segv.result(timeout=60)
    assert (info.value.unit, info.value.exitcode, info.value.signal_name) == ("native", -11, "SIGSEGV")
    assert "SIGSEGV" in str(info.value)
    with pytest.raises(ChildCrashedError) as info:
        exited.result(timeout=60)
    assert (info.value.exitcode, info.value.signal_name) == (3, None)
    assert fine.result(timeout=60) == "fine"


def test_a_foundry_error_raised_by_a_job_keeps_its_fields(queue_env: QueueEnv) -> None:
    unit = queue_env.work(_units.refuse, name="refuser")
    queue_env.worker()
    with pytest.raises(DeclarationError) as info:
        unit.submit({"hue": 3}).result(timeout=60)
    error = info.value
    assert (error.unit, error.field, error.value, error.fix) == (
        "inner",
        "colour",
        {"hue": 3},
        'give "red" or "blue"',
    )


@pytest.mark.parametrize(
    ("error", "fields"),
    [
        (ChildCrashedError("u", -9, "SIGKILL"), ("unit", "exitcode", "signal_name")),
        (ChildCrashedError("u", 70, None), ("unit", "exitcode", "signal_name")),
        (
            DeclarationError("u", "est", "fast", "is not a duration", 'give "35ms"'),
            ("unit", "field", "value", "problem", "fix"),
        ),
        (
            UnknownTraitError("u", "estt", 1, "is not a trait", "did you mean est?"),
            ("unit", "field", "value", "problem", "fix"),
        ),
        (DeadLetteredError("job-1", "retries exhausted"), ("job_id", "reason")),
        (LabInputError("workers", 0, "is zero", "give at least 1"), ("field", "value", "problem", "fix")),
        (
            RemoteError("somewhere.Odd", "odd failure", "Traceback ..."),
            ("type_name", "message", "traceback_text"),
        ),
    ],
    ids=lambda e: type(e).__name__ if isinstance(e, BaseException) else "",
)
def test_every_foundry_error_with_fields_round_trips_through_a_json_record(
    error: FoundryError, fields: tuple[str, ...]
) -> None:
    record = json.loads(json.dumps(encode_error(error)))
    # The record carries the constructor's arguments (what ``__reduce__`` gives), in order.
    assert record["args"] == [getattr(error, name) for name in fields]
    back = decode_error(record)
    assert type(back) is type(error)
    assert str(back) == str(error)
    for name in fields:
        assert getattr(back, name) == getattr(error, name)


def test_a_field_that_is_not_json_keeps_the_type_with_the_value_s_repr() -> None:
    value = object()
    record = json.loads(json.dumps(encode_error(DeclarationError("u", "f", value, "is odd", "give 1"))))
    back = decode_error(record)
    assert type(back) is DeclarationError
    assert (back.unit, back.field, back.value, back.fix) == ("u", "f", repr(value), "give 1")


@pytest.mark.parametrize(
    "args",
    [
        ["u", -11, "SIGSEGV", "evil"],  # one argument too many
        ["u", -11],  # one too few
        [{"unit": "u", "exitcode": -11, "signal_name": "SIGSEGV"}],  # fields by name: not keyword arguments
        "u, -11, SIGSEGV",  # not a list
    ],
    ids=["extra", "missing", "by-name", "not-a-list"],
)
def test_fields_that_do_not_match_the_type_are_not_passed_to_it(args: object) -> None:
    # A record whose arguments do not fit the type's constructor (a hostile or foreign
    # record) does not build the type: it comes back as a RemoteError with the text.
    record = encode_error(ChildCrashedError("u", -11, "SIGSEGV"))
    record["args"] = args
    record["fields"] = {"unit": "u", "exitcode": -11, "signal_name": "SIGSEGV", "evil": 1}  # (not read)
    back = decode_error(record)
    assert isinstance(back, RemoteError)
    assert back.type_name == "foundry.errors.ChildCrashedError"
    assert "SIGSEGV" in str(back)
