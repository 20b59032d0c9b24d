"""The converters of :mod:`foundry.typed`: for each annotation, how a value is checked
and written as JSON data (``dump``), and how stored data is rebuilt from it (``load``).

Each type this module knows has one converter; :func:`compile_annotation` turns an
annotation (``list[Order] | None``) into a tree of them, once. Nothing here knows about
units or their signatures (that is :class:`foundry.typed.Payloads`): only about types
and their wire form, which is self-describing (``{"$type": NAME, "value": ...}``) but
never chooses what is built — the annotation does.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import enum
import inspect
import math
import sys
import types
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = ["ANY", "TAG", "Bad", "Conv", "Mismatch", "compile_annotation", "resolved_hints", "short"]

TAG = "$type"
_MAX_DEPTH = 64


class Mismatch(Exception):
    """A value that does not fit its annotation (raised at dump)."""

    def __init__(self, where: str, expected: str, value: Any, fix: str = "") -> None:
        super().__init__(where)
        self.where, self.expected, self.value, self.fix = where, expected, value, fix
        self.declared = expected  # the parameter's whole annotation (set where it is known)


class Bad(Exception):
    """Stored data that does not fit its annotation (raised at load)."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(where)
        self.where, self.reason = where, reason


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _shown(data: Any) -> str:
    return f"{type(data).__name__} {short(data)}"


def _type_name(cls: Any) -> str:
    return getattr(cls, "__qualname__", None) or repr(cls)


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# -- converters -------------------------------------------------------------------------
# Each converter turns a Python value into JSON data (dump) and back (load); ``where``
# is the path inside the value ("order.lines[2].price") for the error's message.


class Conv:
    """The converter of ``Any`` (and of what this module does not know): JSON data in,
    the same out, nothing checked."""

    name = "Any"

    def dump(self, value: Any, where: str) -> Any:
        return value

    def load(self, data: Any, where: str) -> Any:
        return data

    def accepts(self, value: Any) -> bool:
        return True

    def tags(self) -> frozenset[str]:
        """The ``$type`` tags this converter reads (a union picks its branch by them)."""
        return frozenset()


ANY = Conv()


