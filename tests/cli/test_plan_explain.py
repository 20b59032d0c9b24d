"""`foundry plan` and `foundry explain`: tables, JSON, Markdown, and one-line errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

CLI = Callable[..., tuple[int, str, str]]
SEED_UNITS = [
    "import_csv",
    "handle_payment",
    "transcode",
    "deploy_config",
    "signaling",
    "sign_document",
    "provision",
    "save_file",
]


def test_plan_prints_every_unit_and_phase(cli: CLI) -> None:
    code, out, err = cli("plan", "foundry.examples.seeds")
    assert code == 0, err
    for unit in SEED_UNITS:
        assert unit in out
    assert "bounded_pool" in out  # the signing phase
    assert "first failure mode" in out
    assert "queue" in out
    assert "processes" in out


def test_plan_json_for_scripts(cli: CLI) -> None:
    code, out, _ = cli("plan", "foundry.examples.seeds", "--json")
    assert code == 0
    units = {u["name"]: u for u in json.loads(out)["units"]}
    assert sorted(units) == sorted(SEED_UNITS)
    payment = units["handle_payment"]["phases"]
    assert [(p["phase"], p["model"]) for p in payment] == [
        ("main", "direct/async"),
        ("sign", "direct/bounded_pool"),
    ]
    assert payment[0]["execution_bill"]["fails"]
    assert payment[0]["watch"]


def test_plan_markdown_writes_a_decision_record(cli: CLI, tmp_path: Path) -> None:
    target = tmp_path / "DECISIONS.md"
    code, out, _ = cli("plan", "foundry.examples.seeds", "--markdown", str(target))
    assert code == 0
    assert str(target) in out
    text = target.read_text()
    assert text.startswith("# Execution decisions")
    for unit in SEED_UNITS:
        assert f"### `{unit}`" in text
    assert "### `handle_payment` · phase `sign`" in text
    assert "**Rejected:**" in text
    # deterministic: the same declarations give the same record
    cli("plan", "foundry.examples.seeds", "--markdown", str(tmp_path / "again.md"))
    assert (tmp_path / "again.md").read_text() == text


def test_plan_a_file_and_its_warnings(cli: CLI, app_file: Path) -> None:
    code, out, _ = cli("plan", str(app_file))
    assert code == 0
    assert "handler" in out
    assert "direct-for-durable-work" in out
    code, out, _ = cli("plan", str(app_file), "--markdown", "-")
    assert code == 0
    assert "Direct execution for durable work" in out


@pytest.mark.parametrize(
    ("argv", "code", "needle"),
    [
        (["plan", "no_such_module_xyz"], 1, "no module named 'no_such_module_xyz'"),
        (["plan", "missing/app.py"], 1, "no such file"),
        (["plan", "json"], 1, "no Foundry app in 'json'"),
        (["explain", "foundry.examples.seeds:nope"], 1, "no unit or function named 'nope'"),
        (["explain", "foundry.examples.seeds"], 2, "is not MODULE:NAME"),
        (["explain", "foundry.examples.seeds:sign_body"], 1, "is not a declared unit"),
        (["explain", "no_such_module_xyz:unit"], 1, "no module named"),
    ],
)
def test_bad_input_is_one_line_and_an_exit_code(cli: CLI, argv: list[str], code: int, needle: str) -> None:
    got, _, err = cli(*argv)
    assert got == code
    assert needle in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert "Fix:" in err


def test_a_module_that_raises_on_import_is_reported(cli: CLI, tmp_path: Path) -> None:
    bad = tmp_path / "broken.py"
    bad.write_text("x = 1 / 0\n")
    code, _, err = cli("plan", str(bad))
    assert code == 1
    assert "ZeroDivisionError" in err
    assert "Traceback" not in err
    declared_badly = tmp_path / "declared.py"
    declared_badly.write_text(
        "from foundry import Foundry\napp = Foundry()\n@app.work(est='-3s')\ndef f(): ...\n"
    )
    code, _, err = cli("plan", str(declared_badly))
    assert code == 1
    assert "est='-3s' is negative" in err


def test_explain_shows_the_whole_bill(cli: CLI) -> None:
    code, out, _ = cli("explain", "foundry.examples.seeds:transcode")
    assert code == 0
    for needle in (
        "queue/processes",
        "decided by isolation",
        "The bill",
        "Watch:",
        "Rejected",
        "Consider first",
    ):
        assert needle in out
    assert "foundry_child_exits_total" in out


def test_explain_json_and_markdown(cli: CLI) -> None:
    code, out, _ = cli("explain", "foundry.examples.seeds:handle_payment", "--json")
    assert code == 0
    body = json.loads(out)
    assert body["name"] == "handle_payment"
    assert [p["phase"] for p in body["phases"]] == ["main", "sign"]
    code, out, _ = cli("explain", "foundry.examples.seeds:handle_payment", "--markdown")
    assert code == 0
    assert "phase `sign`" in out


def test_app_explain_returns_plain_text() -> None:
    from foundry.examples.seeds import app

    text = app.explain("handle_payment")
    assert "handle_payment · phase sign" in text
    assert "\x1b[" not in text  # no colour codes in a string
