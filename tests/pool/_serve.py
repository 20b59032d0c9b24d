"""Start and stop ``foundry pool serve`` (``tests.pool.served:app``) for the tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def env(**extra: str) -> dict[str, str]:
    out = dict(os.environ)
    paths = [str(ROOT / "src"), str(ROOT), *filter(None, out.get("PYTHONPATH", "").split(os.pathsep))]
    out["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    out.update(extra)
    return out


def serve(
    url: str, units: Sequence[str], log: Path, prefix: Sequence[str] = (), **extra: str
) -> subprocess.Popen[bytes]:
    """``foundry pool serve tests.pool.served:app`` for ``units``, its output in ``log``."""
    args = [
        *prefix,
        sys.executable,
        "-m",
        "foundry.cli",
        "pool",
        "serve",
        "tests.pool.served:app",
        "--url",
        url,
    ]
    for unit in units:
        args += ["--unit", unit]
    with log.open("ab") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env(**extra), cwd=ROOT)


def wait_ready(log: Path, units: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"foundry pool serve exited {proc.returncode}:\n{log.read_text()}")
        if log.exists() and log.read_text().count("foundry pool serve:") >= units:
            return
        time.sleep(0.05)
    raise AssertionError(f"foundry pool serve did not start:\n{log.read_text()}")


def stop(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(10)
