"""Hypothesis fuzzes how every stream engine decodes a stored entry.

Each engine has one decoder from what it stores to an event: SQLite's row
(:func:`~foundry.backends.stream.sqlite.decode_row`), Redis' entry fields
(:func:`~foundry.backends.stream.redis.decode_fields`, :func:`~...redis.unpack_entry`),
NATS' message (:func:`~foundry.backends.stream.nats.decode_message`). Whatever the bytes
and fields, a decoder returns a well-formed :class:`Event` or raises
:class:`MalformedEntryError` — nothing else. Then, end to end on each engine: arbitrary
entries written straight into a partition while a consumer runs never kill its thread,
and each one is either handled or dead-lettered.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foundry.backends.stream import Event, MalformedEntryError
from foundry.backends.stream.nats import decode_message
from foundry.backends.stream.redis import decode_fields, unpack_entry
from foundry.backends.stream.sqlite import Text, decode_row
from tests.adversarial._streams import (
    MakeApp,
    engine_of,
    nats_publish,
    redis_xadd,
    sqlite_insert,
    unique,
    wait_until,
)

FUZZ = settings(max_examples=400, deadline=None)


def well_formed(event: Event, stream: str, partition: int) -> None:
    assert type(event) is Event
    assert (event.stream, event.partition) == (stream, partition)
    assert type(event.offset) is int
    assert type(event.id) is str
    assert event.id
    assert event.key is None or type(event.key) is str
    assert type(event.payload) is bytes
    assert type(event.timestamp) is float
    assert math.isfinite(event.timestamp)
    assert type(event.deliveries) is int


def decoded(decode: Callable[[], Event], stream: str = "s", partition: int = 0) -> Event | None:
    """``decode()``'s event, checked, or ``None`` when it raised the one allowed error."""
    try:
        event = decode()
    except MalformedEntryError:
        return None
    well_formed(event, stream, partition)
    assert event.malformed is None
    return event


# -- SQLite ----------------------------------------------------------------------------

SQL_VALUE = st.one_of(
    st.none(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(),
    st.binary(max_size=40).map(Text),
    st.text(max_size=20).map(lambda t: Text(t.encode())),
    st.binary(max_size=40),
)


@FUZZ
@given(row=st.lists(SQL_VALUE, min_size=0, max_size=7), off=st.integers(min_value=1, max_value=2**62))
def test_sqlite_any_row_decodes_or_is_malformed(row: list[Any], off: int) -> None:
    decoded(lambda: decode_row("s", 0, [off, *row[1:]] if len(row) == 5 else row, 1))


@FUZZ
@given(
    off=st.integers(min_value=1, max_value=2**62),
    ident=st.text(max_size=30),
    key=st.none() | st.text(max_size=30),
    ts=st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**53), 2**53),
    payload=st.binary(max_size=60),
)
def test_sqlite_a_row_foundry_wrote_decodes_to_its_event(
    off: int, ident: str, key: str | None, ts: float, payload: bytes
) -> None:
    row = (
        off,
        Text(ident.encode("utf-8", "surrogatepass")),
        None if key is None else Text(key.encode("utf-8", "surrogatepass")),
        ts,
        payload,
    )
    event = decoded(lambda: decode_row("s", 3, row, 2), partition=3)
    if any("\ud800" <= c <= "\udfff" for c in ident + (key or "")):
        return  # not UTF-8: refused, fine
    assert event is not None
    assert (event.offset, event.key, event.payload, event.deliveries) == (off, key, payload, 2)
    assert event.id == (ident or f"s/3@{off}")


# -- Redis -----------------------------------------------------------------------------


def foundry_m(ts: float, cum: int, ident: bytes, key: bytes | None) -> bytes:
    """The ``m`` field as the append script writes it."""
    blob = b"%d -%s" % (len(ident), ident) if key is None else b"%d k%s%s" % (len(ident), ident, key)
    return b"%.6f %d %s" % (ts, cum, blob)


M_FIELD = st.one_of(
    st.binary(max_size=60),
    st.builds(
        foundry_m,
        st.floats(min_value=0, max_value=2e9),
        st.integers(0, 2**40),
        st.binary(max_size=20),
        st.none() | st.binary(max_size=20),
    ),
    # Foundry's shape with a part broken: a byte flipped, cut short, or grown
    st.tuples(
        st.builds(foundry_m, st.floats(0, 2e9), st.integers(0, 99), st.binary(max_size=9), st.none()),
        st.integers(0, 40),
        st.binary(max_size=3),
    ).map(lambda t: t[0][: t[1]] + t[2] + t[0][t[1] + 1 :]),
)


@FUZZ
@given(m=M_FIELD, d=st.binary(max_size=40), off=st.integers(1, 2**62))
def test_redis_any_fields_decode_or_are_malformed(m: bytes, d: bytes, off: int) -> None:
    decoded(lambda: decode_fields("s", 0, off, m, d, 1))
    # As the read script packs it: never raises, a stand-in at worst, at the entry's offset.
    event = unpack_entry("s", 0, b"%d %d-0 " % (len(m), off) + m + d, 1)
    well_formed(event, "s", 0)
    assert event.offset == off


@FUZZ
@given(
    ts=st.floats(min_value=0, max_value=2e9),
    ident=st.text(max_size=20),
    key=st.none() | st.text(max_size=20),
    d=st.binary(max_size=40),
)
def test_redis_fields_foundry_wrote_decode_to_their_event(
    ts: float, ident: str, key: str | None, d: bytes
) -> None:
    raw_id = ident.encode("utf-8", "surrogatepass")
    raw_key = None if key is None else key.encode("utf-8", "surrogatepass")
    event = decoded(lambda: decode_fields("s", 1, 7, foundry_m(ts, 0, raw_id, raw_key), d, 1), partition=1)
    if any("\ud800" <= c <= "\udfff" for c in ident + (key or "")):
        return
    assert event is not None
    assert (event.id, event.key, event.payload) == (ident or "s/1@7", key, d)


