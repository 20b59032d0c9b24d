"""Hypothesis values for fuzzing record decoders: anything a store can hand back."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

# No explain phase: it re-runs a failing example under sys.settrace, which on 3.11 makes a
# shrink of regex-built values take longer than the test's whole timeout.
FUZZ = settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)


def anything(*words: str) -> st.SearchStrategy[Any]:
    """Any value a driver returns (``None``, booleans, huge integers, NaN and infinities,
    text, bytes), and the ``words`` a decoder knows, so that some get past the first field."""
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=30),
        st.binary(max_size=30),
        st.sampled_from(["1", "0", "-1", "1e309", "nan", *words]),
    )
