"""Seed 000's five systems (``examples/five_systems.py``): five delivery models in one
app's plan, and each one's behaviour when run for real."""

from __future__ import annotations

from pathlib import Path

from foundry.cli._target import plan_rows
from foundry.examples import five_systems


def test_the_plan_shows_five_delivery_models() -> None:
    rows = plan_rows([five_systems.app])
    delivery = {unit: main.delivery for _, unit, main, _ in rows}
    assert delivery == {
        "deploy_config": "queue",
        "signaling": "stream",
        "sign_document": "pool",
        "provision": "workflow",
        "save_file": "direct",
    }


def test_each_system_runs_on_its_model(tmp_path: Path) -> None:
    report = five_systems.run(tmp_path).by_name()
    assert report["deploy_config"].checks["attempts"] == [1, 0]  # the flaky deploy was retried once
    signaling = report["signaling"].checks
    assert signaling["logged"] == signaling["analysed"] == signaling["events"]
    assert set(signaling["lag"].values()) == {0}
    pool = report["sign_document"].checks
    assert pool["died"]
    assert pool["signed"] == 8
    assert pool["retried"] >= 1  # the idempotent request went to another worker
    provision = report["provision"].checks
    assert provision["failed"]
    assert provision["undone"] == ["detach_ip", "delete_vm"]  # networking, then compute
    assert report["save_file"].checks["exists"]
    assert report["save_file"].model == "direct/sequential"
