"""The copy-light JSON of ``foundry.payload`` is exactly the standard library's: for any
JSON-compatible value, ``dumps`` gives the bytes ``json.dumps(..., separators=(",", ":"),
allow_nan=False).encode()`` gives, and ``loads`` gives what ``json.loads`` gives for any
document (ours, another producer's, or garbage — then it raises as json does). The
thresholds are shrunk so that Hypothesis's small strings take the chunked paths."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foundry import payload

text = st.text(alphabet=st.characters(codec=None), max_size=40) | st.sampled_from(
    ["", '"', "\\", '\\"', "a\nb", "\x00", "\x7f", "é", "\u2028", "😀", "\ud800", "x" * 30]
)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | text
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.tuples(inner, inner) | st.dictionaries(text, inner, max_size=5)
    ),
    max_leaves=20,
)


@pytest.fixture(autouse=True)
def small_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(payload, "BIG", 3)
    monkeypatch.setattr(payload, "CHUNK", 2)
    monkeypatch.setattr(payload, "_FANOUT", 4)


def standard(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values)
def test_dumps_is_json_dumps(value: Any) -> None:
    assert payload.dumps(value) == standard(value)


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values, st.sampled_from([None, 1, 2]))
def test_loads_is_json_loads(value: Any, indent: int | None) -> None:
    data = json.dumps(value, indent=indent, ensure_ascii=indent == 2).encode("utf-8", "surrogatepass")
    assert payload.loads(data) == json.loads(data)
    assert payload.loads(bytearray(data)) == json.loads(data)


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=60) | values.map(lambda v: standard(v)[:-1] + b"\x01"))
def test_loads_refuses_what_json_loads_refuses(data: bytes) -> None:
    try:
        expected: Any = json.loads(data)
    except ValueError:
        with pytest.raises(ValueError):
            payload.loads(data)
    else:
        assert payload.loads(data) == expected


def test_values_that_json_refuses_are_refused_alike() -> None:
    for bad in (
        {"k": float("nan"), "s": "long string"},
        ["long string", {1, 2}],
        {"s": "long string", (1, 2): 1},
    ):
        with pytest.raises((TypeError, ValueError)) as ours:
            payload.dumps(bad)
        with pytest.raises(type(ours.value)):
            standard(bad)
    loop: list[Any] = ["long string"]
    loop.append([loop])
    with pytest.raises(ValueError, match="Circular"):
        payload.dumps(loop)


def test_non_string_keys_take_the_standard_path() -> None:
    value = {1: "long string", None: "another long one", "k": "x" * 10}
    assert payload.dumps(value) == standard(value)
