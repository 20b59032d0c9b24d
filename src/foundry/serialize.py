"""Payload codecs and error records: what durable models write to a store, and how
what they read back is trusted.

Durable models (queue, stream, workflow) store arguments and results with a codec;
the process model carries them over a pipe. ``encode`` raises
:class:`~foundry.errors.SubmitError` naming the unit and the offending value, at
submit time, so nothing is accepted that cannot be carried.

A store is hostile input (``docs/security.md``): anyone holding its credentials can
rewrite a record. So what is *read back* never chooses how it is decoded:

* a payload or result is decoded with the codec the unit **declared**
  (:func:`declared_codec`); a record that names another codec is refused with
  :class:`~foundry.errors.RecordError` — pickle is never loaded for a JSON unit;
* an error record is rebuilt as its original exception type only when an
  :class:`ErrorTypes` allow-list admits that type (:func:`decode_error`); no module is
  imported because a record names it, and anything else becomes
  :class:`~foundry.errors.RemoteError` carrying the type name, message and traceback.
"""

from __future__ import annotations

import builtins
import inspect
import math
import pickle
import sys
import traceback
from collections.abc import Iterable
from typing import Any, Literal, TypeVar

from foundry.errors import DeclarationError, FoundryError, RecordError, RemoteError, SubmitError
from foundry.payload import dumps as _json_dumps
from foundry.payload import loads as _json_loads
from foundry.typed import Payloads

__all__ = [
    "Codec",
    "ErrorTypes",
    "declared_codec",
    "decode_call",
    "decode_error",
    "encode_error",
    "get_codec",
]

CodecName = Literal["json", "pickle"]
E = TypeVar("E", bound=type[BaseException])


class Codec:
    """Encode/decode payloads; ``name`` is stored beside each payload."""

    def __init__(self, name: CodecName = "json") -> None:
        if name not in ("json", "pickle"):
            raise SubmitError(f"unknown codec {name!r}. Fix: use 'json' (default) or 'pickle'")
        self.name: CodecName = name

    def encode(self, value: Any, *, unit: str = "?", what: object = "arguments") -> bytes:
        if self.name == "pickle":
            try:
                return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                raise SubmitError(
                    f"unit {unit!r}: {what} cannot be pickled ({type(exc).__name__}: {exc}). "
                    "Fix: pass plain data (ids, paths, dicts) instead of live objects"
                ) from exc
        try:
            return _json_dumps(value)  # json.dumps(...).encode(), large strings in chunks
        except (TypeError, ValueError, RecursionError) as exc:  # (RecursionError: nested too deep)
            raise SubmitError(
                f"unit {unit!r}: {what} are not JSON-compatible ({exc}). "
                "Fix: pass JSON data (str, int, float, bool, None, list, dict), "
                "or declare the unit with codec='pickle' if you trust every producer"
            ) from exc

    def decode(self, data: bytes) -> Any:
        if self.name == "pickle":
            return pickle.loads(data)
        return _json_loads(data)  # json.loads(data), large strings straight from the bytes

    def __repr__(self) -> str:
        return f"<Codec {self.name}>"


_CODECS = {"json": Codec("json"), "pickle": Codec("pickle")}


def get_codec(name: str) -> Codec:
    codec = _CODECS.get(name)
    if codec is None:
        raise SubmitError(f"unknown codec {name!r}. Fix: use 'json' (default) or 'pickle'")
    return codec


def declared_codec(declared: str, stored: object, *, unit: str, what: str) -> Codec:
    """The codec ``unit`` declared, once the codec name a record carries (``stored``)
    agrees with it. A record that names another codec is refused with
    :class:`~foundry.errors.RecordError` naming the unit and both codecs: the stored
    name never chooses the decoder (a record rewritten to ``pickle`` would otherwise
    run code in whoever reads it)."""
    if stored != declared:
        shown = stored if isinstance(stored, str) and len(stored) <= 40 else f"{str(stored)[:40]!r}…"
        danger = " (unpickling bytes from a store runs code)" if stored == "pickle" else ""
        raise RecordError(
            f"unit {unit!r}: {what} is stored with codec {shown!r}, but the unit declares "
            f"codec={declared!r}; it was not decoded{danger}. The record was written by a submitter "
            "with another declaration of the unit, or by someone who can write to the store. Fix: run "
            "the same declaration everywhere (then resubmit), and check who holds the store's "
            "credentials (docs/security.md)"
        )
    return get_codec(declared)


