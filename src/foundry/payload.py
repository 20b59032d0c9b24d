"""Payload sizes, and JSON for large strings without whole-payload copies.

**Limits.** ``max_payload`` (a trait; default :data:`DEFAULT_MAX_PAYLOAD`, 1 MiB) bounds
what a durable model stores for a unit: its encoded arguments at submit, its encoded
result in the worker, a workflow step's result. :func:`too_large` builds the one error
for all of them, naming the unit, what was too large, the size, the limit and the fix.

**Copies.** ``json.dumps(value).encode()`` holds the value, an escaped copy of each
string, the joined document and its bytes at once (3-4x a large string's size), and
``json.loads(data)`` decodes the whole document to a ``str`` before parsing it (3x).
For documents whose size is in a few large strings — a 200 MB text argument or
result, the case that matters for memory — :func:`dumps` writes those strings in
chunks of :data:`CHUNK` characters straight into the output buffer, and :func:`loads`
decodes each large plain string (no escapes) straight from the input bytes, parsing
only the small rest. Both give exactly what ``json.dumps(value, separators=(",", ":"),
allow_nan=False).encode()`` and ``json.loads(data)`` give (a property test checks it);
anything else takes the standard path.
"""

from __future__ import annotations

import io
import json
import uuid
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

from foundry.errors import PayloadTooLargeError

__all__ = ["DEFAULT_MAX_PAYLOAD", "RESULT_FIX", "dumps", "dumps_text", "loads", "too_large"]

DEFAULT_MAX_PAYLOAD = 1 << 20  # 1 MiB: a durable model carries references to data, not the data
RESULT_FIX = (
    "return a reference (a path, URL or row id) to where the data is, or declare a larger max_payload= "
    "on the unit (a stored result is kept for its result_ttl, 7 days by default)"
)
BIG = 1 << 16  # a string of at least this many characters (bytes, decoding) is copied in chunks
CHUNK = 1 << 20  # characters (bytes) copied at a time
_FANOUT = 64  # containers walked for large strings: at most this many items, two levels deep
_TOKENS = 4096  # string tokens :func:`loads` looks at before it leaves the document to json.loads
_SEPARATORS = (",", ":")
# json.dumps(v, separators=..., allow_nan=False) builds this encoder on every call (a third of
# the time of a small document); one made once encodes exactly the same, and is thread-safe
_ENCODER = json.JSONEncoder(separators=_SEPARATORS, allow_nan=False)
# ...and its encode() still builds the C encoder per call (half the time of a small event):
# this one is built once. No circular check (a marker dict would be shared between threads):
# a cycle recurses to RecursionError, and dumps_text then lets _ENCODER say what is wrong.
_C_ENCODE = (
    None
    if c_make_encoder is None
    else c_make_encoder(None, _ENCODER.default, encode_basestring_ascii, None, ":", ",", False, False, False)
)
_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # the C scanner json.loads ends in
_NOT_PLAIN = bytes(range(0x20)) + b'"\\'  # a string with any of these needs the JSON scanner
_WS = b" \t\n\r"


def too_large(
    owner: str, what: str, size: int, limit: int, *, stored: str = "nothing was stored", fix: str = ""
) -> PayloadTooLargeError:
    """The error for a payload over its limit (``owner``: "unit 'resize'", "workflow 'x'")."""
    fix = fix or (
        "pass or return a reference (a path, URL or row id) instead of the data, or declare a larger "
        "max_payload= on the unit"
    )
    return PayloadTooLargeError(
        f"{owner}: {what} encodes to {size} bytes, over max_payload={limit} bytes; {stored}. Fix: {fix}"
    )


# -- encoding -----------------------------------------------------------------------------------


def dumps_text(value: Any) -> str:
    """``json.dumps(value, separators=(",", ":"), allow_nan=False)``: the same text, or
    the same error."""
    if _C_ENCODE is not None:
        try:
            return "".join(_C_ENCODE(value, 0))
        except (TypeError, ValueError, RecursionError):
            pass  # the standard encoder raises its own error for it (a cycle: ValueError)
    return _ENCODER.encode(value)


def dumps(value: Any) -> bytes:
    """``json.dumps(value, separators=(",", ":"), allow_nan=False).encode()``, with large
    strings (the value itself, or up to two levels into small lists and dicts) copied in
    chunks into the output instead of as a whole."""
    if not _has_big(value, 0):
        return dumps_text(value).encode()
    out = io.BytesIO()
    _write(out, value, 0)
    return out.getvalue()  # the buffer itself, not a copy (CPython's BytesIO)


def _has_big(value: Any, depth: int) -> bool:
    # (plain loops, no generators: this runs on every encode, most of them of small values)
    if isinstance(value, str):
        return len(value) >= BIG
    if depth >= 2:
        return False
    if isinstance(value, list | tuple):
        if len(value) > _FANOUT:
            return False
        items: Any = value
    elif isinstance(value, dict):
        if len(value) > _FANOUT:
            return False
        for key in value:
            if not isinstance(key, str):
                return False
        items = value.values()
    else:
        return False
    for item in items:
        if (isinstance(item, str) and len(item) >= BIG) or (
            depth < 1 and isinstance(item, list | tuple | dict) and _has_big(item, depth + 1)
        ):
            return True
    return False


