"""The one back-off policy (foundry.retry), and that each user keeps its documented shape."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from foundry.errors import DeclarationError
from foundry.retry import OUTAGE, Backoff


def test_the_nominal_delay_doubles_from_base_up_to_the_cap() -> None:
    policy = Backoff(0.5, cap=3.0, jitter="none")
    assert [policy.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert policy.delay(0) == 0.0  # no retry yet: no delay
    assert policy.nominal(10_000) == 3.0  # no overflow, however many retries


@given(
    base=st.floats(0.0, 100.0),
    cap=st.floats(0.0, 1000.0),
    factor=st.floats(1.0, 4.0),
    retry=st.integers(1, 200),
    seed=st.integers(0, 2**32),
)
def test_jitter_stays_within_its_band(base: float, cap: float, factor: float, retry: int, seed: int) -> None:
    rng = random.Random(seed)
    nominal = Backoff(base, cap, factor, jitter="none").delay(retry)
    assert nominal <= cap
    equal = Backoff(base, cap, factor, jitter="equal").delay(retry, rng)
    full = Backoff(base, cap, factor, jitter="full").delay(retry, rng)
    assert nominal / 2 <= equal <= nominal
    assert 0.0 <= full <= nominal


def test_equal_jitter_spreads_the_retries_of_many_failures() -> None:
    rng = random.Random(7)
    delays = {round(Backoff(1.0).delay(3, rng), 6) for _ in range(100)}
    assert len(delays) > 90  # not all in step
    assert min(delays) >= 2.0
    assert max(delays) <= 4.0


def test_pauses_are_the_delays_of_retry_one_two_three() -> None:
    pauses = OUTAGE.pauses()
    assert [next(pauses) for _ in range(8)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert sum([0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0]) == pytest.approx(5.15)  # a run's 8 journal tries


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"base": -1.0}, "base"),
        ({"cap": float("nan")}, "cap"),
        ({"factor": 0.5}, "factor"),
        ({"base": True}, "base"),
        ({"jitter": "some"}, "jitter"),
    ],
)
def test_a_bad_policy_is_refused_naming_its_owner_and_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(DeclarationError, match=field) as info:
        Backoff(owner="billing", **kwargs)  # type: ignore[arg-type]
    assert "billing" in str(info.value)