class _Scalar(Conv):
    """``str``, ``int``, ``float``, ``bool``, ``None``: JSON data already (checked)."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.name = "None" if cls is type(None) else cls.__name__

    def accepts(self, value: Any) -> bool:
        cls = self.cls
        if cls is float:
            return isinstance(value, int | float) and (not isinstance(value, float) or math.isfinite(value))
        if cls is int:
            return isinstance(value, int)  # (bool too: a type checker takes True for an int)
        return isinstance(value, cls)

    def dump(self, value: Any, where: str) -> Any:
        if not self.accepts(value):
            raise Mismatch(where, self.name, value)
        return value

    def load(self, data: Any, where: str) -> Any:
        if not self.accepts(data):
            raise Bad(where, f"the unit declares {self.name}, the record holds {_shown(data)}")
        return data


class _Tagged(Conv):
    """A built-in type written as ``{"$type": tag, "value": text}``."""

    def __init__(
        self, cls: type, tag: str, dump: Callable[[Any], Any], load: Callable[[Any], Any], check: type
    ) -> None:
        self.cls, self.tag, self.name = cls, tag, cls.__name__
        self._dump, self._load, self._check = dump, load, check

    def accepts(self, value: Any) -> bool:
        if self.cls is dt.date:  # a datetime is a date subclass, stored as a datetime
            return type(value) is dt.date or (
                isinstance(value, dt.date) and not isinstance(value, dt.datetime)
            )
        return isinstance(value, self.cls) and not (self.cls is int and isinstance(value, bool))

    def dump(self, value: Any, where: str) -> Any:
        if not self.accepts(value):
            fix = "pass value.date()" if self.cls is dt.date and isinstance(value, dt.datetime) else ""
            raise Mismatch(where, self.name, value, fix)
        return {TAG: self.tag, "value": self._dump(value)}

    def load(self, data: Any, where: str) -> Any:
        text = _tag_value(data, self.tag, self.name, where)
        if not isinstance(text, self._check):
            raise Bad(where, f"a {self.tag} record holds {_shown(text)}, not a {self._check.__name__}")
        try:
            return self._load(text)
        except (ValueError, TypeError, ArithmeticError, InvalidOperation) as exc:
            raise Bad(where, f"{short(text)} is not a {self.name} ({exc})") from None

    def tags(self) -> frozenset[str]:
        return frozenset({self.tag})


def _tag_value(data: Any, tag: str, name: str, where: str) -> Any:
    if not (isinstance(data, dict) and TAG in data):
        raise Bad(where, f"the unit declares {name}, the record holds {_shown(data)}")
    got = data[TAG]
    if got != tag:
        raise Bad(
            where,
            f"the record's {TAG} is {short(got)}, and the unit declares {name} there (tag {tag!r}); "
            "a record never chooses the type it is decoded as",
        )
    extra = set(data) - {TAG, "value", "class"}
    if extra or "value" not in data:
        raise Bad(where, f"a {tag} record has keys {sorted(map(str, data))}, not {TAG!r} and 'value'")
    return data["value"]


def _load_decimal(text: str) -> Decimal:
    if len(text) > 4_000:
        raise ValueError("longer than 4000 characters")
    return Decimal(text)


def _load_bytes(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


_TAGGED: dict[type, _Tagged] = {
    cls: _Tagged(cls, tag, dump, load, str)
    for cls, tag, dump, load in (
        (dt.datetime, "datetime", dt.datetime.isoformat, dt.datetime.fromisoformat),
        (dt.date, "date", dt.date.isoformat, dt.date.fromisoformat),
        (dt.time, "time", dt.time.isoformat, dt.time.fromisoformat),
        (uuid.UUID, "uuid", str, uuid.UUID),
        (Decimal, "decimal", str, _load_decimal),
        (bytes, "bytes", lambda b: base64.b64encode(b).decode("ascii"), _load_bytes),
    )
}


def _dump_delta(value: dt.timedelta) -> list[int]:
    return [value.days, value.seconds, value.microseconds]


def _load_delta(parts: list[Any]) -> dt.timedelta:
    if len(parts) != 3 or not all(isinstance(p, int) and not isinstance(p, bool) for p in parts):
        raise ValueError("not [days, seconds, microseconds]")
    return dt.timedelta(days=parts[0], seconds=parts[1], microseconds=parts[2])


_TAGGED[dt.timedelta] = _Tagged(dt.timedelta, "timedelta", _dump_delta, _load_delta, list)


class _Enum(Conv):
    """An enum, stored as its value (and rebuilt as the declared enum's member)."""

    def __init__(self, cls: type[enum.Enum]) -> None:
        self.cls, self.name = cls, cls.__qualname__

    def accepts(self, value: Any) -> bool:
        return isinstance(value, self.cls)

    def dump(self, value: Any, where: str) -> Any:
        if not isinstance(value, self.cls):
            raise Mismatch(where, self.name, value, f"pass a member of {self.name}")
        return value.value

    def load(self, data: Any, where: str) -> Any:
        if isinstance(data, dict | list):
            raise Bad(where, f"the unit declares the enum {self.name}, the record holds {_shown(data)}")
        try:
            return self.cls(data)
        except ValueError:
            raise Bad(where, f"{short(data)} is not a value of {self.name}") from None


class _Literal(Conv):
    def __init__(self, values: tuple[Any, ...]) -> None:
        self.values = values
        self.name = f"Literal[{', '.join(map(repr, values))}]"

    def accepts(self, value: Any) -> bool:
        return any(value == v and type(value) is type(v) for v in self.values)

    def dump(self, value: Any, where: str) -> Any:
        if not self.accepts(value):
            raise Mismatch(where, self.name, value)
        return value.value if isinstance(value, enum.Enum) else value

    def load(self, data: Any, where: str) -> Any:
        for v in self.values:
            raw = v.value if isinstance(v, enum.Enum) else v
            if data == raw and type(data) is type(raw):
                return v
        raise Bad(where, f"{short(data)} is not one of {self.name}")


class _List(Conv):
    """``list[X]``, ``Sequence[X]``, ``set[X]``, ``frozenset[X]``, ``tuple[X, ...]``."""

    def __init__(self, kind: type, item: Conv, name: str) -> None:
        self.kind, self.item, self.name = kind, item, name

    def accepts(self, value: Any) -> bool:
        if self.kind is list:
            return (
                isinstance(value, list | tuple)
                if self.name.startswith("Sequence")
                else isinstance(value, list)
            )
        return isinstance(value, self.kind)

    def dump(self, value: Any, where: str) -> Any:
        if not self.accepts(value):
            raise Mismatch(where, self.name, value)
        item = self.item
        return [item.dump(v, f"{where}[{i}]") for i, v in enumerate(value)]

    def load(self, data: Any, where: str) -> Any:
        if not isinstance(data, list):
            raise Bad(where, f"the unit declares {self.name}, the record holds {_shown(data)}")
        items = [self.item.load(v, f"{where}[{i}]") for i, v in enumerate(data)]
        if self.kind is list:
            return items
        try:
            return self.kind(items)
        except TypeError as exc:
            raise Bad(where, f"cannot make a {self.kind.__name__} of it ({exc})") from None


class _Tuple(Conv):
    """``tuple[X, Y]``: a fixed number of items, each its own type."""

    def __init__(self, items: list[Conv]) -> None:
        self.items = items
        self.name = f"tuple[{', '.join(c.name for c in items)}]"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, tuple) and len(value) == len(self.items)

    def dump(self, value: Any, where: str) -> Any:
        if not self.accepts(value):
            raise Mismatch(where, self.name, value)
        return [c.dump(v, f"{where}[{i}]") for i, (c, v) in enumerate(zip(self.items, value, strict=True))]

    def load(self, data: Any, where: str) -> Any:
        if not isinstance(data, list) or len(data) != len(self.items):
            raise Bad(where, f"the unit declares {self.name}, the record holds {_shown(data)}")
        return tuple(
            c.load(v, f"{where}[{i}]") for i, (c, v) in enumerate(zip(self.items, data, strict=True))
        )


