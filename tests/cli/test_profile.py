"""`foundry profile`: measure, classify, infer traits, decide; async too; clean errors.

No assertion here depends on speed: a sleeping function's CPU/wall ratio is near 0
however loaded the machine is, and the compute case only checks that CPU was counted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from foundry.decide import Host
from foundry.profile import classify, current_host, profile_callable
from foundry.traits import Traits

CLI = Callable[..., tuple[int, str, str]]


@pytest.mark.parametrize(
    ("ratio", "bound"), [(0.0, "io"), (0.2, "io"), (0.5, "mixed"), (0.8, "cpu"), (3.5, "cpu")]
)
def test_classify(ratio: float, bound: str) -> None:
    assert classify(ratio) == bound


def test_current_host_reads_cores_and_the_gil() -> None:
    host = current_host()
    assert host.cores is not None
    assert host.cores >= 1
    assert isinstance(host.gil, bool)


def test_a_waiting_function_is_waiting_bound(cli: CLI, app_file: Path) -> None:
    code, out, err = cli("profile", f"{app_file}:nap", "--args", "[0.02]", "--runs", "2", "--json")
    assert code == 0, err
    body = json.loads(out)
    assert body["runs"] == 2
    assert body["classification"] == "waiting-bound"
    assert body["inferred_traits"]["bound"] == "io"
    assert body["wall_seconds"]["median"] > 0
    assert body["decision"]["execution"]


def test_an_async_function_is_measured_on_a_loop(cli: CLI, app_file: Path) -> None:
    code, out, err = cli(
        "profile", f"{app_file}:anap", "--args", '{"seconds": 0.02}', "--runs", "2", "--json"
    )
    assert code == 0, err
    assert json.loads(out)["classification"] == "waiting-bound"


def test_compute_time_and_memory_are_counted(cli: CLI, app_file: Path) -> None:
    code, out, _ = cli("profile", f"{app_file}:burn", "--args", '{"args": [50000]}', "--runs", "2", "--json")
    assert code == 0
    body = json.loads(out)
    assert body["cpu_seconds"]["median"] > 0
    assert body["cpu_seconds"]["thread_median"] > 0
    assert body["peak_memory_bytes"] >= 0
    assert body["host"]["cores"] >= 1


def test_a_declared_unit_keeps_its_traits_and_reports_drift(app_file: Path) -> None:
    # Declared computing, measured waiting: "reclassify this phase".
    def nap() -> None:
        import time

        time.sleep(0.02)

    result = profile_callable(nap, runs=1, declared=Traits(bound="cpu", concurrency=300), host=Host(cores=8))
    assert result.inferred.bound == "io"
    assert result.inferred.concurrency == 300
    assert any("reclassify" in line for line in result.disagreements)
    assert result.decision.execution == "async"


def test_the_table_prints_inferred_traits_and_the_decision(cli: CLI, app_file: Path) -> None:
    code, out, _ = cli("profile", f"{app_file}:nap", "--args", "[0.01]", "--runs", "1")
    assert code == 0
    assert "waiting-bound" in out
    assert 'bound="io"' in out
    assert "Decision:" in out


@pytest.mark.parametrize(
    ("argv", "code", "needle"),
    [
        (["{file}:nap", "--args", "[0.01"], 2, "is not JSON"),
        (["{file}:nap", "--args", "[1, 2, 3]"], 2, "do not fit its signature"),
        (["{file}:boom"], 1, "boom raised RuntimeError: bad input"),
        (["{file}:nope"], 1, "no unit or function named 'nope'"),
        (["{file}:nap", "--runs", "0"], 2, "--runs 0 is out of range"),
        (["nap"], 2, "is not MODULE:FN"),
    ],
)
def test_bad_input_is_one_line(cli: CLI, app_file: Path, argv: list[str], code: int, needle: str) -> None:
    got, _, err = cli("profile", *(a.replace("{file}", str(app_file)) for a in argv))
    assert got == code
    assert needle in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
