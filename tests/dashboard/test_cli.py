"""``foundry dashboard``: starts over an app, refuses what it must refuse."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from foundry.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_it_refuses_a_public_address_without_a_token(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("FOUNDRY_DASHBOARD_TOKEN", raising=False)
    monkeypatch.setenv("FOUNDRY_HOME", str(tmp_path))
    assert main(["dashboard", "--host", "0.0.0.0", "--port", "0"]) == 1
    assert "refusing to listen on '0.0.0.0' without a token" in capsys.readouterr().err
    assert main(["dashboard", "--poll", "0.1"]) == 2
    assert main(["dashboard", "tests.dashboard.no_such_module:app"]) == 1
    assert "no module named" in capsys.readouterr().err


def test_it_serves_the_plan_of_the_app_it_is_given(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "FOUNDRY_HOME": str(tmp_path / ".foundry"),
        "FOUNDRY_FLEET": (tmp_path / "fleet").as_uri(),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "foundry.cli",
            "dashboard",
            "tests.dashboard.dashboard_app:app",
            "--port",
            "0",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("Foundry dashboard on http://127.0.0.1:"), line + (
            proc.stderr.read() if proc.stderr else ""
        )
        url = line.split(" on ", 1)[1].split("/ ", 1)[0]
        with urllib.request.urlopen(url + "/api/plan", timeout=30) as resp:
            plan = json.loads(resp.read())
        assert {u["name"] for u in plan["units"]} == {
            "resize",
            "charge",
            "sign",
            "thumbnail",
            "checkout",
            "signaling",
        }
        with urllib.request.urlopen(url + "/", timeout=30) as resp:
            assert b"Foundry dashboard" in resp.read()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