class _Dict(Conv):
    """``dict[str, V]`` (JSON object keys are strings)."""

    def __init__(self, value: Conv, name: str) -> None:
        self.value, self.name = value, name

    def accepts(self, value: Any) -> bool:
        return isinstance(value, Mapping)

    def dump(self, value: Any, where: str) -> Any:
        if not isinstance(value, Mapping):
            raise Mismatch(where, self.name, value)
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise Mismatch(f"{where} key {k!r}", "str", k, "JSON object keys are strings")
            out[k] = self.value.dump(v, f"{where}[{k!r}]")
        return out

    def load(self, data: Any, where: str) -> Any:
        if not isinstance(data, dict):
            raise Bad(where, f"the unit declares {self.name}, the record holds {_shown(data)}")
        return {k: self.value.load(v, f"{where}[{k!r}]") for k, v in data.items()}


class _Union(Conv):
    """``X | Y | None``: the first branch that takes the value; a tagged record goes to
    the branch that reads its tag (and only there)."""

    def __init__(self, branches: list[Conv]) -> None:
        self.branches = branches
        self.name = " | ".join(b.name for b in branches)

    def accepts(self, value: Any) -> bool:
        return any(b.accepts(value) for b in self.branches)

    def dump(self, value: Any, where: str) -> Any:
        for b in self.branches:
            if b.accepts(value):
                return b.dump(value, where)
        raise Mismatch(where, self.name, value)

    def load(self, data: Any, where: str) -> Any:
        if isinstance(data, dict) and TAG in data:
            for b in self.branches:
                if data[TAG] in b.tags() and (not isinstance(b, _Model) or data.get("class") == b.path):
                    return b.load(data, where)
            for b in self.branches:
                if type(b) in (_Dict, Conv):
                    return b.load(data, where)  # a dict or Any branch takes it as a plain dict
            raise Bad(
                where,
                f"the record's {TAG} is {short(data[TAG])} (class {short(data.get('class'))}), and the "
                f"unit declares {self.name} there; a record never chooses the type it is decoded as",
            )
        for b in self.branches:
            if isinstance(b, _Tagged | _Model):
                continue
            try:
                return b.load(data, where)
            except Bad:
                continue
        raise Bad(where, f"the unit declares {self.name}, the record holds {_shown(data)}")

    def tags(self) -> frozenset[str]:
        return frozenset().union(*(b.tags() for b in self.branches))


class _Model(Conv):
    """A dataclass, pydantic model or msgspec struct: ``{"$type": "model", "class":
    "pkg.mod.Order", "value": {field: data}}``, rebuilt only as the declared class."""

    tag = "model"

    def __init__(self, cls: type, kind: str) -> None:
        self.cls, self.kind = cls, kind
        self.name = cls.__qualname__
        self.path = _class_path(cls)
        self._fields: dict[str, Conv] | None = None  # dataclasses: compiled on first use (recursion)

    def tags(self) -> frozenset[str]:
        return frozenset({self.tag})

    def accepts(self, value: Any) -> bool:
        return isinstance(value, self.cls)

    def fields(self) -> dict[str, Conv]:
        if self._fields is None:
            hints = resolved_hints(self.cls)
            self._fields = {
                f.name: compile_annotation(hints.get(f.name, Any))
                for f in dataclasses.fields(self.cls)
                if f.init
            }  # (a field with init=False is the class's to compute, not the record's to give)
        return self._fields

    def dump(self, value: Any, where: str) -> Any:
        if not self.accepts(value):
            raise Mismatch(where, self.name, value, f"pass {self.name}(...)")
        if self.kind in ("pydantic", "msgspec"):
            try:
                body: Any = (
                    value.model_dump(mode="json")
                    if self.kind == "pydantic"
                    else sys.modules["msgspec"].to_builtins(value)
                )
            except Exception as exc:  # a field the library cannot serialize
                detail = f"make its fields serializable ({type(exc).__name__}: {str(exc)[:200]})"
                raise Mismatch(where, self.name, value, detail) from None
        else:
            body = {
                name: conv.dump(getattr(value, name), f"{where}.{name}")
                for name, conv in self.fields().items()
            }
        return {TAG: self.tag, "class": self.path, "value": body}

    def load(self, data: Any, where: str) -> Any:
        body = _tag_value(data, self.tag, self.name, where)
        if data.get("class") != self.path:
            raise Bad(
                where,
                f"the record holds a model of class {short(data.get('class'))}, and the unit declares "
                f"{self.path} there; a model is rebuilt only as the class the unit declares",
            )
        if not isinstance(body, dict):
            raise Bad(where, f"a {self.name} record's value is {_shown(body)}, not an object")
        try:
            if self.kind == "pydantic":
                return self.cls.model_validate(body)  # type: ignore[attr-defined]
            if self.kind == "msgspec":
                return sys.modules["msgspec"].convert(body, self.cls)
            fields = self.fields()
            unknown = sorted(set(body) - set(fields))
            if unknown:
                raise Bad(where, f"{self.name} has no field {unknown[0]!r}")
            return self.cls(**{k: fields[k].load(v, f"{where}.{k}") for k, v in body.items()})
        except (Bad, RecursionError):
            raise
        except Exception as exc:
            raise Bad(
                where, f"it is not a valid {self.name} ({type(exc).__name__}: {str(exc)[:300]})"
            ) from None


