"""``isolate=True`` units whose children cannot start: a main script without
``if __name__ == "__main__":`` (spawn/forkserver children run it again), and a script
that breaks its children's start-up after the pool has served. Each runs as a real
script in a subprocess, bounded by a timeout; the test counts the tracebacks it printed
and reads the error the handles and later submits got."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIX = "guard the main script with `if __name__ == '__main__':`"

UNGUARDED = """
import sys
from foundry import Foundry
from foundry.errors import SubmitError

app = Foundry("unguarded")

@app.work(isolate=True, workers=2)
def double(x: int) -> int:
    return 2 * x

# No `if __name__ == "__main__":` guard: every child runs these lines again.
handles = [double.submit(i) for i in range(3)]
for handle in handles:
    try:
        print("RESULT", handle.result(timeout=40), flush=True)
    except SubmitError as exc:
        print("FAILED", exc, flush=True)
try:
    double.submit(99)
except SubmitError as exc:
    print("LATER", exc, flush=True)
app.close(timeout=5)
"""


def _run(script: Path, tmp_path: Path, *argv: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]), **extra}
    env["FOUNDRY_HOME"] = str(tmp_path / ".foundry")
    return subprocess.run(
        [sys.executable, str(script), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )


def test_an_unguarded_main_script_fails_every_handle_once_with_the_fix(tmp_path: Path) -> None:
    # Given: a script that submits an isolated unit at its top level, unguarded
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    # When: it runs (before the fix it hung, its children restarting in a loop)
    done = _run(script, tmp_path)
    # Then: every pending handle and the later submit fail with the fix ...
    lines = done.stdout.splitlines()
    failed = [line for line in lines if line.startswith("FAILED")]
    later = [line for line in lines if line.startswith("LATER")]
    assert (len(failed), len(later)) == (3, 1), (done.stdout, done.stderr[-3000:])
    for line in failed + later:
        assert "unit 'double'" in line
        assert FIX in line
        assert "while starting" in line
    assert not [line for line in lines if line.startswith("RESULT")]
    # ... one child started and printed one traceback (not one per restart), which
    # says what went wrong in the child
    assert done.stderr.count("Traceback (most recent call last)") == 1, done.stderr[-3000:]
    assert "was submitted while a child process was starting" in done.stderr
    assert done.returncode == 0, done.stderr[-3000:]


BREAKS_LATER = """
import os, sys
from foundry import Foundry
from foundry.errors import SubmitError

FLAG = sys.argv[1] if __name__ == "__main__" else os.environ["BREAK_FLAG"]
if __name__ != "__main__" and os.path.exists(FLAG):
    raise RuntimeError("this child cannot start: " + FLAG + " exists")

app = Foundry("breaks-later")

@app.work(isolate=True, workers=1, max_tasks_per_child=1)
def triple(x: int) -> int:
    return 3 * x

if __name__ == "__main__":
    print("FIRST", triple.submit(1).result(timeout=40), flush=True)
    # From now on a new child dies while starting; every unit needs a new child.
    open(FLAG, "w").close()
    try:
        print("RESULT", triple.submit(2).result(timeout=40), flush=True)
    except SubmitError as exc:
        print("FAILED", exc, flush=True)
    try:
        triple.submit(3)
    except SubmitError as exc:
        print("LATER", exc, flush=True)
    app.close(timeout=5)
"""


def test_a_pool_that_served_gives_up_after_a_few_replacements_die_while_starting(tmp_path: Path) -> None:
    # Given: a pool that ran a unit, then whose new children die while starting
    script = tmp_path / "breaks_later.py"
    script.write_text(BREAKS_LATER)
    flag = tmp_path / "broken.flag"
    # When: the next unit needs a replacement child
    done = _run(script, tmp_path, str(flag), BREAK_FLAG=str(flag))
    lines = done.stdout.splitlines()
    # Then: the first unit ran; the next one fails after a bounded number of attempts
    assert "FIRST 3" in lines, (done.stdout, done.stderr[-3000:])
    failed = [line for line in lines if line.startswith("FAILED")]
    later = [line for line in lines if line.startswith("LATER")]
    assert (len(failed), len(later)) == (1, 1), (done.stdout, done.stderr[-3000:])
    assert "3 children in a row" in failed[0]
    assert FIX in failed[0]
    assert "3 children in a row" in later[0]
    # ... and each failed start printed its reason once: three, not a loop
    assert done.stderr.count("RuntimeError: this child cannot start") == 3, done.stderr[-3000:]