def decode_call(
    payload: bytes,
    stored: object,
    declared: str,
    *,
    unit: str,
    what: str,
    types: Payloads | None = None,
) -> tuple[list[Any], dict[str, Any]]:
    """A stored call ``{"args": [...], "kwargs": {...}}`` (what ``submit`` writes),
    decoded with the ``declared`` codec once the record's codec name (``stored``) agrees,
    then (JSON) rebuilt by the unit's annotations (``types``, :mod:`foundry.typed`).
    Anything else is a :class:`~foundry.errors.RecordError` saying what was wrong."""
    codec = declared_codec(declared, stored, unit=unit, what=what)
    try:
        data = codec.decode(payload)
        args, kwargs = data["args"], data["kwargs"]
        if not isinstance(args, list | tuple) or not isinstance(kwargs, dict):
            raise TypeError(f"args is {type(args).__name__}, kwargs is {type(kwargs).__name__}")
        if not all(isinstance(k, str) for k in kwargs):
            raise TypeError("a keyword argument's name is not a string")
    except Exception as exc:
        size = len(payload) if isinstance(payload, bytes | bytearray) else "?"
        raise RecordError(
            f"unit {unit!r}: {what} are not {codec.name} of the form "
            f'{{"args": [...], "kwargs": {{...}}}} ({size} bytes; {type(exc).__name__}: '
            f"{str(exc)[:300]}); they were written by another program or damaged in the store"
        ) from None
    if types is not None and codec.name == "json":
        return types.load_call(list(args), dict(kwargs), what=what)
    return list(args), dict(kwargs)


# -- error records ---------------------------------------------------------------------

_JSON_SCALARS = (str, int, float, bool, type(None))


def _is_json(value: Any, depth: int = 0) -> bool:
    """``value`` is plain JSON data (what ``json.loads`` gives back), not deeper than 20."""
    if isinstance(value, _JSON_SCALARS):
        return not isinstance(value, float) or math.isfinite(value)
    if depth > 20:
        return False
    if isinstance(value, list | tuple):
        return all(_is_json(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v, depth + 1) for k, v in value.items())
    return False


def _portable_args(error: BaseException) -> list[Any]:
    """The arguments that rebuild ``error`` with its structured fields: those of its
    ``__reduce__`` (``ChildCrashedError(unit, exitcode, signal_name)``) when they are JSON
    data (for Foundry's errors, a value that is not JSON as its ``repr``, so the type and
    the other fields survive), else ``error.args``, else its message."""
    try:
        reduced = error.__reduce__()
        if isinstance(reduced, tuple) and len(reduced) >= 2 and reduced[0] is type(error):
            args = list(reduced[1])
            if _is_json(args):
                return args
            if isinstance(error, FoundryError):
                return [arg if _is_json(arg) else repr(arg) for arg in args]
    except Exception:
        pass
    args = list(error.args)
    return args if _is_json(args) else [str(error)]


def _portable_attrs(error: BaseException) -> dict[str, Any]:
    """Public attributes set on ``error`` beyond its constructor's (JSON data only)."""
    try:
        state = vars(error)
    except TypeError:
        return {}
    return {
        k: v
        for k, v in state.items()
        if isinstance(k, str) and k.isidentifier() and not k.startswith("_") and _is_json(v)
    }


