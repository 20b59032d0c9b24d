"""The app bench/dashboard.py drains: one durable no-op unit."""

from __future__ import annotations

from foundry import Foundry

app = Foundry("bench-dashboard")


@app.work(durable=True, est="1ms", background=True)
def noop(i: int) -> int:
    return i