@FUZZ
@given(
    fields=st.lists(
        st.tuples(st.sampled_from([b"m", b"d", b"x", b""]) | st.binary(max_size=5), st.binary(max_size=20)),
        max_size=5,
    ),
    ms=st.integers(0, 2**62),
    seq=st.integers(0, 2**64 - 1),
)
def test_redis_an_entry_without_foundry_fields_is_a_stand_in(
    fields: list[tuple[bytes, bytes]], ms: int, seq: int
) -> None:
    flat = [item for pair in fields for item in pair]
    event = unpack_entry("s", 0, [b"%d-%d" % (ms, seq), flat], 3)
    well_formed(event, "s", 0)
    assert event.malformed is not None
    assert (event.offset, event.deliveries) == (ms, 3)


# -- NATS ------------------------------------------------------------------------------

HEADER_VALUE = st.one_of(st.text(max_size=20), st.integers(), st.binary(max_size=5), st.none())


@FUZZ
@given(
    headers=st.none()
    | st.dictionaries(
        st.sampled_from(["Nats-Msg-Id", "Foundry-Key", "X-Other"]) | st.text(max_size=8), HEADER_VALUE
    )
    | st.lists(st.text(max_size=3), max_size=2),
    data=st.one_of(st.binary(max_size=40), st.text(max_size=5), st.none(), st.integers()),
    ts=st.floats(),
    seq=st.integers(1, 2**62),
)
def test_nats_any_message_decodes_or_is_malformed(headers: Any, data: Any, ts: float, seq: int) -> None:
    event = decoded(lambda: decode_message("s", 2, seq, headers, data, ts, 1), partition=2)
    if event is not None:
        assert event.offset == seq
        given_id = headers.get("Nats-Msg-Id") if isinstance(headers, dict) else None
        assert event.id == (given_id or f"s/2@{seq}")


# -- end to end, on every engine -------------------------------------------------------


SQL_NOT_NULL = SQL_VALUE.filter(lambda v: v is not None and not (isinstance(v, float) and math.isnan(v)))
SQLITE_ROW = st.fixed_dictionaries(
    {
        "id": SQL_NOT_NULL,
        "key": SQL_VALUE.filter(lambda v: not (isinstance(v, float) and math.isnan(v))),
        "ts": SQL_NOT_NULL,
        "payload": SQL_NOT_NULL,
    }
).map(
    lambda row: {
        k: (str(bytes(v).decode("utf-8", "replace")) if type(v) is Text else v) for k, v in row.items()
    }
)
REDIS_ENTRY = st.dictionaries(
    st.sampled_from([b"m", b"d", b"x"]) | st.binary(min_size=1, max_size=4), M_FIELD, min_size=1, max_size=3
)
NATS_MESSAGE = st.tuples(
    st.binary(max_size=40) | st.sampled_from([b"{}", b'{"k": 1}', b"null"]),
    st.none()
    | st.fixed_dictionaries(
        {},
        optional={
            "Nats-Msg-Id": st.sampled_from(["", "fuzz"]),
            "Foundry-Key": st.text(alphabet="abc-_ 1", max_size=8),
            "X-Other": st.text(alphabet="xyz", max_size=4),
        },
    ),
)


def write(url: str, stream: str, entries: list[Any]) -> None:
    engine = engine_of(url)
    if engine == "sqlite":
        for row in entries:
            sqlite_insert(url, stream, 0, row)
    elif engine == "redis":
        for fields in entries:
            redis_xadd(url, stream, 0, fields)
    else:
        unique_ids = []
        for data, headers in entries:
            if headers and headers.get("Nats-Msg-Id"):  # JetStream would dedup a repeated id
                headers = {**headers, "Nats-Msg-Id": f"{headers['Nats-Msg-Id']}-{uuid.uuid4().hex}"}
            unique_ids.append((data, headers))
        nats_publish(url, stream, 0, unique_ids)


def test_fuzzed_entries_never_kill_the_consumer_and_none_is_lost(
    make_stream_app: MakeApp, stream_url: str
) -> None:
    engine = engine_of(stream_url)
    entry = {"sqlite": SQLITE_ROW, "redis": REDIS_ENTRY, "nats": NATS_MESSAGE}[engine]
    app = make_stream_app(stream_url)
    s = app.stream(unique("fuzz"), key="k")
    handled: list[str] = []
    s.consumer(group="g", max_deliveries=1, ack_deadline="10s")(lambda e: handled.append(e.id))
    s.runtime.ensure_group("g")
    written = 0
    with s.run() as consumers:

        @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
        @given(entries=st.lists(entry, min_size=1, max_size=4))
        def one_round(entries: list[Any]) -> None:
            nonlocal written
            write(stream_url, s.name, entries)
            marker = s.publish({"k": "marker"}, id=f"marker-{uuid.uuid4().hex}").id
            written += len(entries) + 1
            wait_until("the marker behind the fuzzed entries", lambda: marker in handled, timeout=60)

        one_round()
        wait_until(
            "every entry handled or dead-lettered",
            lambda: len(handled) + len(s.dead_letters("g", limit=100_000)) >= written,
            timeout=60,
        )
        assert consumers.alive
        assert consumers.failures == []
    letters = s.dead_letters("g", limit=100_000)
    assert len(handled) + len(letters) == written
    assert all(letter.id and letter.reason for letter in letters)
    assert not any(_is_gap(letter.reason) for letter in letters)


def _is_gap(reason: str) -> bool:
    return "removed by retention" in reason
