"""`foundry profile`: measure, classify, infer traits, decide; async too; clean errors.

No assertion here depends on speed: a sleeping function's CPU/wall ratio is near 0
however loaded the machine is, and the compute case only checks that CPU was counted.
The ratio counts the whole process's CPU (native threads a function starts are its
work), so a classification is asserted on a `foundry profile` process of its own, as a
user runs it: in a test worker, threads other tests left behind would be counted too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from foundry.decide import Host
from foundry.profile import classify, current_host, gil_verdict, profile_callable
from foundry.traits import Traits

CLI = Callable[..., tuple[int, str, str]]


@pytest.fixture
def own_process(tmp_path: Path) -> CLI:
    """Run `foundry ARGS...` as a process of its own; return (exit code, stdout, stderr)."""

    def run(*argv: str) -> tuple[int, str, str]:
        env = {**os.environ, "COLUMNS": "200", "FOUNDRY_HOME": str(tmp_path / "home")}
        done = subprocess.run(
            [sys.executable, "-m", "foundry", *argv], capture_output=True, text=True, env=env, timeout=120
        )
        return done.returncode, done.stdout, done.stderr

    return run


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


def test_a_waiting_function_is_waiting_bound(own_process: CLI, app_file: Path) -> None:
    code, out, err = own_process("profile", f"{app_file}:nap", "--args", "[0.02]", "--runs", "2", "--json")
    assert code == 0, err
    body = json.loads(out)
    assert body["runs"] == 2
    assert body["classification"] == "waiting-bound"
    assert body["inferred_traits"]["bound"] == "io"
    assert body["wall_seconds"]["median"] > 0
    assert body["decision"]["execution"]


def test_an_async_function_is_measured_on_a_loop(own_process: CLI, app_file: Path) -> None:
    code, out, err = own_process(
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

        time.sleep(0.1)  # in this worker's process: long, so stray threads' CPU stays far below 20%

    result = profile_callable(nap, runs=1, declared=Traits(bound="cpu", concurrency=300), host=Host(cores=8))
    assert result.inferred.bound == "io"
    assert result.inferred.concurrency == 300
    assert any("reclassify" in line for line in result.disagreements)
    assert result.decision.execution == "async"


def test_the_table_prints_inferred_traits_and_the_decision(own_process: CLI, app_file: Path) -> None:
    code, out, err = own_process("profile", f"{app_file}:nap", "--args", "[0.02]", "--runs", "2")
    assert code == 0, err
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


def test_a_declared_est_far_from_the_measured_one_is_reported() -> None:
    # Declared 35 ms, measured microseconds: the profile says so, and re-decides with it.
    def tiny() -> int:
        return 1

    result = profile_callable(tiny, runs=3, declared=Traits(est=0.035, bound="cpu"), host=Host(cores=8))
    (line,) = [d for d in result.disagreements if d.startswith("declared est=")]
    assert line.startswith("declared est=35ms but foundry profile measured ")
    assert "update est=" in line
    assert any(n.startswith("reclassified: declared est=35ms") for n in result.decision.notes)
    assert result.decision.load.est == result.wall


def test_a_measured_est_far_above_the_declared_one_is_reported_too() -> None:
    def nap() -> None:
        import time

        time.sleep(0.02)

    result = profile_callable(nap, runs=1, declared=Traits(est=0.001, bound="io"), host=Host(cores=8))
    assert any(d.startswith("declared est=1ms but foundry profile measured") for d in result.disagreements)
    assert not [d for d in result.disagreements if d.startswith("declared bound")]


@pytest.mark.parametrize(
    ("speedup", "verdict"), [(1.9, True), (1.5, True), (1.4, None), (1.25, False), (0.9, False)]
)
def test_gil_verdict(speedup: float, verdict: bool | None) -> None:
    assert gil_verdict(speedup) is verdict


def test_the_two_thread_probe_tells_a_released_gil_from_a_held_one() -> None:
    # Sleeping stands in for native code that releases the GIL; a shared lock held for the
    # whole call stands in for the GIL itself. Neither depends on how busy the machine is.
    import threading
    import time

    from foundry.profile import Run, _gil_probe

    held = threading.Lock()

    def releases() -> None:
        time.sleep(0.005)

    def holds() -> None:
        with held:
            time.sleep(0.005)

    serial = [Run(0.005, 0.0, 0.0)] * 4
    released = _gil_probe(releases, (), {}, serial)
    kept = _gil_probe(holds, (), {}, serial)
    assert released is not None
    assert kept is not None
    assert gil_verdict(released) is True
    assert gil_verdict(kept) is False


def test_profile_json_carries_the_gil_probe_and_the_load(cli: CLI, app_file: Path) -> None:
    code, out, _ = cli("profile", f"{app_file}:burn", "--args", '{"args": [50000]}', "--runs", "2", "--json")
    assert code == 0
    body = json.loads(out)
    assert "gil_probe" in body
    assert "releases_gil" in body["inferred_traits"]
    assert body["decision"]["load"]
    assert body["decision"]["answer"]
