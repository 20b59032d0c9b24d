"""W3C Trace Context as a stored field: small, bounded, validated (no OpenTelemetry here).

A durable job, a workflow's journal row and a stream event carry the trace they were
submitted in as one text field, ``trace``: the W3C ``traceparent`` value, optionally
followed by a newline and the ``tracestate`` value (neither may contain a newline, so
the split is unambiguous)::

    00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
    00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\\nrojo=00f067aa0ba902b7,congo=t61rcWkgMzE

Engines with message headers (NATS) keep the two parts as the ``traceparent`` and
``tracestate`` headers instead. The store is hostile input: :func:`parse_trace` returns
the field normalised, or ``None`` for anything that is not a valid trace context — a
malformed value is ignored (the work runs untraced), never an error. Writers go through
:func:`pack`, which applies the same rules, so what is stored is at most
:data:`MAX_TRACE` characters.

Pure: importing this module imports nothing; ``foundry.observe.tracing`` is what talks
to OpenTelemetry.
"""

from __future__ import annotations

import re

__all__ = ["MAX_TRACE", "MAX_TRACESTATE", "pack", "parse_trace", "unpack"]

# version 00 exactly; a later version may append fields after a dash (W3C §3.2.4), which
# are dropped here (what Foundry forwards is the version-00 prefix it understands).
_PARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?", re.ASCII)
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
# tracestate list members (W3C §3.3.1): key = simple-key / tenant@system, value up to 256
# printable characters without "," and "=", not ending in a space.
_KEY = r"(?:[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13})"
_MEMBER = re.compile(_KEY + r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]", re.ASCII)
MAX_TRACESTATE = 512  # what W3C asks every vendor to propagate at least; longer lists lose members
_MAX_MEMBERS = 32
MAX_TRACE = 55 + 1 + MAX_TRACESTATE  # the longest field pack() writes


def _traceparent(value: str) -> str | None:
    if len(value) > 4096:  # a future version's extra fields are bounded too
        return None
    match = _PARENT.fullmatch(value)
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return f"00-{trace_id}-{span_id}-{flags}"


def _tracestate(value: str) -> str | None:
    """The valid members of ``value``, in order, within :data:`MAX_TRACESTATE` characters
    (members that do not fit are dropped from the end, as W3C §3.3.1.5 allows); ``None``
    when the header as a whole is not a tracestate (then it is dropped, W3C §3.3.1.3)."""
    if len(value) > 4 * MAX_TRACESTATE:
        return None
    members: list[str] = []
    seen: set[str] = set()
    size = 0
    full = False  # once one member does not fit, the rest are dropped: whole members from the front
    for raw in value.split(","):
        member = raw.strip(" \t")
        if not member:
            continue
        if _MEMBER.fullmatch(member) is None:
            return None
        key = member.split("=", 1)[0]
        if key in seen:
            return None
        seen.add(key)
        grown = size + len(member) + (1 if members else 0)
        full = full or len(members) >= _MAX_MEMBERS or grown > MAX_TRACESTATE
        if not full:
            members.append(member)
            size = grown
    return ",".join(members) or None


def pack(traceparent: str | None, tracestate: str | None = None) -> str | None:
    """The stored field for a ``traceparent`` (and ``tracestate``) header, or ``None``
    when ``traceparent`` is missing or invalid (an invalid ``tracestate`` alone is dropped)."""
    if not isinstance(traceparent, str):
        return None
    parent = _traceparent(traceparent.strip(" \t"))
    if parent is None:
        return None
    state = _tracestate(tracestate) if isinstance(tracestate, str) else None
    return parent if state is None else f"{parent}\n{state}"


def unpack(value: str) -> tuple[str, str | None]:
    """``(traceparent, tracestate)`` of a field :func:`parse_trace` accepted."""
    parent, _, state = value.partition("\n")
    return parent, state or None


def parse_trace(value: object) -> str | None:
    """The field read back from a store, normalised, or ``None`` when it is missing or is
    not a trace context (any type, any length, any bytes: never raises)."""
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        if len(value) > MAX_TRACE:
            return None
        try:
            value = bytes(value).decode("ascii")
        except UnicodeDecodeError:
            return None
    if not isinstance(value, str) or not value or len(value) > MAX_TRACE:
        return None
    parent, sep, state = value.partition("\n")
    if sep and "\n" in state:
        return None
    return pack(parent, state if sep else None)
