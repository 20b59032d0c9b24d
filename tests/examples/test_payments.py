"""The payments example (``examples/payments.py``) at a reduced size: a real uvicorn
service, real aiohttp upstreams and a load generator in its own process. Asserts what the
watchdog says and what Foundry decided and moved, never latency."""

from __future__ import annotations

from pathlib import Path

from foundry.examples import payments


def test_inline_signing_is_named_by_the_watchdog_and_moved_off_the_loop_when_adaptive(tmp_path: Path) -> None:
    report = payments.run(("inline", "pool", "adaptive"), rate=20, seconds=2.5, workdir=tmp_path)
    by = {v.variant: v for v in report.variants}
    assert report.signatures >= 1
    for v in report.variants:
        assert v.sent > 0  # the load ran (how fast it was served is for the docs, not asserted)
        assert len(v.cpu_per_core) >= 1
    # Inline: the watchdog names the signing frame, the phase, and the reclassification
    inline = by["inline"]
    assert inline.sign_model == "direct/async"
    assert "payments.py:" in inline.watchdog  # the frame of the example's code that held the loop
    assert "Phase 'sign' of unit 'handle_payment'" in inline.watchdog
    assert inline.proposal == "direct/bounded_pool"  # cryptography releases the GIL: threads use cores
    # The declared reclassification runs it on a bounded pool from the start
    assert by["pool"].sign_model == "direct/bounded_pool"
    # adaptive=True: moved at run time, once, to the model the watchdog proposed
    adaptive = by["adaptive"]
    assert adaptive.sign_model == "direct/bounded_pool"
    assert [m.split(":")[0] for m in adaptive.moves] == ["handle_payment.sign"]
    # The seed's schedule from the measured step breaks the 100 ms budget while healthy
    assert any("✕" in row["note"] for row in report.schedule)
