"""The trace context a stored record carries is hostile input like the rest of it: a
``traceparent`` written straight into a stream engine by someone else — junk, the wrong
type, far too long, not UTF-8 — is ignored (the event is delivered untraced, never
dead-lettered as malformed), and :func:`foundry.tracecontext.parse_trace` returns a
valid, bounded field or ``None`` for any input whatsoever."""

from __future__ import annotations

import time

from hypothesis import example, given
from hypothesis import strategies as st

from foundry.backends.stream import NewEvent, Start
from foundry.tracecontext import MAX_TRACE, pack, parse_trace, unpack
from tests.adversarial._fuzz import FUZZ
from tests.adversarial._fuzz import anything as any_value
from tests.adversarial._streams import MakeApp, engine_of, nats_publish, redis_xadd, sqlite_insert, unique


def _hex(n: int) -> st.SearchStrategy[str]:
    return st.text("0123456789abcdef", min_size=n, max_size=n)


# a tracestate member, ``[a-z][a-z0-9_*/-]{0,20}=[!-+\--<>-~]{1,30}`` (W3C: a key, then a value
# of printable ASCII without "," and "="), built from its alphabets: as a regex strategy it was
# most of this module's time
_VALUE_CHARS = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in ",=")
_MEMBER = st.builds(
    "{}{}={}".format,
    st.sampled_from("abcdefghijklmnopqrstuvwxyz"),
    st.text("abcdefghijklmnopqrstuvwxyz0123456789_*/-", max_size=20),
    st.text(_VALUE_CHARS, min_size=1, max_size=30),
)

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
JUNK = [
    "garbage",
    "00-" + "0" * 32 + "-" + "0" * 16 + "-01",
    PARENT + "-extra",
    "ff" + PARENT[2:],
    "x" * 100_000,
]


def _write_foreign(url: str, stream: str) -> list[str]:
    """Entries with Foundry's fields and a bad trace context; their ids."""
    engine = engine_of(url)
    ids = [f"bad{i}" for i in range(len(JUNK) + 2)]
    if engine == "sqlite":
        values: list[object] = [*JUNK, 42, b"\xff" * 70]
        for ident, value in zip(ids, values, strict=True):
            sqlite_insert(url, stream, 0, {"id": ident, "payload": b"1", "trace": value})
    elif engine == "redis":
        values = [*JUNK, b"\xff\xfe", PARENT + "\n" + "\n"]
        for ident, value in zip(ids, values, strict=True):
            m = f"{time.time():.6f} 0 {len(ident)} -{ident}"
            redis_xadd(url, stream, 0, {"m": m, "d": "1", "t": value})
    else:
        headers = [{"traceparent": v[:4000]} for v in JUNK]
        headers += [{"traceparent": PARENT[:-1], "tracestate": "a=b"}, {"tracestate": "a=b"}]
        nats_publish(
            url, stream, 0, [(b"1", {"Nats-Msg-Id": i, **h}) for i, h in zip(ids, headers, strict=True)]
        )
    return ids


def test_a_foreign_trace_context_is_ignored_and_the_event_delivered(
    make_stream_app: MakeApp, stream_url: str
) -> None:
    # Given a stream with one event of Foundry's, then entries whose trace field is junk
    app = make_stream_app(stream_url)
    s = app.stream(unique("trace"), partitions=1)
    backend = s.runtime.backend
    backend.append(s.name, [NewEvent("ours", b"0", trace=PARENT)])
    backend.create_group(s.name, "g", Start.beginning())
    ids = _write_foreign(stream_url, s.name)
    # When the group reads the partition
    got = []
    until = time.monotonic() + 20
    while len(got) < 1 + len(ids) and time.monotonic() < until:
        batch = backend.read(s.name, "g", 0, "c1", max=50, ack_deadline=30.0, timeout=0.5)
        if batch:
            got += batch
            backend.commit(s.name, "g", 0, batch[-1].offset)
    # Then every entry is an event (none malformed) and only Foundry's own carries a context
    assert [(e.id, e.malformed) for e in got] == [("ours", None)] + [(i, None) for i in ids]
    assert [e.trace for e in got] == [PARENT] + [None] * len(ids)


@FUZZ
@given(st.one_of(any_value(), st.text(), st.binary()))
def test_parse_trace_returns_a_valid_bounded_field_or_none_for_anything(value: object) -> None:
    field = parse_trace(value)
    assert field is None or (len(field) <= MAX_TRACE and parse_trace(field) == field)


@FUZZ
@given(
    st.builds("-".join, st.tuples(*(_hex(n) for n in (2, 32, 16, 2)))),
    # short lists, and lists long enough to pass the 512-character cap (hypothesis's lists
    # are short by default: without the second, no generated state was ever cut)
    st.one_of(st.lists(_MEMBER, max_size=40), st.lists(_MEMBER, min_size=20, max_size=40)),
)
# 499 characters kept, then a member too long for the rest, then one short enough: the
# short one is dropped too (kept members are a prefix, never a selection)
@example(PARENT, [f"a{i:03}=" + "x" * 44 for i in range(10)] + ["big=" + "y" * 30, "c=d"])
def test_a_valid_context_round_trips_and_a_long_tracestate_is_cut_by_members(
    parent: str, members: list[str]
) -> None:
    state = ",".join(members) or None
    field = pack(parent, state)
    if parent.startswith("ff") or parent[3:35] == "0" * 32 or parent[36:52] == "0" * 16:
        assert field is None
        return
    assert field is not None
    got_parent, got_state = unpack(field)
    assert got_parent == "00" + parent[2:]  # a later version is kept as the version-00 prefix
    keys = [m.split("=", 1)[0] for m in members]
    if got_state is not None and len(set(keys)) == len(keys):
        kept = got_state.split(",")
        assert kept == members[: len(kept)]  # whole members, in order, from the front
        assert len(got_state) <= 512
