"""`foundry advise`: in order, stopping at the first that decides; flags; JSON; no TTY."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Callable

import pytest

CLI = Callable[..., tuple[int, str, str]]
# the documented shape, and what was added to it: the deciding answers, notes, order, load
KEYS = {"name", "delivery", "execution", "decided_by", "why", "costs", "fails", "watch", "warnings"}
ADDED = {"model", "delivery_decided_by", "answer", "delivery_answer", "notes", "order", "load"}


def test_flags_and_json_for_scripts(cli: CLI) -> None:
    code, out, err = cli(
        "advise", "--est", "40ms", "--bound", "io", "--concurrency", "300", "--latency", "50ms",
        "--phase", "sign:est=35ms,bound=cpu", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert err == ""  # nothing asked when answers are flags
    phases = json.loads(out)["phases"]
    assert [set(p) for p in phases] == [KEYS | ADDED, KEYS | ADDED]
    assert [(p["name"], p["delivery"], p["execution"]) for p in phases] == [
        ("main", "direct", "async"),
        ("sign", "direct", "processes"),
    ]
    assert phases[0]["decided_by"] == "count"
    assert "foundry_loop_lag_seconds" in phases[0]["watch"]
    # why starts with the deciding answer, not a generic line about the model
    assert phases[0]["why"].startswith("Execution decided by count: 300 in flight")
    assert phases[1]["answer"] in phases[1]["why"]
    # the load arithmetic
    load = phases[1]["load"]
    assert load["computing"] is True
    assert load["declared"] == 300
    assert load["concurrency"] == load["cores"]
    assert any("cores:" in line for line in load["lines"])


def test_the_host_can_be_given(cli: CLI) -> None:
    args = ("advise", "--est", "35ms", "--bound", "cpu", "--rate", "300/s", "--json")
    code, out, _ = cli(*args, "--cores", "8", "--gil")
    assert code == 0
    (phase,) = json.loads(out)["phases"]
    assert (phase["execution"], phase["load"]["concurrency"]) == ("processes", 8)
    assert [w["code"] for w in phase["warnings"]] == ["saturation"]
    assert phase["warnings"][0]["message"].startswith("10.5 cores of computing on 8")
    code, out, _ = cli(*args, "--cores", "16", "--no-gil")
    assert code == 0
    (phase,) = json.loads(out)["phases"]
    assert (phase["execution"], phase["load"]["concurrency"], phase["warnings"]) == ("bounded_pool", 16, [])


def test_warnings_reach_the_json(cli: CLI) -> None:
    code, out, _ = cli("advise", "--durable", "--model", "direct", "--json")
    assert code == 0
    (phase,) = json.loads(out)["phases"]
    assert [w["code"] for w in phase["warnings"]] == [
        "override-contradicts-traits",
        "direct-for-durable-work",
    ]


def test_interactive_stops_at_the_first_that_decides(cli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given answers typed in order: not multi-step; durable; no order; one consumer; no replay;
    # no rate -> "durable" decides queue. Then the 90 s ffmpeg job: 90s, no rate, no count;
    # cpu, not partitionable, GIL not released; no stages, nothing shared; not ordered; no
    # count; isolate.
    answers = "n\ny\nn\n\nn\n\n" + "90s\n\n\ncpu\nn\nn\n\n\nn\n\ny\n" + "\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO(answers))
    code, out, err = cli("advise", "--json")
    assert code == 0, err
    (phase,) = json.loads(out)["phases"]
    assert (phase["delivery"], phase["execution"], phase["decided_by"]) == ("queue", "processes", "isolation")
    # The delivery walk stopped at question 2: questions 3..7 were never asked.
    assert "[delivery 2/7]" in err
    assert "[decides: queue]" in err
    assert "[delivery 3/7]" not in err
    # duration and isolation were asked, and the long job got its advice
    assert "[execution 6/7]" in err
    assert "[execution 7/7]" in err
    assert any(n.startswith("long-running (90s)") for n in phase["notes"])


def test_interactive_skips_the_rest_of_an_axis_once_decided(
    cli: CLI, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 2 ms, one at a time -> size decides sequential; bound..count are not asked, duration and
    # isolation are.
    answers = "n\nn\n\n\nn\n\n\n\n" + "2ms\n\n\n" + "n\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO(answers))
    code, out, err = cli("advise", "--json")
    assert code == 0, err
    assert json.loads(out)["phases"][0]["decided_by"] == "size"
    assert "[execution 2/7]" not in err
    assert "[execution 5/7]" not in err
    assert "[execution 6/7]" in err
    assert "[execution 7/7]" in err


def test_end_of_input_means_not_declared(cli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code, out, _ = cli("advise", "--json")
    assert code == 0
    (phase,) = json.loads(out)["phases"]
    assert (phase["delivery"], phase["execution"]) == ("direct", "sequential")


def test_a_bad_typed_answer_is_asked_again(cli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("maybe\nn\n"))
    code, _, err = cli("advise", "--json")
    assert code == 0
    assert "'maybe' is not yes or no" in err


def test_no_tty_does_not_hang() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "foundry.cli", "advise", "--json"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["phases"][0]["execution"] == "sequential"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--est=-3s"], "est='-3s' is negative"),
        (["--concurrency", "lots"], "is not a whole number"),
        (["--phase", "sign"], "is not NAME:TRAIT=VALUE"),
        (["--phase", "sign:bound"], "is not TRAIT=VALUE"),
        (["--model", "kafka"], "is not a model"),
    ],
)
def test_bad_flags_are_one_line(cli: CLI, argv: list[str], needle: str) -> None:
    code, _, err = cli("advise", *argv, "--json")
    assert code == 2
    assert needle in err
    assert "Traceback" not in err
