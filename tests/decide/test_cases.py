"""The worked cases of docs/decisions.md: each decided as the table says, and the table
in the doc is exactly what the cases render (so the two cannot drift)."""

from __future__ import annotations

import pytest

from .cases import CASES, DOC, Case, decided, doc_section, render


def test_there_are_at_least_forty_cases() -> None:
    assert len(CASES) >= 40
    assert len({c.workload for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.workload for c in CASES])
def test_each_case_decides_as_the_table_says(case: Case) -> None:
    d = decided(case)
    assert d.model == case.model
    assert f"{d.delivery_decided_by} / {d.decided_by}" == case.decided_by
    assert d.load.concurrency == case.concurrency
    assert sorted(w.code for w in d.warnings) == sorted(case.warnings)
    # every decision shows its arithmetic and answers the duration question
    assert d.load.lines
    assert any(a.id == "duration" for a in d.questions)


def test_the_doc_table_is_the_rendered_cases() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert doc_section(text) == render(), (
        "docs/decisions.md's worked cases differ from tests/decide/cases.py: run "
        "`PYTHONPATH=src python -m tests.decide.cases --write`"
    )
