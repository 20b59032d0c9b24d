"""Numbers as people read them in answers, notes and the load arithmetic."""

from __future__ import annotations

__all__ = ["fmt_count", "fmt_rate", "fmt_seconds"]


def fmt_seconds(seconds: float) -> str:
    if 0 < seconds < 1e-6:
        return f"{seconds * 1e9:.0f}ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f}µs"
    if seconds < 1:
        return f"{seconds * 1e3:.4g}ms"
    if seconds < 120:
        return f"{seconds:.4g}s"
    if seconds < 7200:
        return f"{seconds / 60:.4g}m"
    return f"{seconds / 3600:.4g}h"


def fmt_rate(per_second: float) -> str:
    if per_second >= 10_000:
        return f"{per_second:,.0f}/s"
    if per_second >= 1:
        return f"{per_second:.4g}/s"
    if per_second * 3600 >= 1:
        return f"{per_second * 3600:.4g}/h"
    return f"{per_second * 86400:.4g}/day"


def fmt_count(value: float) -> str:
    """``10.5``, ``1.8``, ``0.056``, ``300``: three significant digits, no exponent for
    the sizes that occur here."""
    if value >= 1000:
        return f"{value:,.0f}"
    if 0 < value < 0.001:
        return "<0.001"
    return f"{value:.3g}"
