"""Payload codecs. JSON-compatible by default; pickle only when a unit opts in.

Durable models (queue, stream, workflow) store arguments and results with a codec;
the process model carries them over a pipe. ``encode`` raises
:class:`~foundry.errors.SubmitError` naming the unit and the offending value, at
submit time, so nothing is accepted that cannot be carried.
"""

from __future__ import annotations

import builtins
import importlib
import json
import pickle
import traceback
from typing import Any, Literal

from foundry.errors import RemoteError, SubmitError

__all__ = ["Codec", "decode_error", "encode_error", "get_codec"]

CodecName = Literal["json", "pickle"]


class Codec:
    """Encode/decode payloads; ``name`` is stored beside each payload."""

    def __init__(self, name: CodecName = "json") -> None:
        if name not in ("json", "pickle"):
            raise SubmitError(f"unknown codec {name!r}. Fix: use 'json' (default) or 'pickle'")
        self.name: CodecName = name

    def encode(self, value: Any, *, unit: str = "?", what: str = "arguments") -> bytes:
        if self.name == "pickle":
            try:
                return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                raise SubmitError(
                    f"unit {unit!r}: {what} cannot be pickled ({type(exc).__name__}: {exc}). "
                    "Fix: pass plain data (ids, paths, dicts) instead of live objects"
                ) from exc
        try:
            return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise SubmitError(
                f"unit {unit!r}: {what} are not JSON-compatible ({exc}). "
                "Fix: pass JSON data (str, int, float, bool, None, list, dict), "
                "or declare the unit with codec='pickle' if you trust every producer"
            ) from exc

    def decode(self, data: bytes) -> Any:
        if self.name == "pickle":
            return pickle.loads(data)
        return json.loads(data)


_CODECS = {"json": Codec("json"), "pickle": Codec("pickle")}


def get_codec(name: str) -> Codec:
    codec = _CODECS.get(name)
    if codec is None:
        raise SubmitError(f"unknown codec {name!r}. Fix: use 'json' (default) or 'pickle'")
    return codec


def encode_error(error: BaseException) -> dict[str, Any]:
    """A JSON record of an exception: type path, message, args, traceback text."""
    cls = type(error)
    args: list[Any] = []
    for arg in error.args:
        try:
            json.dumps(arg)
        except (TypeError, ValueError):
            args = [str(error)]
            break
        args.append(arg)
    return {
        "type": f"{cls.__module__}.{cls.__qualname__}",
        "message": str(error),
        "args": args,
        "traceback": "".join(traceback.format_exception(error)),
    }


def decode_error(record: dict[str, Any]) -> BaseException:
    """Rebuild the original exception type when it is importable; else ``RemoteError``.

    The remote traceback text is attached as a note so it shows when re-raised.
    """
    type_path = str(record.get("type", "Exception"))
    module_name, _, qualname = type_path.rpartition(".")
    cls: Any = None
    try:
        if module_name == "builtins":
            cls = getattr(builtins, qualname, None)
        elif module_name:
            cls = importlib.import_module(module_name)
            for part in qualname.split("."):
                cls = getattr(cls, part)
    except Exception:
        cls = None
    error: BaseException
    if isinstance(cls, type) and issubclass(cls, BaseException):
        try:
            error = cls(*record.get("args", []))
        except Exception:
            error = RemoteError(type_path, str(record.get("message", "")), record.get("traceback", ""))
    else:
        error = RemoteError(type_path, str(record.get("message", "")), record.get("traceback", ""))
    tb = record.get("traceback")
    if tb:
        error.add_note(f"--- remote traceback ---\n{tb}")
    return error
