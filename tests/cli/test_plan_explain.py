"""`foundry plan` and `foundry explain`: tables, JSON, Markdown, and one-line errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from foundry.profile import current_host

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
    assert "processes" in out  # the signing phase: pure-Python computing under the GIL
    assert "saturation" in out or "first failure mode" in out
    assert "first failure mode" in out
    assert "queue" in out
    assert "processes" in out


def test_plan_json_for_scripts(cli: CLI) -> None:
    code, out, _ = cli("plan", "foundry.examples.seeds", "--json")
    assert code == 0
    units = {u["name"]: u for u in json.loads(out)["units"]}
    assert sorted(units) == sorted(SEED_UNITS)
    payment = units["handle_payment"]["phases"]
    computing = "bounded_pool" if current_host().gil is False else "processes"
    assert [(p["phase"], p["model"]) for p in payment] == [
        ("main", "direct/async"),
        ("sign", f"direct/{computing}"),
    ]
    assert payment[0]["execution_bill"]["fails"]
    assert payment[0]["watch"]
    # the documented keys and the load arithmetic, as in advise --json
    for key in ("delivery", "execution", "decided_by", "why", "costs", "fails", "warnings", "load"):
        assert key in payment[1], key
    assert payment[1]["load"]["computing"] is True


def test_advise_plan_and_explain_agree(cli: CLI) -> None:
    # The payments handler, given to advise as flags, planned from the module, explained:
    # the same deciding answer, notes and numbers in all three.
    code, out, _ = cli(
        "advise", "--est", "40ms", "--bound", "io", "--concurrency", "300", "--rate", "300/s",
        "--latency", "50ms", "--max-pending", "300", "--overflow", "reject",
        "--phase", "sign:est=35ms,bound=cpu", "--json",
    )  # fmt: skip
    assert code == 0
    advised = json.loads(out)["phases"]
    code, out, _ = cli("plan", "foundry.examples.seeds", "--json")
    planned = next(u for u in json.loads(out)["units"] if u["name"] == "handle_payment")["phases"]
    code, out, _ = cli("explain", "foundry.examples.seeds:handle_payment", "--json")
    explained = json.loads(out)["phases"]
    keys = ("model", "decided_by", "answer", "delivery_answer", "why", "notes", "order", "load", "warnings")
    for a, p, e in zip(advised, planned, explained, strict=True):
        for key in keys:
            assert a[key] == p[key] == e[key], key
    code, text, _ = cli("explain", "foundry.examples.seeds:handle_payment")
    assert "in flight: L = λ × W = 300/s × 35ms = 10.5 (Little's law)" in text
    assert advised[1]["load"]["lines"][0] == "in flight: L = λ × W = 300/s × 35ms = 10.5 (Little's law)"


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
    # duration is always asked, and long work gets its advice
    assert "Is a unit long-running?" in out
    assert "long-running (90s)" in out
    assert "Load (Little's law" in out


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