def encode_error(error: BaseException) -> dict[str, Any]:
    """A JSON record of an exception: type path, message, the arguments that rebuild it,
    its public attributes, and the traceback text."""
    cls = type(error)
    record: dict[str, Any] = {
        "type": f"{cls.__module__}.{cls.__qualname__}",
        "message": str(error),
        "args": _portable_args(error),
        "traceback": "".join(traceback.format_exception(error)),
    }
    attrs = _portable_attrs(error)
    if attrs:
        record["attrs"] = attrs
    return record


_BUILTINS = "builtins"
_FOUNDRY = "foundry.errors"


class ErrorTypes:
    """The exception types an error record read back from a store may be rebuilt as.

    Always admitted: Foundry's own errors (:mod:`foundry.errors`, which keep their
    fields: ``ChildCrashedError.exitcode``…) and the ``Exception`` subclasses of
    :mod:`builtins`. A unit adds the exception classes defined in its own module, and
    those it names with ``errors=[...]`` or ``retry_on=(...)``; an app adds those
    registered with :meth:`register` (``app.errors.register(MyError)``), for every unit.

    A record never chooses what is imported: a module is looked in only when it is
    already imported *and* admitted, by its namespace (no module ``__getattr__``, no
    properties), and the class found must carry exactly the record's name (not an
    alias). Anything else is rebuilt as :class:`~foundry.errors.RemoteError`, which
    carries the type's name, the message and the remote traceback text.
    ``BaseException`` types that are not ``Exception`` (``SystemExit``,
    ``KeyboardInterrupt``…) are rebuilt only when registered by type.
    """

    __slots__ = ("_modules", "_parent", "_types")

    def __init__(
        self,
        types: Iterable[type[BaseException]] = (),
        modules: Iterable[str] = (),
        *,
        parent: ErrorTypes | None = None,
    ) -> None:
        self._types: dict[str, type[BaseException]] = {}
        self._modules = frozenset(m for m in modules if m and m not in (_BUILTINS, _FOUNDRY))
        self._parent = parent
        for cls in types:
            self._add(cls, "errors")

    def _add(self, cls: Any, where: str) -> None:
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise DeclarationError(
                where,
                "errors",
                cls,
                "is not an exception type",
                "register exception classes, e.g. app.errors.register(MyError) or errors=[MyError]",
            )
        self._types[f"{cls.__module__}.{cls.__qualname__}"] = cls

    def register(self, *types: E) -> E:
        """Admit ``types`` (exception classes) wherever this allow-list applies. Returns
        the first, so it also works as a class decorator::

            @app.errors.register
            class QuotaExceeded(Exception): ...
        """
        if not types:
            raise DeclarationError(
                "app.errors",
                "register",
                (),
                "was given no exception type",
                "pass the classes, e.g. app.errors.register(MyError, OtherError)",
            )
        for cls in types:
            self._add(cls, "app.errors")
        return types[0]

    def scoped(self, *, types: Iterable[type[BaseException]] = (), modules: Iterable[str] = ()) -> ErrorTypes:
        """This allow-list plus ``types`` and the classes of ``modules`` (one unit's view:
        later registrations on this one still apply to it)."""
        return ErrorTypes(types, modules, parent=self)

    def _chain(self) -> Iterable[ErrorTypes]:
        node: ErrorTypes | None = self
        while node is not None:
            yield node
            node = node._parent

    @property
    def modules(self) -> frozenset[str]:
        """The modules whose exception classes are admitted (besides builtins and Foundry's)."""
        return frozenset().union(*(node._modules for node in self._chain()))

    @property
    def types(self) -> tuple[type[BaseException], ...]:
        """The exception classes admitted by type."""
        return tuple(cls for node in self._chain() for cls in node._types.values())

    def resolve(self, type_path: object) -> type[BaseException] | None:
        """The admitted class a record's ``type`` names, or ``None``."""
        if not isinstance(type_path, str) or not type_path or len(type_path) > 500:
            return None
        for node in self._chain():
            cls = node._types.get(type_path)
            if cls is not None:
                return cls
        module_name, _, name = type_path.rpartition(".")
        if module_name == _BUILTINS:
            found = vars(builtins).get(name)
            ok = isinstance(found, type) and issubclass(found, Exception)
            return found if ok else None
        for module in (_FOUNDRY, *sorted(self.modules, key=len, reverse=True)):
            if type_path.startswith(module + "."):
                cls = _lookup(module, type_path[len(module) + 1 :])
                if cls is None or not issubclass(cls, Exception):
                    return None
                if module == _FOUNDRY and not issubclass(cls, FoundryError):
                    return None
                return cls
        return None

    def __repr__(self) -> str:
        names = sorted(f"{c.__module__}.{c.__qualname__}" for c in self.types)
        return f"<ErrorTypes builtins, foundry.errors, modules={sorted(self.modules)}, types={names}>"


