"""Every command Foundry tells a person to run is one the ``foundry`` parser accepts.

A hint is a ``foundry …`` command in backticks, or after a label and a colon ("Inspect:
foundry workflows --journal URL show ID"). It either names a command (``foundry pool
serve``: read its help) or is a whole command line, placeholders and all, that parses.
Checked twice: on every message string in the source, and on what the demo and the
commands print."""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import io
import json
import re
import shlex
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import foundry
from foundry.backends.queue import open_queue_backend
from foundry.backends.queue.base import NewJob
from foundry.cli import COMMANDS, build_parser

CLI = Callable[..., tuple[int, str, str]]
_NAME = "|".join(COMMANDS)
TICKED = re.compile(rf"`foundry ((?:{_NAME})\b[^`]*)`")
LABELLED = re.compile(rf"(?:\w|\))[:·] +foundry ((?:{_NAME})\b(?: [^\s`·;,()\[\]]+)*)")
_SHELL = {">", ">>", "<", "|", "&&", ";"}


def hints(text: str) -> list[str]:
    """The ``foundry …`` commands ``text`` tells a person to run (without ``foundry``)."""
    return [m.group(1).strip() for rx in (TICKED, LABELLED) for m in rx.finditer(text)]


@functools.cache
def _parser() -> argparse.ArgumentParser:
    return build_parser()  # parse_args leaves a parser as it was: one serves every hint


def _names_a_command(parser: argparse.ArgumentParser, argv: list[str]) -> bool:
    for token in argv:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not actions or token not in actions[0].choices:
            return False
        parser = actions[0].choices[token]
    return True


def refused(hint: str) -> str | None:
    """Why the parser refuses ``hint``, or ``None`` when it is a command (or names one)."""
    argv = shlex.split(hint)
    for i, token in enumerate(argv):
        if token in _SHELL:  # `foundry metrics --json > m.json`: the shell's part is not ours
            argv = argv[:i]
            break
    if argv:
        argv[-1] = argv[-1].rstrip(".,:")
    parser = _parser()
    if _names_a_command(parser, argv):
        return None
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as exc:
        return f"exit {exc.code}: {said.getvalue().strip().splitlines()[-1:]}"
    return None


def test_the_checker_tells_a_command_from_a_broken_one() -> None:
    # The demo's "Inspect" line was refused before shared options went on both levels
    assert refused("workflows --journal sqlite:///j.db show provision-web-2") is None
    assert refused("pool serve") is None  # names a command
    assert refused("metrics --json > m.json") is None
    assert refused("jobs show") is None  # names the action; its help says what it takes
    assert refused("jobs shw ID") is not None
    assert refused("workflows list/show") is not None
    assert refused("plan --markdown") is not None
    assert hints("Inspect: foundry workflows --journal X show ID · more") == ["workflows --journal X show ID"]
    assert hints("Fix: check the id with `foundry jobs list`") == ["jobs list"]
    assert hints("foundry worker app: 2 threads on sqlite") == []  # a status line, not a hint


def _printed_strings(path: Path) -> Iterator[tuple[int, str]]:
    """The string literals of a module that reach a person (docstrings left out), an
    f-string's fields replaced by a placeholder."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        documented = isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        if documented and node.body and isinstance(node.body[0], ast.Expr):
            skip.add(id(node.body[0].value))
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value
        elif isinstance(node, ast.JoinedStr):
            parts = [v.value if isinstance(v, ast.Constant) else "PLACEHOLDER" for v in node.values]
            yield node.lineno, "".join(str(p) for p in parts)


def test_every_hint_in_the_source_parses() -> None:
    source = Path(foundry.__file__).parent
    found, bad = 0, []
    for path in sorted(source.rglob("*.py")):
        for line, text in _printed_strings(path):
            for hint in hints(text):
                found += 1
                why = refused(hint)
                if why:
                    bad.append(f"{path.relative_to(source)}:{line}: foundry {hint}  ({why})")
    assert found > 20, "the scan found too few hints: the patterns are wrong"
    assert bad == []


@pytest.fixture
def dead_letter(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    backend = open_queue_backend(url, home=tmp_path)
    try:
        backend.enqueue(NewJob(id="deadbeef0001", queue="hints", unit="work", payload=b"[]"))
        (claimed,) = backend.claim("hints", "w", lease=30, limit=1, timeout=5)
        error = json.dumps({"type": "ValueError", "message": "bad row", "args": ["bad row"]}).encode()
        assert backend.fail(claimed.id, claimed.token, error, dead_reason="bad input")
    finally:
        backend.close()
    return url


def test_every_hint_the_commands_print_parses(
    cli: CLI, dead_letter: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from foundry.demos import SECTIONS

    monkeypatch.setenv("COLUMNS", "1000")  # no hint wrapped across lines
    monkeypatch.setenv("FOUNDRY_HOME", str(tmp_path / "demo"))  # the demo sets it; restored after
    # The demo sections that print hints (all of them, should those be renamed)
    sections = [name for name, _ in SECTIONS if name in ("workflow", "queue")] or [n for n, _ in SECTIONS]
    demo = ["demo", "--home", str(tmp_path / "demo")] + [arg for name in sections for arg in ("--only", name)]
    started = time.monotonic()
    outputs = [
        cli(*demo),
        cli("plan", "foundry.examples.seeds"),
        cli("jobs", "dead", "--url", dead_letter),
        cli("jobs", "show", "deadbeef0001", "--url", dead_letter),
        cli("jobs", "show", "nosuchjob", "--url", dead_letter),
        cli("workflows", "show", "nosuchflow", "--journal", f"sqlite:///{tmp_path / 'demo' / 'journal.db'}"),
    ]
    assert time.monotonic() - started < 120
    printed = [hint for _, out, err in outputs for hint in hints(out + err)]
    assert any(h.startswith("workflows --journal") for h in printed), printed  # the demo's Inspect line
    assert any(h.startswith("jobs requeue") for h in printed), printed
    assert [(h, refused(h)) for h in printed if refused(h)] == []