def _write(out: io.BytesIO, value: Any, depth: int) -> None:
    if isinstance(value, str) and len(value) >= BIG:
        out.write(b'"')
        for start in range(0, len(value), CHUNK):
            out.write(encode_basestring_ascii(value[start : start + CHUNK])[1:-1].encode("ascii"))
        out.write(b'"')
    elif depth < 2 and isinstance(value, list | tuple) and _has_big(value, depth):
        out.write(b"[")
        for i, item in enumerate(value):
            if i:
                out.write(b",")
            _write(out, item, depth + 1)
        out.write(b"]")
    elif depth < 2 and isinstance(value, dict) and _has_big(value, depth):
        out.write(b"{")
        for i, (key, item) in enumerate(value.items()):
            out.write(b',"' if i else b'"')
            out.write(encode_basestring_ascii(key)[1:-1].encode("ascii"))
            out.write(b'":')
            _write(out, item, depth + 1)
        out.write(b"}")
    else:
        out.write(_ENCODER.encode(value).encode())


# -- decoding -----------------------------------------------------------------------------------


def loads(data: bytes | bytearray) -> Any:
    """``json.loads(data)``, with each large plain string value (no escapes) decoded
    straight from ``data`` instead of from a ``str`` copy of the whole document."""
    if len(data) < BIG or not isinstance(data, bytes | bytearray):
        return _loads_small(data)
    head = bytes(data[:4])
    if head.startswith(b"\xef\xbb\xbf") or json.detect_encoding(head) != "utf-8":
        return json.loads(data)
    spans = _big_strings(data)
    if not spans:
        return json.loads(data)
    view = memoryview(data)
    marker = f"\x00foundry-big-{uuid.uuid4().hex}-"
    pieces: list[bytes | memoryview] = []
    last = 0
    for i, (start, end) in enumerate(spans):
        pieces.append(view[last : start - 1])
        pieces.append(json.dumps(f"{marker}{i}").encode())
        last = end + 1
    pieces.append(view[last:])
    skeleton = json.loads(b"".join(pieces))
    strings = [str(view[start:end], "utf-8", "surrogatepass") for start, end in spans]
    return _fill(skeleton, marker, strings)


def _loads_small(data: Any) -> Any:
    """``json.loads(data)``: for bytes json.loads reads as UTF-8 (an ASCII first byte, no
    NUL in the first two: not a BOM, not UTF-16/32), the C scanner straight on their text,
    without json.loads' encoding sniffing and Python-level wrappers; the standard call for
    anything else, and for every error (trailing whitespace included), so each is its own."""
    if type(data) is bytes and len(data) >= 2 and 0 < data[0] < 0x80 and data[1]:
        try:
            text = data.decode("utf-8", "surrogatepass")  # what json.loads decodes these with
            value, end = _SCAN(text, 0)
        except (ValueError, StopIteration, RecursionError):
            pass
        else:
            if end == len(text):
                return value
    return json.loads(data)


def _big_strings(data: bytes | bytearray) -> list[tuple[int, int]]:
    """(start, end) of each large plain string *value* in ``data`` (between its quotes);
    empty when the document has too many strings to be worth it, or looks malformed."""
    spans: list[tuple[int, int]] = []
    pos, n = 0, len(data)
    for _ in range(_TOKENS):
        start = data.find(b'"', pos)
        if start < 0:
            return spans
        end = start + 1
        while True:  # the closing quote: the first one not escaped by an odd run of backslashes
            end = data.find(b'"', end)
            if end < 0:
                return []
            back = end - 1
            while data[back] == 0x5C:
                back -= 1
            if (end - 1 - back) % 2 == 0:
                break
            end += 1
        pos = end + 1
        if end - start - 1 < BIG:
            continue
        after = pos
        while after < n and data[after] in _WS:
            after += 1
        if after < n and data[after] == 0x3A:  # ":" - a key, not a value
            continue
        if _plain(data, start + 1, end):
            spans.append((start + 1, end))
    return []


def _plain(data: bytes | bytearray, start: int, end: int) -> bool:
    view = memoryview(data)
    for at in range(start, end, CHUNK):
        chunk = view[at : min(end, at + CHUNK)].tobytes()
        if len(chunk.translate(None, _NOT_PLAIN)) != len(chunk):
            return False
    return True


def _fill(value: Any, marker: str, strings: list[str]) -> Any:
    """Put the large strings back where :func:`loads` left their markers."""
    if isinstance(value, str):
        if value.startswith(marker):
            return strings[int(value[len(marker) :])]
        return value
    if isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, str | list | dict):
                value[i] = _fill(item, marker, strings)
        return value
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, str | list | dict):
                value[key] = _fill(item, marker, strings)
        return value
    return value
