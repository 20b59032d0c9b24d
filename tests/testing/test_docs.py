"""docs/testing.md's pytest examples are fragments (a test file cannot run as a script):
here they run with pytester, beside the ``shop.py`` block they import, as a user would."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_doc_snippets import Snippet, collect
from tests.testing._inner import run

DOC = Path(__file__).resolve().parents[2] / "docs" / "testing.md"


def _blocks() -> list[Snippet]:
    return [s for s in collect() if s.path == DOC and s.language == "python"]


def _starting(line: str) -> Snippet:
    (block,) = [s for s in _blocks() if s.code.startswith(line)]
    return block


def test_the_shop_tests_pass(pytester: pytest.Pytester) -> None:
    app, tests = _starting("# shop.py\n"), _starting("# test_shop.py\n")
    assert app.fragment is None  # the app module runs as a snippet too
    assert tests.fragment is not None
    assert "test_docs.py" in tests.fragment
    pytester.makepyfile(shop=app.code, test_shop=tests.code)
    run(pytester).assert_outcomes(passed=6)
    assert not (pytester.path / ".foundry").exists()


def test_the_inline_app_example_passes(pytester: pytest.Pytester) -> None:
    block = _starting("def test_double(foundry_app):")
    pytester.makepyfile(test_inline=block.code)
    run(pytester).assert_outcomes(passed=1)


def test_every_fragment_of_the_page_is_run_here() -> None:
    fragments = [s for s in _blocks() if s.fragment is not None]
    assert {s.code.splitlines()[0] for s in fragments} == {"# test_shop.py", "def test_double(foundry_app):"}
