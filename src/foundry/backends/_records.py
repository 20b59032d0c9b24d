"""Typed reads of stored records, treating the store as hostile input (every family).

A record read back from a store (a queued job's row or hash, a workflow's journal row,
one of its entries or signals) goes through :class:`Fields`, which either returns a
value of the right type and range or raises :class:`~foundry.errors.MalformedRecordError`
naming the record, the field and the value — never ``ValueError``, ``TypeError`` or
``KeyError`` from deep inside a worker thread. SQLite's columns take any type, Redis
keeps strings, PostgreSQL's typed columns still take any value of their type (a status
Foundry never writes, a number past what its arithmetic allows), and anyone who can
write to the store can write anything.

:class:`Salvage` is the lenient reader for a record already set aside (often *because*
it is malformed), so that its reason can still be seen. Each family's decoders sit
beside its engines (``queue/_records.py``, ``journal/_records.py``); both read through
these two classes, and neither imports the other.
"""

from __future__ import annotations

import math
import re
from enum import Enum
from typing import Any, TypeVar

from foundry.errors import MalformedRecordError

__all__ = ["CODECS", "INT32", "LONG_TEXT", "TEXT_LIMIT", "Fields", "Salvage", "is_utf8"]

CODECS = ("json", "pickle")
INT32 = 2**31 - 1
TEXT_LIMIT = 4096  # the longest text field a decoder accepts by default (names are at most 255)
LONG_TEXT = 1 << 20  # idempotency keys, reasons, step names (Foundry writes no longer ones)
_INT = re.compile(r"-?[0-9]{1,19}")
_INT_BYTES = re.compile(rb"-?[0-9]{1,19}")
_DIGITS = frozenset(b"0123456789")

E = TypeVar("E", bound=Enum)


