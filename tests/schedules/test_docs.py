"""The code of docs/production.md and of the README's schedule section runs as printed:
the example app declares, `foundry schedules list` reads it, `foundry run` starts it and
drains on SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def blocks(path: Path, after: str = "") -> list[str]:
    text = path.read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text[text.index(after) :] if after else text, re.DOTALL)


def test_the_production_example_declares_and_runs(
    cli: Callable[..., tuple[int, str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FOUNDRY_HOME", str(tmp_path / ".foundry"))
    app_file = tmp_path / "myapp.py"
    app_file.write_text(blocks(ROOT / "docs" / "production.md")[0])
    code, out, err = cli("schedules", "list", str(app_file), "--json")
    assert code == 0, err
    rows = {row["unit"]: row for row in json.loads(out)}
    assert set(rows) == {"sync_prices", "heartbeat", "nightly_report"}
    assert rows["nightly_report"]["missed"] == "catch_up=3"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "FOUNDRY_HOME": str(tmp_path / ".foundry")}
    log = tmp_path / "run.log"
    with log.open("w") as out_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "foundry.cli", "run", "myapp:app", "--grace", "5s"],
            cwd=tmp_path,
            env=env,
            stdout=out_file,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while "foundry run: scheduler " not in log.read_text():
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert "sync_prices */5 * * * * (Europe/Berlin) missed=skip" in log.read_text()


def test_the_readme_schedule_example_declares(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FOUNDRY_HOME", str(tmp_path / ".foundry"))
    [code] = blocks(ROOT / "README.md", after="### One command, and schedules")[:1]
    namespace: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    unit = namespace["sync_prices"]
    assert unit.schedule.describe() == "*/5 * * * * (Europe/Berlin)"  # type: ignore[attr-defined]
    namespace["app"].close()  # type: ignore[attr-defined]
