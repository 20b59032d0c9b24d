"""Sizes from measurements: CSV and metrics snapshots in, pool size / permits / intake out."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from foundry.errors import LabInputError
from foundry.lab import queueing as q
from foundry.lab.fit import load_csv, load_snapshot, recommend


@pytest.fixture
def times_csv(tmp_path: Path) -> Path:
    rng = random.Random(3)
    path = tmp_path / "times.csv"
    lines = ["duration"] + [f"{rng.expovariate(1 / 50):.3f}ms" for _ in range(400)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_csv_with_header_and_units(times_csv: Path) -> None:
    m = load_csv(times_csv)
    assert m.count == 400
    assert m.service.kind == "empirical"
    assert m.service.mean == pytest.approx(0.050, rel=0.15)
    assert m.service.cv == pytest.approx(1.0, abs=0.2)


def test_recommendation_meets_the_target_analytically_and_in_simulation(times_csv: Path) -> None:
    fit = recommend(load_csv(times_csv), target=0.070, rate=120.0, customers=3_000, replications=3)
    m = fit.measured.service
    assert fit.analytic_w <= 0.070
    smaller = q.allen_cunneen(fit.workers - 1, m.mean, 120.0, 1.0, m.cv)
    assert smaller is None or smaller.w > 0.070 or 120.0 * m.mean / (fit.workers - 1) > 0.85
    assert fit.sim_w - fit.sim_w_hw <= 0.070
    assert fit.permits == fit.workers
    assert fit.intake_bound >= 0


def test_permits_are_capped_at_the_downstream_knee(times_csv: Path) -> None:
    fit = recommend(
        load_csv(times_csv),
        target=0.1,
        rate=400.0,
        downstream_capacity=300.0,
        customers=2_000,
        replications=2,
    )
    assert fit.knee is not None
    assert fit.permits <= fit.knee < fit.workers
    assert any("downstream saturates" in n for n in fit.notes)


def test_percentile_target_is_refused_when_the_work_itself_is_too_slow(times_csv: Path) -> None:
    fit = recommend(
        load_csv(times_csv), target=0.1, rate=50.0, percentile=99, customers=2_000, replications=2
    )
    assert any("service time alone" in n for n in fit.notes)


def test_metrics_snapshot(tmp_path: Path) -> None:
    snapshot = {
        "metrics": {
            "foundry_unit_duration_seconds": [
                {
                    "labels": {"unit": "sign"},
                    "count": 1000,
                    "sum": 40.0,
                    "p50": 0.035,
                    "p99": 0.120,
                    "max": 0.2,
                }
            ],
            "foundry_unit_completed_total": [{"labels": {"unit": "sign"}, "value": 1000, "rate": 90.0}],
        }
    }
    path = tmp_path / "m.json"
    path.write_text(json.dumps(snapshot))
    m = load_snapshot(path, unit="sign")
    assert m.service.mean == pytest.approx(0.040)
    assert m.rate == 90.0
    assert "log-normal" in m.cv_note
    fit = recommend(m, target=0.1, customers=2_000, replications=2)
    assert fit.rate == 90.0
    assert fit.workers >= 4


def test_snapshot_without_the_unit_names_what_is_there() -> None:
    snap = {"foundry_unit_duration_seconds": [{"labels": {"unit": "a"}, "count": 1, "sum": 1.0}]}
    with pytest.raises(LabInputError, match="units there: a"):
        load_snapshot(snap, unit="b")


def test_missing_rate_and_bad_csv(tmp_path: Path, times_csv: Path) -> None:
    with pytest.raises(LabInputError, match="rate"):
        recommend(load_csv(times_csv), target=0.1)
    bad = tmp_path / "bad.csv"
    bad.write_text("0.1\n-0.2\n")
    with pytest.raises(LabInputError, match="duration"):
        load_csv(bad)
    with pytest.raises(LabInputError, match="cannot be read"):
        load_csv(tmp_path / "missing.csv")