def is_utf8(text: str) -> bool:
    """``text`` can be written back as UTF-8 (no lone surrogates: a SQLite engine reads
    TEXT that is not UTF-8 as surrogate escapes, so that one row's bytes fail that row)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


class Fields:
    """Typed reads of one record's fields (``record`` names it in errors: its id)."""

    __slots__ = ("raw",)

    def __init__(self, record: Any) -> None:
        self.raw = record

    @property
    def record(self) -> str:
        """How errors name the record (its id when that is a printable string)."""
        raw = self.raw
        if isinstance(raw, bytes):
            try:
                raw = raw.decode()
            except UnicodeDecodeError:
                pass
        return raw if isinstance(raw, str) and raw.isprintable() else repr(raw)

    def bad(self, field: str, value: Any, problem: str) -> MalformedRecordError:
        return MalformedRecordError(self.record, field, value, problem)

    def text(self, field: str, value: Any, *, limit: int = TEXT_LIMIT) -> str:
        """A string of valid UTF-8 (Redis keeps bytes: they must be UTF-8)."""
        if type(value) is str and len(value) <= limit and (value.isascii() or is_utf8(value)):
            return value  # the common cases first: every claim reads a dozen fields
        if type(value) is bytes and len(value) <= limit:
            try:
                return value.decode()
            except UnicodeDecodeError:
                raise self.bad(field, value, "is not UTF-8 text") from None
        if isinstance(value, bytes | bytearray | memoryview):
            try:
                value = bytes(value).decode()
            except UnicodeDecodeError:
                raise self.bad(field, value, "is not UTF-8 text") from None
        if not isinstance(value, str):
            raise self.bad(field, value, f"is a {type(value).__name__}, not text")
        if not is_utf8(value):
            raise self.bad(field, value, "is not UTF-8 text")
        if len(value) > limit:
            raise self.bad(field, value, f"is longer than {limit} characters")
        return value

    def name(self, field: str, value: Any, *, limit: int = 255) -> str:
        """A non-empty printable name of at most ``limit`` characters (ids, units, queues)."""
        text = self.text(field, value, limit=limit)
        if not text or not text.isprintable():
            raise self.bad(field, value, "is not a non-empty printable name")
        return text

    def optional_name(self, field: str, value: Any, *, limit: int = 255) -> str | None:
        return None if value is None else self.name(field, value, limit=limit)

    def optional_text(self, field: str, value: Any, *, limit: int = TEXT_LIMIT) -> str | None:
        """Text, or ``None`` for a missing (or, in Redis, empty) value."""
        if value is None:
            return None
        text = self.text(field, value, limit=limit)
        return text or None

    def choice(self, field: str, value: Any, options: tuple[str, ...]) -> str:
        """One of ``options`` (the words Foundry writes in this field)."""
        if type(value) is str and value in options:
            return value
        text = self.text(field, value, limit=64)
        if text not in options:
            raise self.bad(field, value, f"is not one of {', '.join(map(repr, options))}")
        return text

    def member(self, field: str, value: Any, kind: type[E], what: str) -> E:
        """The member of ``kind`` (a string enum) the value names; ``what`` names the kind."""
        text = self.text(field, value, limit=64)
        try:
            return kind(text)
        except ValueError:
            known = ", ".join(str(m.value) for m in kind)
            raise self.bad(field, value, f"is not {what} ({known})") from None

    def integer(self, field: str, value: Any, *, low: int = 0, high: int = INT32) -> int:
        """An integer in ``[low, high]``: an int, an integral float, or decimal digits."""
        number: int
        if type(value) is int and low <= value <= high:
            return value
        if isinstance(value, bool):
            raise self.bad(field, value, "is a boolean, not an integer")
        if isinstance(value, int):
            number = value
        elif isinstance(value, float):
            if not math.isfinite(value) or not value.is_integer():
                raise self.bad(field, value, "is not an integer")
            number = int(value)
        elif isinstance(value, str | bytes | bytearray):
            if not (_INT.fullmatch(value) if isinstance(value, str) else _INT_BYTES.fullmatch(value)):
                raise self.bad(field, value, "is not an integer")
            number = int(value)
        else:
            raise self.bad(field, value, f"is a {type(value).__name__}, not an integer")
        if not low <= number <= high:
            raise self.bad(field, value, f"is outside {low}..{high}")
        return number

    def optional_integer(self, field: str, value: Any, *, low: int = 0, high: int = INT32) -> int | None:
        return None if value is None else self.integer(field, value, low=low, high=high)

    def flag(self, field: str, value: Any) -> bool:
        """A 0/1 column (what Foundry writes for a boolean)."""
        if type(value) is int and (value == 0 or value == 1):
            return value == 1
        return self.integer(field, value, low=0, high=1) == 1

    def number(self, field: str, value: Any, *, positive: bool = False, infinite: bool = False) -> float:
        """A finite float (an int or float, or its decimal text); ``positive``: above 0;
        ``infinite``: ``+inf`` too (a timer that waits for an event, not a time)."""
        number: float
        if type(value) is float and math.isfinite(value) and (value > 0 or not positive):
            return value
        if type(value) is bytes and 0 < len(value) <= 64 and value[0] in _DIGITS:
            try:  # Redis keeps numbers as their text
                fast = float(value)
            except ValueError:
                pass
            else:
                if math.isfinite(fast) and (fast > 0 or not positive):
                    return fast
        if isinstance(value, bool):
            raise self.bad(field, value, "is a boolean, not a number")
        if isinstance(value, int | float):
            number = float(value)
        elif isinstance(value, str | bytes | bytearray):
            raw = value.decode("ascii", "replace") if not isinstance(value, str) else value
            if len(raw) > 64:
                raise self.bad(field, value, "is not a number")
            try:
                number = float(raw)
            except ValueError:
                raise self.bad(field, value, "is not a number") from None
        else:
            raise self.bad(field, value, f"is a {type(value).__name__}, not a number")
        if infinite and number == math.inf:
            return number
        if not math.isfinite(number):
            raise self.bad(field, value, "is not a finite number")
        if positive and number <= 0:
            raise self.bad(field, value, "is not above 0")
        return number

    def optional_number(
        self, field: str, value: Any, *, positive: bool = False, infinite: bool = False
    ) -> float | None:
        """A number, or ``None`` for a missing (or, in Redis, empty) value."""
        if value is None or value in ("", b""):
            return None
        return self.number(field, value, positive=positive, infinite=infinite)

    def blob(self, field: str, value: Any) -> bytes:
        """Bytes (text a foreign writer stored instead is taken as its UTF-8)."""
        if type(value) is bytes:
            return value
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value)
        if isinstance(value, str):
            try:
                return value.encode()
            except UnicodeEncodeError:
                raise self.bad(field, value, "is not UTF-8 text") from None
        raise self.bad(field, value, f"is a {type(value).__name__}, not bytes")

    def optional_blob(self, field: str, value: Any) -> bytes | None:
        return None if value is None else self.blob(field, value)

    def codec(self, value: Any) -> str:
        if type(value) is str and value in CODECS:
            return value
        if value == b"json" or value == b"pickle":
            return value.decode()  # type: ignore[no-any-return]
        codec = self.text("codec", value, limit=16)
        if codec not in CODECS:
            raise self.bad("codec", value, f"is not a codec Foundry knows ({', '.join(CODECS)})")
        return codec


