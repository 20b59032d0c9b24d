"""Hypothesis strategies for arbitrary valid declarations (attrs' tests/strategies.py style).

``traits()`` draws keyword traits the way an author writes them (human units included),
parses them with ``traits_from_kwargs`` and keeps only those the parser accepts, so every
drawn value is a Traits a real declaration could produce.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from foundry.decide import Host
from foundry.errors import DeclarationError
from foundry.traits import DELIVERIES, EXECUTIONS, Traits, traits_from_kwargs

durations = st.one_of(
    st.sampled_from(["100us", "2ms", "35ms", "400ms", "2s", "90s", "5m", "2h"]),
    st.floats(min_value=0, max_value=86400, allow_nan=False, allow_infinity=False),
)
rates = st.one_of(
    st.sampled_from(["50/day", "10/h", "1/s", "300/s", "2000/s", "10/min"]),
    st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False),
)
counts = st.integers(min_value=1, max_value=100_000)
models = st.one_of(
    st.sampled_from(DELIVERIES),
    st.sampled_from(EXECUTIONS),
    st.builds(lambda d, e: f"{d}/{e}", st.sampled_from(DELIVERIES), st.sampled_from(EXECUTIONS)),
)

_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "est": durations,
    "rate": rates,
    "bound": st.sampled_from(["cpu", "io", "mixed"]),
    "shares": st.lists(st.sampled_from(["orders table", "price cache", "counter"]), max_size=2),
    "ordered": st.booleans(),
    "concurrency": counts,
    "long_running": st.booleans(),
    "isolate": st.booleans(),
    "releases_gil": st.booleans(),
    "stages": st.integers(min_value=1, max_value=8),
    "partitionable": st.booleans(),
    "items": st.integers(min_value=1, max_value=10**8),
    "workers": st.integers(min_value=1, max_value=512),
    "waits_on_pool": st.booleans(),
    "durable": st.booleans(),
    "latency": st.sampled_from(["5ms", "20ms", "50ms", "200ms", "2s"]),
    "multi_step": st.booleans(),
    "compensate": st.booleans(),
    "consumers": st.integers(min_value=1, max_value=10),
    "replay": st.booleans(),
    "background": st.booleans(),
    "idempotent": st.booleans(),
    "key": st.sampled_from(["session_id", "account"]),
    "model": models,
    "retries": st.integers(min_value=0, max_value=10),
    "timeout": st.sampled_from(["1s", "30s", "5m", "3h"]),
    "overflow": st.sampled_from(["block", "reject", "caller_runs"]),
    "max_pending": counts,
}


@st.composite
def trait_kwargs(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(sorted(_FIELDS)), unique=True, max_size=len(_FIELDS)))
    return {name: draw(_FIELDS[name]) for name in names}


@st.composite
def traits(draw: st.DrawFn) -> Traits:
    raw = draw(trait_kwargs())
    try:
        return traits_from_kwargs("generated", raw)
    except DeclarationError:
        # A contradiction the parser rejects at declaration time (e.g. timeout < est):
        # not a valid Traits, so not the engine's input.
        from hypothesis import reject

        reject()


hosts = st.builds(
    Host,
    cores=st.one_of(st.none(), st.integers(min_value=1, max_value=256)),
    gil=st.one_of(st.none(), st.booleans()),
)
