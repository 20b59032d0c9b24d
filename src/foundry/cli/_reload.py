"""``foundry run --reload``: the app in a child process, restarted when its code changes.

For development. The parent imports none of the app's code: it runs ``foundry run``
without ``--reload`` as a child and polls the modification times and sizes of the
``.py`` and ``.toml`` files under the app's directory (a ``file.py`` target's folder, or
a module's top-level package) every :data:`POLL` seconds — at most :data:`MAX_FILES`
files, skipping hidden folders, ``__pycache__``, virtualenvs and ``site-packages``; no
dependency, no inotify. On a change it stops the child as SIGTERM does (a graceful
drain, killed after ``grace`` + 10 s) and starts a new one. A child that exits by itself
(a syntax error, a failed component) is restarted at the next change. SIGTERM or Ctrl-C
stops the child and exits with its status; a second one reaches the child too (it
hurries).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["MAX_FILES", "POLL", "reload", "snapshot", "watch_roots"]

POLL = 0.5
MAX_FILES = 5000
_SKIP = {"__pycache__", "node_modules", "site-packages", "dist-packages", "build", "dist"}
_SUFFIXES = (".py", ".toml")


def watch_roots(target: str) -> list[Path]:
    """The folders whose code makes up ``target`` (``module[:app]`` or ``file.py[:app]``)."""
    module = target.rpartition(":")[0] if ":" in target else target
    path = Path(module)
    if module.endswith(".py") or path.is_file():
        return [path.resolve().parent]
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        spec = importlib.util.find_spec(module.split(".")[0])  # finds, does not import
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return [Path(p).resolve() for p in spec.submodule_search_locations]
    if spec is not None and spec.origin and spec.origin not in ("built-in", "frozen"):
        return [Path(spec.origin).resolve().parent]
    return [Path.cwd()]


def snapshot(roots: list[Path]) -> dict[str, tuple[int, int]]:
    """``path -> (mtime_ns, size)`` of the watched files under ``roots`` (bounded)."""
    seen: dict[str, tuple[int, int]] = {}
    for root in roots:
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(
                d
                for d in dirs
                if not d.startswith(".") and d not in _SKIP and not (Path(folder, d) / "pyvenv.cfg").exists()
            )
            for name in sorted(files):
                if name.endswith(_SUFFIXES):
                    file = os.path.join(folder, name)
                    try:
                        st = os.stat(file)
                    except OSError:
                        continue
                    seen[file] = (st.st_mtime_ns, st.st_size)
                    if len(seen) >= MAX_FILES:
                        return seen
    return seen


def _changed(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> str | None:
    for path in sorted(set(before) | set(after)):
        if before.get(path) != after.get(path):
            return path
    return None


def reload(argv: list[str], target: str, *, grace: float, quiet: bool = False) -> int:
    """Run ``foundry run ARGV`` in a child until SIGTERM/SIGINT, restarting it on changes."""

    def say(text: str) -> None:
        if not quiet:
            print(f"foundry run --reload: {text}", flush=True)

    roots = watch_roots(target)
    stop = threading.Event()
    child: subprocess.Popen[bytes] | None = None
    told: set[int] = set()  # children the handler passed a signal to

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()
        if child is not None and child.poll() is None:
            told.add(child.pid)
            child.send_signal(signal.SIGTERM)  # the first drains, a second one hurries it

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    files = snapshot(roots)
    if len(files) >= MAX_FILES:
        say(f"watching only the first {MAX_FILES} files under {', '.join(map(str, roots))}")
    command = [sys.executable, "-m", "foundry.cli", "run", *argv]
    while not stop.is_set():
        # Its own process group: a Ctrl-C in the terminal reaches the parent only, which
        # passes each signal on once (two would hurry the child's drain).
        child = subprocess.Popen(command, process_group=0)
        say(f"started pid {child.pid}; watching {len(files)} files under {', '.join(map(str, roots))}")
        exited = False
        while not stop.wait(POLL):
            if not exited and child.poll() is not None:
                exited = True
                say(f"pid {child.pid} exited with status {child.returncode}; restarting at the next change")
            now = snapshot(roots)
            path = _changed(files, now)
            if path is not None:
                files = now
                say(f"{path} changed: restarting")
                _end(child, grace, signalled=False)
                break
    if child is None:
        return 0
    return _end(child, grace, signalled=child.pid in told)


def _end(child: subprocess.Popen[bytes], grace: float, *, signalled: bool) -> int:
    """Stop ``child`` as SIGTERM does (``signalled``: the signal handler sent it already),
    killed after ``grace`` + 10 s; its exit status."""
    if not signalled and child.poll() is None:
        child.send_signal(signal.SIGTERM)
    try:
        return child.wait(grace + 10.0)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait(10.0)
