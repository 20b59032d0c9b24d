"""Lua scripts kept as ``.lua`` files beside the engine that runs them (the Redis engines
of the queue and of the stream), read once with :mod:`importlib.resources`, so they are
part of the installed package (``pyproject.toml``'s package-data ships them).

A line ``--! include _NAME.lua`` is replaced by that file of the same folder (a shared
prelude of functions): Redis runs each script on its own, so what scripts share is
written once and copied in here, never at the server.
"""

from __future__ import annotations

import functools
import re
from importlib.resources import files

__all__ = ["lua_scripts"]

_INCLUDE = re.compile(r"^--! include (\S+\.lua)[ \t]*$", re.M)


@functools.cache
def lua_scripts(package: str, folder: str) -> dict[str, str]:
    """Every script of ``package``'s ``folder`` by name (its file name without ``.lua``),
    the ``--! include`` lines filled in; a file whose name begins with ``_`` (a prelude) is
    only included, not a script."""
    where = files(package).joinpath(folder)
    texts = {
        p.name.removesuffix(".lua"): p.read_text("utf-8") for p in where.iterdir() if p.name.endswith(".lua")
    }
    if not texts:
        raise FileNotFoundError(f"no .lua files in {package}/{folder}: the installation is incomplete")

    def expand(text: str, seen: tuple[str, ...]) -> str:
        def one(m: re.Match[str]) -> str:
            name = m.group(1).removesuffix(".lua")
            if name in seen or name not in texts:
                raise ValueError(f"{package}/{folder}: cannot include {m.group(1)!r} (missing or a cycle)")
            return expand(texts[name], (*seen, name))

        return _INCLUDE.sub(one, text)

    return {name: expand(text, (name,)) for name, text in texts.items() if not name.startswith("_")}
