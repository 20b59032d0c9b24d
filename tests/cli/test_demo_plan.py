from __future__ import annotations

import io

from rich.console import Console

from foundry.demos import plan


def test_demo_plan_section_prints_the_candidates_and_systems() -> None:
    buffer = io.StringIO()
    plan.run(Console(file=buffer, width=160))
    plan.run(Console(file=io.StringIO(), width=160))  # twice: it must not re-declare into a shared app
    text = buffer.getvalue()
    for unit in ("import_csv", "handle_payment", "transcode", "deploy_config", "signaling", "sign_document",
                 "provision", "save_file"):  # fmt: skip
        assert unit in text
    assert "CPU work on the event loop" in text
