"""``Handle[T]`` and ``WorkUnit[P, R]`` as a type checker sees them: mypy checks
``handles.py`` and must reveal, on each ``reveal_type`` line, the type written in its
comment, and report on each ``# error:`` line that error code — and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SAMPLE = HERE / "handles.py"


def _expected() -> tuple[dict[int, str], dict[int, str]]:
    reveals: dict[int, str] = {}
    errors: dict[int, str] = {}
    for number, line in enumerate(SAMPLE.read_text().splitlines(), start=1):
        code, _, comment = line.partition("  # ")
        if "reveal_type(" in code:
            reveals[number] = comment.strip()
        elif comment.startswith("error: "):
            errors[number] = comment.removeprefix("error: ").strip()
    return reveals, errors


def test_mypy_infers_each_units_handle_and_result_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mypy import api

    monkeypatch.setenv("MYPYPATH", str(ROOT / "src"))  # this tree's foundry, not an installed one
    monkeypatch.chdir(tmp_path)  # no project config: only the flags below
    out, err, _ = api.run(
        [
            "--strict",
            "--follow-imports=silent",
            "--no-error-summary",
            "--show-error-codes",
            "--hide-error-context",
            "--no-pretty",
            f"--cache-dir={tmp_path / 'cache'}",
            str(SAMPLE),
        ]
    )
    assert not err, err
    reveals, errors = _expected()
    assert len(reveals) >= 8
    assert len(errors) >= 4
    seen_reveals: dict[int, str] = {}
    seen_errors: dict[int, list[str]] = {}
    unexpected: list[str] = []
    for line in out.splitlines():
        match = re.match(r".*handles\.py:(\d+): (\w+): (.*)$", line)
        if match is None:
            continue
        number, kind, text = int(match[1]), match[2], match[3]
        revealed = re.match(r'Revealed type is "(.*)"', text)
        if kind == "note" and revealed:
            seen_reveals[number] = revealed[1]
        elif kind == "error" and number in errors:
            seen_errors.setdefault(number, []).append(text)
        elif kind == "error":
            unexpected.append(line)
    assert not unexpected, "\n".join(unexpected)
    for number, expected in reveals.items():
        got = seen_reveals.get(number, "<nothing revealed>").replace("builtins.", "")  # (older mypy)
        assert got == expected, f"line {number}: mypy revealed {got}, the comment says {expected}"
    for number, code in errors.items():
        texts = seen_errors.get(number, [])
        assert any(text.endswith(f"[{code}]") for text in texts), (
            f"line {number}: wanted [{code}], got {texts}"
        )
