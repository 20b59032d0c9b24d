"""Typed payloads: a unit's arguments and result as JSON data, by its annotations.

A durable model stores what a unit is given and what it returns. With the JSON codec
that is JSON data; this module lets a unit take and return more than that —
``datetime`` (aware or naive), ``date``, ``time``, ``timedelta``, ``UUID``,
``Decimal``, ``bytes``, enums, dataclasses, pydantic models and msgspec structs, in
lists, tuples, sets, dicts, ``X | None`` and unions — **where its annotations declare
them**::

    @app.work(durable=True)
    def invoice(order: Order, due: date) -> Receipt: ...

:func:`payloads_for` compiles a unit's signature once into converters. At submit,
:meth:`Payloads.dump_call` checks every argument against its parameter's annotation
(a wrong type is a :class:`~foundry.errors.SubmitError` naming the unit, the parameter,
the value and the fix, in the submitting process) and turns it into JSON data; the
worker's :meth:`Payloads.load_call` rebuilds the values, and the result goes the same
way back (:meth:`Payloads.dump_result`, :meth:`Payloads.load_result`).

**The wire format is self-describing, and the store is hostile input.** A value that is
not JSON data is written as ``{"$type": NAME, "value": ...}`` (a model also carries its
``"class"``), so a person reading a record sees what it holds. But a record never
chooses what is built: it is decoded by the annotation *this process* declares for its
position. A tag names one of the built-in types above at most; a model is rebuilt only
as the class the annotation names (the record's ``"class"`` must agree with it, and no
module is ever imported because a record names it). A tag the annotation did not
declare, a model of another class, an unknown field or a value of the wrong shape is a
:class:`~foundry.errors.RecordError` with the reason (a queue dead-letters the job).
Where a parameter is unannotated (or ``Any``, or a type this module does not know),
its value is JSON data and nothing is converted: read back exactly as stored.

Two modules: ``_converters`` knows types (one converter per type, and how an annotation
compiles into a tree of them); this one knows units (a signature's parameters bound to
their converters, and the errors that name the unit, the parameter and the fix).
"""

from __future__ import annotations

import inspect
import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from foundry.errors import RecordError, SubmitError
from foundry.typed._converters import ANY, Bad, Conv, Mismatch, compile_annotation, resolved_hints, short

__all__ = ["Payloads", "payloads_for"]


