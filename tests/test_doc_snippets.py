"""Every fenced code block in README.md and docs/*.md runs, so a snippet that fails or
hangs breaks the build.

- ``python`` blocks run as a file (``python snippet.py``), ``bash`` and ``console`` blocks
  with ``bash -euo pipefail`` (a ``$ `` prompt is dropped), each in its own temporary
  directory with its own ``FOUNDRY_HOME``, in a subprocess with a timeout
  (:data:`TIMEOUT`); up to :data:`PARALLEL` run at once, all of them up front, and each
  block's test reports its own outcome.
- A block that is not meant to run on its own — a fragment of a larger program, a
  server that runs until stopped, an install — is marked in the Markdown with an HTML
  comment on the line before its fence: ``<!-- fragment: why -->``. Its test is skipped
  with that reason (``pytest -ra`` lists each one). A block in another language (``json``,
  ``text``) is data, not code, and is not collected.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = {"python", "bash", "console"}
TIMEOUT = 90.0  # seconds one snippet may take
PARALLEL = 2
_FENCE = re.compile(r"^```(\w*)\s*$")
_FRAGMENT = re.compile(r"<!--\s*fragment:\s*(.+?)\s*-->")


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int
    language: str
    code: str
    fragment: str | None  # why it does not run on its own, or None

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def collect() -> list[Snippet]:
    found: list[Snippet] = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            match = _FENCE.match(lines[i])
            if match is None or not match.group(1):
                i += 1
                continue
            start, language = i, match.group(1)
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
            before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
            why = _FRAGMENT.search(before)
            if language in RUN:
                found.append(
                    Snippet(path, start + 1, language, "\n".join(lines[start + 1 : end]) + "\n",
                            why.group(1) if why else None)
                )  # fmt: skip
            i = end + 1
    return found


SNIPPETS = collect()


def _run(snippet: Snippet) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="foundry-snippet-") as tmp:
        # this tree's foundry (src/) first, whatever an editable install points at, then the repository
        path = os.pathsep.join((str(ROOT / "src"), str(ROOT)))
        env = {**os.environ, "FOUNDRY_HOME": str(Path(tmp) / ".foundry"), "PYTHONPATH": path}
        env.pop("FOUNDRY_QUEUE", None)
        if snippet.language == "python":
            script = Path(tmp) / "snippet.py"
            script.write_text(snippet.code)
            argv = [sys.executable, str(script)]
        else:
            code = "\n".join(
                line[2:] if line.startswith("$ ") else line for line in snippet.code.splitlines()
            )
            bindir = str(Path(sys.executable).parent)
            env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
            argv = ["bash", "-euo", "pipefail", "-c", code]
        try:
            return subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=TIMEOUT)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
            return subprocess.CompletedProcess(argv, -9, out, f"timed out after {TIMEOUT:.0f} s")


@pytest.fixture(scope="module")
def outcomes() -> dict[str, subprocess.CompletedProcess[str]]:
    runnable = [s for s in SNIPPETS if s.fragment is None]
    with cf.ThreadPoolExecutor(PARALLEL) as pool:
        return dict(zip((s.id for s in runnable), pool.map(_run, runnable), strict=True))


def test_snippets_were_found() -> None:
    assert len(SNIPPETS) > 40
    assert any(s.fragment is None for s in SNIPPETS)


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.id for s in SNIPPETS])
def test_snippet_runs(snippet: Snippet, outcomes: dict[str, subprocess.CompletedProcess[str]]) -> None:
    if snippet.fragment is not None:
        pytest.skip(f"{snippet.id} is a fragment: {snippet.fragment}")
    done = outcomes[snippet.id]
    assert done.returncode == 0, (
        f"{snippet.id} ({snippet.language}) exited {done.returncode}\n--- code\n{snippet.code}"
        f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    )