def _lookup(module_name: str, qualname: str) -> type[BaseException] | None:
    """The class at ``module_name.qualname`` if that module is already imported, found
    through namespaces only (``vars``: no module ``__getattr__``, no descriptors run)."""
    obj: Any = sys.modules.get(module_name)
    if obj is None or "<" in qualname:
        return None
    for part in qualname.split("."):
        try:
            namespace = vars(obj)
        except TypeError:
            return None
        obj = namespace.get(part)
        if obj is None:
            return None
    if not (isinstance(obj, type) and issubclass(obj, BaseException)):
        return None
    if obj.__module__ != module_name or obj.__qualname__ != qualname:
        return None  # an alias (``from x import Error``) names another type than the record
    return obj


DEFAULT_ERROR_TYPES = ErrorTypes()


def _text(value: object, limit: int = 1_000_000) -> str:
    text = value if isinstance(value, str) else "" if value is None else repr(value)
    return text if len(text) <= limit else text[:limit] + "… (truncated)"


def _restore(error: BaseException, attrs: object) -> None:
    """Put back the public attributes the record carries that the constructor did not
    set, as plain instance data (never through a property or ``__setattr__``)."""
    if not isinstance(attrs, dict):
        return
    try:
        state = vars(error)
    except TypeError:
        return
    cls = type(error)
    for name, value in attrs.items():
        if not (isinstance(name, str) and name.isidentifier() and not name.startswith("_")):
            continue
        if name in state or not _is_json(value):
            continue
        static = inspect.getattr_static(cls, name, None)
        if static is not None and hasattr(type(static), "__get__"):
            continue  # a method, property or other descriptor of the class: not data
        state[name] = value


def decode_error(record: object, allowed: ErrorTypes | None = None) -> BaseException:
    """Rebuild an error record (:func:`encode_error`'s) as its original exception type
    when ``allowed`` admits it (default: Foundry's errors and builtins' exception types),
    else as :class:`~foundry.errors.RemoteError`. Never raises, never imports a module,
    and runs no code but the admitted class's constructor with the record's JSON
    arguments (a constructor that fails gives ``RemoteError`` too).

    The remote traceback text is attached as a note so it shows when re-raised.
    """
    if not isinstance(record, dict):
        record = {"type": "RemoteError", "message": _text(record, 10_000)}
    policy = allowed if allowed is not None else DEFAULT_ERROR_TYPES
    type_path = _text(record.get("type", "Exception"), 500)
    message = _text(record.get("message", ""))
    tb = _text(record.get("traceback", ""))
    cls = policy.resolve(type_path)
    args: Any = record.get("args", [])
    error: BaseException | None = None
    if cls is not None and isinstance(args, list) and _is_json(args):
        try:
            error = cls(*args)
        except Exception:
            error = None
        if error is not None and type(error) is not cls:
            error = None  # a __new__ that returns something else is not the record's type
    if error is None:
        error = RemoteError(type_path, message, tb)
    else:
        _restore(error, record.get("attrs"))
    if tb:
        try:
            error.add_note(f"--- remote traceback ---\n{tb}")
        except Exception:
            pass
    return error