# -- compiling annotations ------------------------------------------------------------------


def resolved_hints(owner: Any) -> dict[str, Any]:
    """``owner``'s resolved annotations; one that does not resolve (a forward reference
    to a name its module does not define) is left out: that position is ``Any``."""
    try:
        return typing.get_type_hints(owner)
    except Exception:
        pass
    module = sys.modules.get(getattr(owner, "__module__", "") or "")
    namespace = getattr(owner, "__globals__", None) or (vars(module) if module is not None else {})
    hints: dict[str, Any] = {}
    for name, ann in dict(getattr(owner, "__annotations__", {}) or {}).items():
        try:  # (the unit's own source text, as get_type_hints evaluates it; never a record's)
            hints[name] = eval(ann, namespace) if isinstance(ann, str) else ann
        except Exception:
            continue
    return hints


def _model_kind(cls: type) -> str | None:
    if dataclasses.is_dataclass(cls):
        return "dataclass"
    pydantic = sys.modules.get("pydantic")  # never imported here: a declared model imported it
    if pydantic is not None and isinstance(cls, type) and issubclass(cls, pydantic.BaseModel):
        return "pydantic"
    msgspec = sys.modules.get("msgspec")
    if msgspec is not None and isinstance(cls, type) and issubclass(cls, msgspec.Struct):
        return "msgspec"
    return None


_MODELS: dict[type, _Model] = {}


def compile_annotation(ann: Any, depth: int = 0) -> Conv:
    """The converter of one annotation; anything this module does not know is Any."""
    if depth > _MAX_DEPTH or ann is Any or ann is object or ann is inspect.Parameter.empty:
        return ANY
    if ann is None or ann is type(None):
        return _Scalar(type(None))
    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if origin is typing.Annotated:
        return compile_annotation(args[0], depth + 1)
    if origin is typing.Union or origin is types.UnionType:
        return _Union([compile_annotation(a, depth + 1) for a in args])
    if origin is typing.Literal:
        return _Literal(args)
    if origin in (list, set, frozenset, Sequence) or (origin is tuple and len(args) == 2 and args[1] is ...):
        item = compile_annotation(args[0], depth + 1) if args else ANY
        kind = {set: set, frozenset: frozenset, tuple: tuple}.get(origin, list)
        name = f"{getattr(origin, '__name__', 'list')}[{item.name}]"
        return _List(kind, item, name)
    if origin is tuple:
        if args == ((),):
            return _Tuple([])
        return _Tuple([compile_annotation(a, depth + 1) for a in args])
    if origin in (dict, Mapping):
        if args and args[0] not in (str, Any):
            return ANY  # JSON object keys are strings: other keys are not converted
        value = compile_annotation(args[1], depth + 1) if args else ANY
        return _Dict(value, f"dict[str, {value.name}]")
    if origin is not None or not isinstance(ann, type):
        return ANY  # TypeVar, Callable, a string that did not resolve...
    if ann in (str, int, float, bool):
        return _Scalar(ann)
    if ann in _TAGGED:
        return _TAGGED[ann]
    if issubclass(ann, enum.Enum):
        return _Enum(ann)
    if ann in (list, set, frozenset):
        return _List(ann, ANY, ann.__name__)
    if ann is tuple:
        return _List(tuple, ANY, "tuple")
    if ann is dict:
        return _Dict(ANY, "dict")
    model_kind = _model_kind(ann)
    if model_kind is not None:
        model = _MODELS.get(ann)
        if model is None:
            model = _MODELS[ann] = _Model(ann, model_kind)
        return model
    return ANY
