"""The README's quickstart runs as printed, and its CPU-bound ``sign`` really runs in
parallel: on process workers, not on threads that take turns under the GIL."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def quickstart_code() -> str:
    text = README.read_text(encoding="utf-8")
    after = text[text.index("Save this as `quickstart.py`") :]
    match = re.search(r"```python\n(.*?)```", after, re.DOTALL)
    assert match, "the README has no quickstart code block"
    return match.group(1)


def test_the_quickstart_runs_as_printed(tmp_path: Path) -> None:
    (tmp_path / "quickstart.py").write_text(quickstart_code(), encoding="utf-8")
    env = {**os.environ, "FOUNDRY_HOME": str(tmp_path / ".foundry")}
    proc = subprocess.run(
        [sys.executable, "quickstart.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "direct/processes" in proc.stdout
    assert "succeeded" in proc.stdout
    assert "['a', 'b', 'c']" in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.fixture
def quickstart(tmp_path: Path, home: Path) -> Iterator[Any]:
    # Importable by name, so the children import it as the parent does.
    (tmp_path / "quickstart_readme.py").write_text(quickstart_code(), encoding="utf-8")
    sys.path.insert(0, str(tmp_path))
    module = importlib.import_module("quickstart_readme")
    try:
        yield module
    finally:
        module.app.close(timeout=10)
        sys.modules.pop("quickstart_readme", None)
        sys.path.remove(str(tmp_path))


def test_sign_computes_on_several_processes_not_on_the_callers_gil(quickstart: Any) -> None:
    sign = quickstart.sign
    # Given the quickstart's declaration (bound="cpu", concurrency=16) on this interpreter,
    assert sign.decision.execution == "processes"
    cores = sign.decision.load.cores
    assert sign.decision.load.concurrency == min(16, cores)
    sign("warm-up")  # the children start once
    # when 16 calls are submitted at once,
    cpu_before = time.process_time()
    handles = [sign.submit(f"payload {i}") for i in range(16)]
    results = [h.result(timeout=120) for h in handles]
    parent_cpu = time.process_time() - cpu_before
    # then they ran in the children, one per core: this process only dispatched them
    # (16 × ~35 ms of hashing on threads here would cost this process all of it) ...
    assert len(set(results)) == 16
    pids = sign.runner.pool.pids()
    assert len(set(pids)) == min(16, cores)
    assert os.getpid() not in pids
    work = sum(_cpu_of_one_call(quickstart) for _ in range(2)) / 2 * 16
    assert parent_cpu < 0.5 * work, f"parent used {parent_cpu:.3f}s of CPU for {work:.3f}s of work"


def _cpu_of_one_call(module: Any) -> float:
    start = time.process_time()
    module.sign.fn("measure")
    return time.process_time() - start
