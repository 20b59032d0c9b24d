"""The loop-starvation schedule of seed 003's payments handler."""

from __future__ import annotations

import pytest

from foundry.errors import LabInputError
from foundry.lab.loop import LoopSettings, schedule

# step, event loop, health check, ready, loopBusyMs, healthWaitMs (seed 003, rows 1-8)
SEED_ROWS = [
    (1, "accept 6 payment requests; all 6 ready", "", 6, 0, None),
    (2, "run request 1: sign body", "", 5, 35, None),
    (3, "", "health check arrives, marked ready", 6, 35, 0),
    (4, "run request 2: sign body", "", 5, 70, 35),
    (5, "run request 3: sign body", "", 4, 105, 70),
    (6, "run request 4: sign body", "", 3, 140, 105),
    (7, "run request 5: sign body", "", 2, 175, 140),
    (8, "", "orchestrator liveness probe times out; SIGTERM sent", 2, 175, 140),
]


def test_seed_schedule_rows_and_budget() -> None:
    s = schedule(LoopSettings(cpu=0.035, rate=300.0, budget=0.100))
    got = [
        (
            r.step,
            r.loop,
            r.health,
            r.ready,
            round(r.loop_busy * 1000),
            None if r.health_wait is None else round(r.health_wait * 1000),
        )
        for r in s.rows[:8]
    ]
    assert got == SEED_ROWS
    assert s.rows[5].state == "ready=3 loopBusyMs=140 healthWaitMs=105"
    assert s.rows[5].note.startswith("✕ The health check has been ready for 105 ms without running.")
    assert s.budget_broken_step == 6
    assert s.budget_broken_at == pytest.approx(0.135)
    assert s.sigterm_step == 8
    assert s.utilisation == pytest.approx(10.5)
    assert any("grow without bound" in line for line in s.summary)


def test_fifo_runs_request_6_before_the_health_check() -> None:
    s = schedule()
    last = s.rows[-1]
    assert s.rows[-2].loop == "run request 6: sign body"
    assert last.loop.startswith("run health check — replies 200 OK")
    assert round(last.loop_busy * 1000) == 213
    assert s.health_waited == pytest.approx(0.175)


def test_light_load_keeps_the_budget() -> None:
    s = schedule(LoopSettings(cpu=0.005, rate=50.0, budget=0.100))
    assert s.budget_broken_step is None
    assert s.sigterm_step is None
    assert s.health_waited is not None
    assert s.health_waited <= 0.100
    assert any("Pollaczek–Khinchine" in line for line in s.summary)


def test_steady_arrivals_queue_ahead_and_behind() -> None:
    s = schedule(LoopSettings(arrivals="steady"))
    assert any(r.payments for r in s.rows)
    assert s.budget_broken_step is not None


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"cpu": 0.0}, "cpu"),
        ({"rate": -1.0}, "rate"),
        ({"budget": -0.1}, "budget"),
        ({"arrivals": "x"}, "arrivals"),
    ],
)
def test_bad_inputs(change: dict[str, object], field: str) -> None:
    with pytest.raises(LabInputError) as info:
        schedule(LoopSettings(**change))  # type: ignore[arg-type]
    assert info.value.field == field
