from __future__ import annotations

import pytest

from foundry.errors import LabInputError
from foundry.lab.stats import estimate, quantile, t_quantile


@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [(0.975, 9, 2.262157162798205), (0.995, 4, 4.604094871349992), (0.975, 1, 12.706204736174694)],
)
def test_t_quantile_matches_tables(p: float, df: int, expected: float) -> None:
    assert t_quantile(p, df) == pytest.approx(expected, rel=1e-9)
    assert t_quantile(1 - p, df) == pytest.approx(-expected, rel=1e-9)


def test_estimate_interval() -> None:
    e = estimate([1.0, 2.0, 3.0, 4.0], 0.95)
    assert e.mean == 2.5
    assert e.half_width == pytest.approx(3.182446305284263 * (1.6666666666666667 / 4) ** 0.5)
    assert e.contains(2.5)
    assert not e.contains(10.0)


def test_estimate_rejects_bad_confidence_and_empty_input() -> None:
    with pytest.raises(LabInputError, match="confidence"):
        estimate([1.0, 2.0], 1.5)
    with pytest.raises(LabInputError, match="replications"):
        estimate([])


def test_quantile_nearest_rank() -> None:
    data = sorted(float(i) for i in range(1, 101))
    assert quantile(data, 0.99) == 99.0
    assert quantile(data, 0.5) == 50.0
    assert quantile([], 0.5) == 0.0