class Salvage(Fields):
    """Lenient reads for a record already set aside (a dead letter, a failed workflow),
    often *because* it is malformed: each field that cannot be read takes a neutral
    value, so its reader (``foundry jobs show``, ``foundry workflows show``, the
    submitter) sees the record and its reason instead of an error. A decoder reads the
    field that says the record was set aside (its status) strictly, even here."""

    __slots__ = ()

    def name(self, field: str, value: Any, *, limit: int = 255) -> str:
        try:
            return super().name(field, value, limit=limit)
        except MalformedRecordError:
            return "?"

    def optional_name(self, field: str, value: Any, *, limit: int = 255) -> str | None:
        try:
            return super().optional_name(field, value, limit=limit)
        except MalformedRecordError:
            return None

    def optional_text(self, field: str, value: Any, *, limit: int = TEXT_LIMIT) -> str | None:
        try:
            return super().optional_text(field, value, limit=limit)
        except MalformedRecordError:
            return None

    def choice(self, field: str, value: Any, options: tuple[str, ...]) -> str:
        try:
            return super().choice(field, value, options)
        except MalformedRecordError:
            return options[0]

    def integer(self, field: str, value: Any, *, low: int = 0, high: int = INT32) -> int:
        try:
            return super().integer(field, value, low=low, high=high)
        except MalformedRecordError:
            return max(low, 0)

    def optional_integer(self, field: str, value: Any, *, low: int = 0, high: int = INT32) -> int | None:
        try:
            return super().optional_integer(field, value, low=low, high=high)
        except MalformedRecordError:
            return None

    def flag(self, field: str, value: Any) -> bool:
        try:
            return super().flag(field, value)
        except MalformedRecordError:
            return False

    def number(self, field: str, value: Any, *, positive: bool = False, infinite: bool = False) -> float:
        try:
            return super().number(field, value, positive=positive, infinite=infinite)
        except MalformedRecordError:
            return 0.0

    def optional_number(
        self, field: str, value: Any, *, positive: bool = False, infinite: bool = False
    ) -> float | None:
        try:
            return super().optional_number(field, value, positive=positive, infinite=infinite)
        except MalformedRecordError:
            return None

    def blob(self, field: str, value: Any) -> bytes:
        try:
            return super().blob(field, value)
        except MalformedRecordError:
            return b""

    def optional_blob(self, field: str, value: Any) -> bytes | None:
        try:
            return super().optional_blob(field, value)
        except MalformedRecordError:
            return None

    def codec(self, value: Any) -> str:
        try:
            return super().codec(value)
        except MalformedRecordError:
            return "json"
