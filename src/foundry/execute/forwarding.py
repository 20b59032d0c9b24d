"""Wrappers that take exactly the wrapped function's parameters, so calling them costs
one plain Python frame and no ``*args`` / ``**kwargs`` packing.

A generic wrapper ``def w(*args, **kwargs): return fn(*args, **kwargs)`` pays, on every
call, for a tuple, a dict (empty or not) and an unpacking call: on CPython 3.11 that is
about 60 ns, more than everything else the sequential model does per call. The
wrappers here are compiled from the function's own signature (the technique of
``dataclasses`` and ``attrs``): ``def step(a, b=<default>, *, c): ... fn(a, b, c=c)``,
with the body given by the caller as a template. A call with the wrong arguments fails
in the wrapper with the same ``TypeError`` the function would raise (same name, same
parameters), before any count is taken.

The source is built only from parameter *names*, which are checked to be identifiers and
not keywords; defaults are passed as objects, never written as text. A signature that
cannot be read (a C builtin) or that uses a name the template needs falls back to the
generic ``*args, **kwargs`` form, which behaves the same, only slower.
"""

from __future__ import annotations

import inspect
import itertools
import keyword
import linecache
import textwrap
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["GENERIC", "compile_wrapper", "forwarding"]

GENERIC = ("*args, **kwargs", "*args, **kwargs")
"""``(parameters, call arguments)`` of the wrapper that takes anything."""

_PREFIX = "_fwd_"  # every name a template uses starts with it, or is in ``reserved``
_numbers = itertools.count(1)


def forwarding(
    fn: Callable[..., Any], reserved: frozenset[str] = frozenset()
) -> tuple[str, str, dict[str, Any]]:
    """``(parameters, call arguments, defaults)`` that make a wrapper take exactly ``fn``'s
    parameters: ``"a, b=_fwd_d1, *, c"``, ``"a, b, c=c"`` and ``{"_fwd_d1": <b's default>}``.
    :data:`GENERIC` (and no defaults) when the signature cannot be read, or one of its
    names starts with ``_fwd_`` or is in ``reserved`` (a global the template uses)."""
    try:
        signature = inspect.signature(fn, follow_wrapped=False)
    except (TypeError, ValueError):
        return (*GENERIC, {})
    params: list[str] = []
    args: list[str] = []
    defaults: dict[str, Any] = {}
    star_written = False
    kinds = inspect.Parameter
    parameters = list(signature.parameters.values())
    for index, param in enumerate(parameters):
        name = param.name
        if not name.isidentifier() or keyword.iskeyword(name) or name.startswith(_PREFIX) or name in reserved:
            return (*GENERIC, {})
        text = name
        if param.default is not param.empty:
            slot = f"{_PREFIX}d{index}"
            defaults[slot] = param.default
            text = f"{name}={slot}"
        if param.kind is kinds.VAR_POSITIONAL:
            params.append(f"*{name}")
            args.append(f"*{name}")
            star_written = True
        elif param.kind is kinds.VAR_KEYWORD:
            params.append(f"**{name}")
            args.append(f"**{name}")
        elif param.kind is kinds.KEYWORD_ONLY:
            if not star_written:
                params.append("*")
                star_written = True
            params.append(text)
            args.append(f"{name}={name}")
        else:
            params.append(text)
            args.append(name)
            last_positional_only = param.kind is kinds.POSITIONAL_ONLY and (
                index + 1 == len(parameters) or parameters[index + 1].kind is not kinds.POSITIONAL_ONLY
            )
            if last_positional_only:
                params.append("/")
    return ", ".join(params), ", ".join(args), defaults


def compile_wrapper(
    template: str,
    *,
    name: str,
    fn: Callable[..., Any],
    free: Mapping[str, Any],
    reserved: frozenset[str] = frozenset(),
    label: str,
) -> Callable[..., Any]:
    """Compile ``template`` — the source of ``def _fwd_wrapper({params}):`` whose body
    calls ``_fwd_fn({args})`` — for ``fn``'s signature, and return that function, named
    ``name``.

    ``free`` are the names the body reads (each must start with ``_fwd_``): they become
    the function's closure — cells, which are read fast and written with ``nonlocal``
    without touching any dict (a write to a global would throw away the interpreter's
    cached lookups of every global the function reads). ``label`` names it in tracebacks
    (its source is registered with :mod:`linecache`, so a traceback shows the line)."""
    for free_name in free:
        if not (free_name.isidentifier() and free_name.startswith(_PREFIX)):
            raise ValueError(
                f"compile_wrapper: free name {free_name!r} must be an identifier starting {_PREFIX!r}"
            )
    params, args, defaults = forwarding(fn, reserved)
    body = textwrap.indent(template.format(params=params, args=args), "    ")
    source = f"def _fwd_make({', '.join(free)}):\n{body}\n    return _fwd_wrapper\n"
    filename = f"<foundry {label} #{next(_numbers)}>"
    namespace: dict[str, Any] = {"__builtins__": __builtins__, **defaults}
    exec(compile(source, filename, "exec"), namespace)  # the names in it were checked above
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    wrapper: Callable[..., Any] = namespace["_fwd_make"](**free)
    qualname = getattr(fn, "__qualname__", name)
    wrapper.__code__ = wrapper.__code__.replace(co_name=name, co_qualname=qualname)  # tracebacks name fn
    wrapper.__name__ = name
    wrapper.__qualname__ = qualname
    return wrapper
