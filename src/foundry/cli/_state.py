"""Which store a command reads, said once on stderr: every command that reads state
prints one line naming the store (its URL masked by :func:`~foundry.config.safe_url`)
and the state directory with where it came from, so two processes that disagree about
where state lives show it at once. stdout stays the command's output (``--json``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from foundry.config import Settings, load_settings, resolve_home, safe_url

__all__ = ["MIN_PREFIX", "announce", "full_id", "shared_options", "store"]

MIN_PREFIX = 6
"""The fewest characters of an id that ``show``/``cancel``/``requeue`` take for the whole:
fewer would name several jobs of any busy store (hex ids: 16.7 M values at six)."""

Option = tuple[tuple[str, ...], dict[str, Any]]


def shared_options(group: argparse.ArgumentParser, *options: Option) -> argparse.ArgumentParser:
    """Options a command group shares with its actions, accepted before the action and
    after it: ``foundry workflows --journal URL show ID`` and ``foundry workflows show ID
    --journal URL`` are one command. Adds ``options`` (``(flags, add_argument keywords)``)
    to ``group`` with their defaults, and returns a parent parser for the actions with the
    same options defaulting to ``SUPPRESS``: an action not given one keeps the group's
    value instead of resetting it (given at both places, the action's wins)."""
    action = argparse.ArgumentParser(add_help=False)
    for flags, kwargs in options:
        group.add_argument(*flags, **kwargs)
        action.add_argument(*flags, **{**kwargs, "default": argparse.SUPPRESS})
    return action


def announce(command: str, text: str) -> None:
    """One line on stderr: ``foundry COMMAND: TEXT`` (TEXT already masked)."""
    print(f"foundry {command}: {text}", file=sys.stderr, flush=True)


def store(
    command: str,
    kind: str,
    given: str | None,
    flag: str = "--url",
    *,
    settings: Settings | None = None,
    must_exist: bool = True,
) -> tuple[str, Path]:
    """(the URL of the ``kind`` store to open, the state directory), from ``--url`` or
    ``settings`` (an app's; default: the resolved settings); says which on stderr. The
    commands that read or change state need it to exist already, so an embedded store that
    is not there is an error naming the file, never a new empty database left behind in
    the working directory (``must_exist=False``: the caller reads a missing store as empty,
    creating nothing)."""
    if given:
        home = settings.home if settings is not None else resolve_home()
        announce(command, f"{kind} {safe_url(given)} (from the command line; home {home})")
        url = given
        fix = f"check {flag} (sqlite:///rel.db is relative to the working directory; sqlite:////abs.db)"
    else:
        settings = settings if settings is not None else load_settings()
        announce(command, settings.describe(kind))
        url, home = getattr(settings, kind), settings.home
        fix = (
            f"run it from the project's directory, or name the store: FOUNDRY_HOME, FOUNDRY_{kind.upper()}, "
            f"foundry.toml or {flag}"
        )
    if must_exist and url.lower().startswith("sqlite://"):
        from foundry.config import sqlite_path

        path = Path(sqlite_path(url) or ".").absolute()
        if not path.is_file():
            from foundry.cli._target import Problem

            raise Problem(f"no {kind} store at {path}: nothing has been written there yet. Fix: {fix}")
    return url, home


def full_id(backend: Any, given: str, what: str) -> str:
    """The id ``given`` names in ``backend``: itself when an id is exactly that (or it is
    shorter than :data:`MIN_PREFIX`, or the engine cannot look up prefixes), else the one
    id that begins with it. Several: an error listing them (``what``: ``"job"``)."""
    finder = getattr(backend, "ids_starting", None)
    if len(given) < MIN_PREFIX or finder is None:
        return given
    ids: list[str] = finder(given, limit=11)
    if given in ids or not ids:
        return given
    if len(ids) == 1:
        return ids[0]
    from foundry.cli._target import Problem

    count = f"{len(ids)}" if len(ids) <= 10 else "more than 10"
    raise Problem(
        f"{count} {what}s have an id beginning {given!r}: {', '.join(ids[:10])}. Fix: give more of the id"
    )
