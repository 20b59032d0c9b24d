"""The CSV import example (``examples/csv_import.py``) at a reduced size: the decisions
and the totals, never the speed-up."""

from __future__ import annotations

from pathlib import Path

from foundry.examples import csv_import


def test_the_small_file_is_sequential_by_size_and_the_large_one_parallel_with_the_same_totals(
    tmp_path: Path,
) -> None:
    report = csv_import.run(80_000, rounds=1, workdir=tmp_path)
    # 40 lines: sequential, decided by size, and the parallel unit falls back and says why
    assert (report.small_decision, report.small_decided_by) == ("direct/sequential", "size")
    assert "too small for any coordination to pay" in report.small_why
    assert report.small_runtime_plan == "fell back to sequential: 39 items < threshold 64"
    # the large one: parallel, really split over workers, the same totals as the loop
    assert report.large_decision == "direct/parallel"
    assert report.parallel_plan.startswith("parallel:")
    assert report.workers >= 1
    assert report.same_totals
    assert report.totals["rows"] == 80_000
    assert report.totals["rejected"] == 80_000 // 500  # the generator's malformed e-mails
    assert report.ideal >= 1
    assert not list(tmp_path.iterdir())  # the generated file is removed


def test_the_kernel_rejects_malformed_rows_and_counts_cents_exactly() -> None:
    block = "\n".join(
        [
            "A-10001,acme,DE,EUR,10.05,2026-03-02T08:00:00,b@acme.example",
            "A-10002,acme,DE,EUR,0.95,2026-03-02T08:00:00,b@acme.example",
            "A-10003,acme,XX,EUR,1.00,2026-03-02T08:00:00,b@acme.example",  # unknown country
            "A-10004,acme,DE,EUR,1.0,2026-03-02T08:00:00,b@acme.example",  # one decimal
            "A-10005,acme,DE,EUR,1.00,not-a-time,b@acme.example",
            "too,few,fields",
        ]
    )
    totals = csv_import.import_block(block)
    assert totals == {"rows": 6, "rejected": 4, "by_currency": {"EUR": [2, 1100]}}