class Payloads:
    """A unit's parameters and result as converters (see the module docstring)."""

    def __init__(self, unit: str, fn: Callable[..., Any], *, skip_first: bool = False) -> None:
        self.unit = unit
        self._fn = fn
        self._compiled = False
        self.plain = True
        self._skip_first = skip_first

    def _compile(self) -> None:
        if self._compiled:
            return
        fn = self._fn
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            sig = None
        hints = resolved_hints(fn)
        params = list(sig.parameters.values()) if sig is not None else []
        if self._skip_first and params:
            params = params[1:]  # a workflow's context (wf)
        self._sig = sig.replace(parameters=params) if sig is not None else None
        self._positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self._named = {p.name: p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        self._var_args = next((p for p in params if p.kind is p.VAR_POSITIONAL), None)
        self._var_kwargs = next((p for p in params if p.kind is p.VAR_KEYWORD), None)
        self._convs = {p.name: compile_annotation(hints.get(p.name, Any)) for p in params}
        # positional-only calls within these counts fit the signature without binding it
        self._min_args = sum(1 for p in self._positional if p.default is p.empty)
        self._max_args = len(self._positional) if self._var_args is None else sys.maxsize
        if any(p.kind is p.KEYWORD_ONLY and p.default is p.empty for p in params):
            self._min_args = sys.maxsize  # a required keyword: always bind
        self.result = compile_annotation(hints.get("return", Any))
        self.plain = all(c is ANY for c in self._convs.values())  # nothing declared: nothing to do
        self.plain_result = self.result is ANY
        self._compiled = True

    def _conv_of(self, index: int | None, name: str | None) -> tuple[str, Conv]:
        if index is not None:
            if index < len(self._positional):
                p = self._positional[index]
                return p.name, self._convs[p.name]
            if self._var_args is not None:
                return f"*{self._var_args.name}[{index - len(self._positional)}]", self._convs[
                    self._var_args.name
                ]
            return f"argument {index}", ANY
        assert name is not None
        named = self._named.get(name)
        if named is not None:
            return name, self._convs[name]
        if self._var_kwargs is not None:
            return name, self._convs[self._var_kwargs.name]
        return name, ANY

    # -- submit side -------------------------------------------------------------------

    def dump_call(
        self, args: Sequence[Any], kwargs: Mapping[str, Any], *, convert: bool = True
    ) -> tuple[list[Any], dict[str, Any]]:
        """``args`` and ``kwargs`` checked against the unit's parameters and, with
        ``convert``, turned into JSON data. Raises :class:`SubmitError` naming the unit,
        the parameter, the value and the fix."""
        self._compile()
        if self.plain:
            return list(args), dict(kwargs)
        fits = not kwargs and self._min_args <= len(args) <= self._max_args
        if self._sig is not None and not fits:
            try:
                self._sig.bind(*args, **kwargs)
            except TypeError as exc:
                raise SubmitError(
                    f"unit {self.unit!r}: the arguments do not fit its parameters ({self._names()}): {exc}; "
                    "nothing was submitted. Fix: pass the parameters the unit declares"
                ) from None
        try:
            out_args = [self._dump_one(i, None, v, convert) for i, v in enumerate(args)]
            out_kwargs = {k: self._dump_one(None, k, v, convert) for k, v in kwargs.items()}
        except RecursionError:
            raise SubmitError(
                f"unit {self.unit!r}: the arguments are nested too deep (or hold a cycle); nothing was "
                "submitted. Fix: pass flatter data, or a reference to it"
            ) from None
        except Mismatch as exc:
            declared = exc.declared
            inner = f" (expected {exc.expected} there)" if exc.expected != declared else ""
            raise SubmitError(
                f"unit {self.unit!r}: parameter {exc.where} is declared {declared}, and "
                f"was given {type(exc.value).__name__} {short(exc.value)}{inner}; "
                f"nothing was submitted. Fix: {exc.fix or 'pass a value of type ' + exc.expected}, or "
                "change the parameter's annotation"
            ) from None
        return out_args, out_kwargs

    def _names(self) -> str:
        sig = self._sig
        return "" if sig is None else ", ".join(str(p).split(":", 1)[0] for p in sig.parameters.values())

    def _dump_one(self, index: int | None, name: str | None, value: Any, convert: bool) -> Any:
        where, conv = self._conv_of(index, name)
        try:
            data = conv.dump(value, where)
        except Mismatch as exc:
            exc.declared = conv.name
            raise
        return data if convert else value

    def accepts(self, parameter: str, value: Any) -> bool:
        """Whether ``value`` fits what the unit declares for keyword ``parameter``."""
        self._compile()
        return self._conv_of(None, parameter)[1].accepts(value)

    def _load_one(self, index: int | None, name: str | None, data: Any) -> Any:
        where, conv = self._conv_of(index, name)
        return conv.load(data, where)

    def dump_result(self, value: Any, *, what: object = "the result") -> Any:
        """The unit's return value checked against its return annotation, as JSON data.
        Raises :class:`SubmitError` (the job fails, and is not retried). ``what`` names the
        value in that error (any object: it is formatted only when the error is raised)."""
        self._compile()
        if self.plain_result:
            return value
        try:
            return self.result.dump(value, "return")
        except RecursionError:
            raise SubmitError(
                f"unit {self.unit!r}: {what} is nested too deep (or holds a cycle); it was not stored. "
                "Fix: return flatter data, or a reference to it"
            ) from None
        except Mismatch as exc:
            at = "" if exc.where == "return" else f" (at {exc.where})"
            raise SubmitError(
                f"unit {self.unit!r}: {what} is declared {self.result.name}, and the unit returned "
                f"{type(exc.value).__name__} {short(exc.value)}{at}; it was not stored. Fix: return "
                f"{exc.fix or 'a value of type ' + exc.expected}, or change the return annotation"
            ) from None

    # -- store side -------------------------------------------------------------------

    def load_call(
        self, args: list[Any], kwargs: dict[str, Any], *, what: str
    ) -> tuple[list[Any], dict[str, Any]]:
        """Stored arguments (JSON data) rebuilt by the unit's annotations. Raises
        :class:`RecordError` with the reason when they do not fit."""
        self._compile()
        if self.plain:
            return args, kwargs
        try:
            out_args = [self._load_one(i, None, v) for i, v in enumerate(args)]
            out_kwargs = {k: self._load_one(None, k, v) for k, v in kwargs.items()}
        except Bad as exc:
            raise self._refused(what, f"parameter {exc.where}", exc.reason) from None
        except RecursionError:
            raise self._refused(what, "the arguments", "they are nested too deep") from None
        return out_args, out_kwargs

    def load_result(self, data: Any, *, what: object) -> Any:
        """A stored result rebuilt by the unit's return annotation (:class:`RecordError`,
        naming it by ``what``: formatted only then)."""
        self._compile()
        if self.plain_result:
            return data
        try:
            return self.result.load(data, "return")
        except Bad as exc:
            at = "" if exc.where == "return" else f" at {exc.where}"
            raise self._refused(what, f"its return value{at}", exc.reason) from None
        except RecursionError:
            raise self._refused(what, "its return value", "it is nested too deep") from None

    def _refused(self, what: object, where: str, reason: str) -> RecordError:
        if len(where) > 200:
            where = f"{where[:120]}…{where[-60:]}"
        return RecordError(
            f"unit {self.unit!r}: refused {what}: {where}: {reason}. It was written by a submitter with "
            "another declaration of the unit, or by someone who can write to the store. Fix: run the same "
            "declaration everywhere (then resubmit), and check who holds the store's credentials "
            "(docs/security.md)"
        )


_CACHE: weakref.WeakKeyDictionary[Any, Payloads] = weakref.WeakKeyDictionary()
_STRONG: dict[tuple[int, str, bool], Payloads] = {}


def payloads_for(unit: str, fn: Callable[..., Any], *, skip_first: bool = False) -> Payloads:
    """The (cached) :class:`Payloads` of ``fn`` declared as ``unit``. ``skip_first``: the
    first parameter is not an argument (a workflow's ``wf``)."""
    try:
        cached = _CACHE.get(fn)
        if cached is not None and cached.unit == unit and cached._skip_first == skip_first:
            return cached
        made = Payloads(unit, fn, skip_first=skip_first)
        _CACHE[fn] = made
        return made
    except TypeError:  # not weak-referenceable (a builtin, a partial of one)
        key = (id(fn), unit, skip_first)
        found = _STRONG.get(key)
        if found is None:
            found = _STRONG[key] = Payloads(unit, fn, skip_first=skip_first)
        return found
