"""`foundry lab ...` end to end: tables, JSON, plots, exit codes, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from foundry.cli import main

QUICK = ["--customers", "3000", "--replications", "4"]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(["lab", *argv])
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_pool_prints_the_seed_figures_with_their_methods(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "pool", "--workers", "8", "--service", "50ms", "--rate", "120/s", *QUICK)
    assert code == 0
    assert "160.0 req/s" in out
    assert "0.750" in out
    for label in (
        "Erlang C (exact M/M/c)",
        "Allen–Cunneen G/G/c approx.",
        "Sakasegawa G/G/c approx.",
        "simulation, 95% CI",
    ):
        assert label in out
    assert "58.9" in out
    assert "59.8" in out
    assert "7.07" in out
    assert "Little L = λ × W" in out
    assert "Seed 003 prints W 59.8 ms and L 7.2" in out
    assert " ±" in out  # simulated cells carry their interval


def test_pool_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "pool", "--json", *QUICK, "--ca", "2")
    assert code == 0
    data = json.loads(out)
    assert data["capacity_per_s"] == 160.0
    assert data["utilisation"] == 0.75
    methods = {m["method"]: m for m in data["methods"]}
    assert methods["Allen–Cunneen G/G/c approx."]["wq_s"] > methods["Erlang C (exact M/M/c)"]["wq_s"]
    assert data["simulation"]["w"]["replications"] == 4


def test_unstable_pool_is_a_statement_not_a_number(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "pool", "--rate", "200/s")
    assert code == 0
    assert "unbounded queue" in out
    assert "Need ≥ 11 workers" in out
    assert "W, mean response" not in out
    code, out, _ = _run(capsys, "pool", "--rate", "200/s", "--json", "--no-sim")
    data = json.loads(out)
    assert data["stable"] is False
    assert data["methods"] == []


@pytest.mark.parametrize(
    ("argv", "code", "needle"),
    [
        (["pool", "--workers", "0"], 1, "workers=0"),
        (["pool", "--rate=-5/s"], 2, "--rate"),
        (["pool", "--service", "fast"], 2, "--service"),
        (["pool", "--rate", "200/s", "--sim"], 1, "horizon"),
        (["permits", "--permits", "0,5"], 1, "permits=0"),
        (["loop", "--cpu", "0ms"], 1, "cpu=0.0"),
        (["server", "--cores", "0"], 1, "cores=0"),
        (["pool", "--plot", "out.gif", "--no-sim"], 1, ".png or .svg"),
        (["pool", "--arrivals", "pareto", "--no-sim"], 1, "--arrivals='pareto'"),
    ],
)
def test_invalid_inputs_exit_cleanly(
    capsys: pytest.CaptureFixture[str], argv: list[str], code: int, needle: str
) -> None:
    got, _, err = _run(capsys, *argv)
    assert got == code
    assert needle in err
    assert "Traceback" not in err
    if code == 1:
        assert "Fix:" in err


def test_permits_reproduces_the_seed_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "permits")
    assert code == 0
    lines = [line for line in out.splitlines() if line.startswith("│")]
    rows = [[cell.strip() for cell in line.strip("│").split("│")] for line in lines]
    assert rows == [
        ["1", "25/s", "43 ms", "0.00%", "0"],
        ["5", "125/s", "43 ms", "0.00%", "0"],
        ["10", "250/s", "43 ms", "0.00%", "0"],
        ["25", "625/s", "43 ms", "0.00%", "0"],
        ["50", "1000/s", "53 ms", "0.00%", "0"],
        ["100", "1000/s", "103 ms", "0.00%", "0"],
        ["200", "1000/s", "203 ms", "0.00%", "0"],
        ["350", "1000/s", "353 ms", "0.00%", "0"],
        ["500", "0/s", "503 ms", "100.0%", "10K"],
    ]
    assert "failed of 10K" in out


def test_permits_simulation_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        capsys,
        "permits",
        "--sim",
        "--permits",
        "10,50",
        "--requests",
        "1000",
        "--replications",
        "2",
        "--json",
    )
    assert code == 0
    data = json.loads(out)
    assert [r["permits"] for r in data["simulation"]] == [10, 50]
    assert data["simulation"][0]["method"].startswith("simulation, 95% CI")


def test_loop_prints_the_schedule_and_the_broken_budget(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "loop", "--cpu", "35ms", "--rate", "300/s", "--budget", "100ms")
    assert code == 0
    assert "health check arrives, marked ready" in out
    assert "ready=3 loopBusyMs=140 healthWaitMs=105" in out
    assert "Budget broken at step 6" in out
    code, out, _ = _run(capsys, "loop", "--json")
    assert json.loads(out)["budget_broken_step"] == 6


def test_server_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "server", "--requests", "1500", "--replications", "2", "--concurrency", "50")
    assert code == 0
    for model in ("thread-per-request", "fixed pool", "async"):
        assert model in out
    assert "MiB" in out


def test_fit_from_csv(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text("\n".join(["0.04", "0.05", "0.06", "0.045", "0.055"] * 20) + "\n")
    code, out, _ = _run(capsys, "fit", "--csv", str(csv), "--rate", "100/s", "--target", "80ms", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["workers"] >= 6
    assert data["analytic_w_s"] <= 0.08


def test_plot_writes_a_valid_png(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "pool.png"
    code, out, _ = _run(capsys, "pool", "--no-sim", "--plot", str(png))
    assert code == 0
    assert "plot written" in out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    assert len(data) > 5_000
    svg = tmp_path / "permits.svg"
    assert _run(capsys, "permits", "--plot", str(svg))[0] == 0
    assert "<svg" in svg.read_text()[:500]
    loop_png = tmp_path / "loop.png"
    assert _run(capsys, "loop", "--plot", str(loop_png))[0] == 0
    assert loop_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_server_and_fit_plots(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "server.png"
    argv = ["server", "--requests", "600", "--replications", "2", "--sweep", "20,40", "--plot", str(png)]
    assert _run(capsys, *argv)[0] == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    csv = tmp_path / "t.csv"
    csv.write_text("\n".join(["40ms", "50ms", "60ms"] * 10) + "\n")
    svg = tmp_path / "fit.svg"
    argv = ["fit", "--csv", str(csv), "--rate", "100/s", "--target", "80ms", "--plot", str(svg)]
    code, out, _ = _run(capsys, *argv)
    assert code == 0
    assert "pool size" in out
    assert "<svg" in svg.read_text()[:500]


def test_lab_pool_imports_neither_numpy_nor_matplotlib() -> None:
    code = (
        "import sys; from foundry.cli import main; main(['lab', 'pool', '--no-sim', '--json']);"
        "print(sorted({'numpy', 'matplotlib'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
