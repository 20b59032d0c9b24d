"""What the effects file says ran: exactly-once counts, the most runs at once, and the
most starts in any window (against a token bucket)."""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path

Run = tuple[str, int, str, float, float, int]  # unit, i, key, start, end, pid


def runs(effects: Path, unit: str | None = None) -> list[Run]:
    with sqlite3.connect(effects, timeout=60) as conn:
        sql = "SELECT unit, i, key, start, end, pid FROM runs"
        rows = conn.execute(sql + (" WHERE unit = ?" if unit else ""), (unit,) if unit else ()).fetchall()
    conn.close()
    return [tuple(r) for r in rows]  # type: ignore[misc]


def counts(rows: list[Run]) -> Counter[tuple[str, int]]:
    return Counter((r[0], r[1]) for r in rows)


def most_at_once(rows: list[Run]) -> int:
    """The largest number of runs whose [start, end] intervals overlap at one instant."""
    events = sorted([(r[3], 1) for r in rows] + [(r[4], -1) for r in rows], key=lambda e: (e[0], e[1]))
    now = peak = 0
    for _, step in events:  # at a tie an end comes first: back-to-back runs do not overlap
        now += step
        peak = max(peak, now)
    return peak


def worst_window(starts: list[float], burst: int, rate: float, slack: float) -> tuple[int, float, float]:
    """The window of starts ``[s_i, s_j]`` that comes closest to breaking the bucket's
    bound ``burst + rate × (s_j - s_i + slack)`` (``slack``: the delay from a grant to the
    job's own clock reading): (starts in it, its length, the bound). A bucket that holds
    keeps starts ≤ bound in every window."""
    s = sorted(starts)
    best = (0, 0.0, float("inf"))
    for i in range(len(s)):
        for j in range(i, len(s)):
            n, length = j - i + 1, s[j] - s[i]
            bound = burst + rate * (length + slack)
            if n - bound > best[0] - best[2]:
                best = (n, length, bound)
    return best
