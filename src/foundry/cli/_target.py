"""Shared by plan / explain / profile: load ``MODULE`` or ``FILE.py``, find the apps and
units in it, and turn bad input into one clear line and an exit code (never a traceback).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO, cast

from foundry.errors import FoundryError

__all__ = [
    "Problem",
    "console",
    "find_apps",
    "load_module",
    "plan_rows",
    "reports_problems",
    "resolve",
    "split_target",
]


class Problem(Exception):
    """Bad input to a command: printed as ``foundry CMD: error: MESSAGE`` with ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def reports_problems(command: str) -> Callable[[Callable[[Any], int]], Callable[[Any], int]]:
    """Wrap a command's ``run(args)`` so a :class:`Problem` or a Foundry error prints one line."""

    def wrap(run: Callable[[Any], int]) -> Callable[[Any], int]:
        @functools.wraps(run)
        def wrapper(args: Any) -> int:
            try:
                return run(args)
            except Problem as exc:
                print(f"foundry {command}: error: {exc}", file=sys.stderr)
                return exc.code
            except FoundryError as exc:
                print(f"foundry {command}: error: {exc}", file=sys.stderr)
                return 1
            except BrokenPipeError:
                # The reader went away (`foundry plan ... | head`): stop quietly.
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                return 0

        return wrapper

    return wrap


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def load_module(target: str) -> ModuleType:
    """Import ``target``: a dotted module path, or a path to a ``.py`` file."""
    if not target:
        raise Problem("no module given. Fix: pass a module path (pkg.mod) or a file (app.py)", 2)
    path = Path(target)
    if target.endswith(".py") or path.is_file():
        if not path.is_file():
            raise Problem(f"no such file {target!r}. Fix: check the path, or give a module path instead")
        return _load_file(path.resolve())
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # like `python -m`: modules next to you are importable
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name and (target == exc.name or target.startswith(exc.name + ".")):
            raise Problem(
                f"no module named {target!r}. Fix: check the spelling, run from the project "
                "directory, or pass the file path (app.py)"
            ) from exc
        raise Problem(f"importing {target!r} failed: {_one_line(exc)}. Fix: install what it imports") from exc
    except FoundryError:
        raise
    except Exception as exc:
        raise Problem(
            f"importing {target!r} raised {_one_line(exc)}. Fix: run `python -c 'import {target}'` "
            "to see the traceback"
        ) from exc


def _load_file(path: Path) -> ModuleType:
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    name = f"_foundry_target_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise Problem(f"cannot load {str(path)!r} as Python. Fix: give a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    parent = str(path.parent)
    added = parent not in sys.path
    if added:
        sys.path.insert(0, parent)  # sibling imports work, as with `python app.py`
    try:
        spec.loader.exec_module(module)
    except FoundryError:
        del sys.modules[name]
        raise
    except BaseException as exc:
        del sys.modules[name]
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise Problem(
            f"running {str(path)!r} raised {_one_line(exc)}. Fix: run `python {path}` to see the traceback"
        ) from exc
    finally:
        if added:
            sys.path.remove(parent)
    return module


def find_apps(module: ModuleType) -> list[Any]:
    """Every ``Foundry`` app the module defines or whose units it holds, in definition order."""
    from foundry.app import Foundry

    apps: list[Any] = []
    for value in vars(module).values():
        app = value if isinstance(value, Foundry) else getattr(value, "app", None)
        if isinstance(app, Foundry) and all(app is not seen for seen in apps):
            apps.append(app)
    return apps


def plan_rows(apps: list[Any]) -> list[tuple[str, str, Any, Any]]:
    return [(app.name, name, main, phases) for app in apps for name, main, phases in app.plan()]


def split_target(target: str, what: str) -> tuple[str, str]:
    module, sep, name = target.rpartition(":")
    if not sep or not module or not name:
        raise Problem(f"{target!r} is not MODULE:{what}. Fix: write e.g. foundry.examples.seeds:transcode", 2)
    return module, name


def resolve(target: str, what: str = "NAME") -> tuple[ModuleType, str, Any]:
    """``MODULE:NAME`` -> (module, name, the unit or object it names)."""
    module_name, name = split_target(target, what)
    module = load_module(module_name)
    for app in find_apps(module):
        for group in (app.units, app.workflows, app.streams):
            if name in group:
                return module, name, group[name]
    if hasattr(module, name):
        return module, name, getattr(module, name)
    known = sorted({unit for app in find_apps(module) for unit, _, _ in app.plan()})
    listing = ", ".join(known) if known else "none"
    raise Problem(
        f"no unit or function named {name!r} in {module_name!r} (units: {listing}). Fix: check the name"
    )


class _TrimmedLines:
    """A text stream that writes each line to ``target`` without its trailing spaces:
    rich pads every row of a table to the table's width, which a terminal does not show
    but a file, ``diff`` and ``cat -A`` do."""

    def __init__(self, target: TextIO) -> None:
        self._target = target
        self._tail = ""
        self.encoding: str = getattr(target, "encoding", None) or "utf-8"  # rich picks its box from it

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        *lines, self._tail = (self._tail + text).split("\n")
        if lines:
            self._target.write("".join(line.rstrip(" ") + "\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        if self._tail:  # a line without its end yet (a prompt): kept as it is
            self._target.write(self._tail)
            self._tail = ""
        self._target.flush()


def console(*, width: int = 140) -> Any:
    """The rich console a command prints its output on. A terminal is used the way rich
    finds it (its size, or ``COLUMNS``). A pipe or a file gets ``COLUMNS`` columns when
    that is set (``COLUMNS=80 foundry plan … | less``), else ``width`` rather than rich's
    default 80, no colour, and lines without trailing spaces."""
    from rich.console import Console

    out = Console()
    if out.is_terminal:
        return out
    columns = os.environ.get("COLUMNS", "").strip()
    size = int(columns) if columns.isdigit() and int(columns) > 0 else width
    return Console(file=cast(TextIO, _TrimmedLines(sys.stdout)), width=size)
