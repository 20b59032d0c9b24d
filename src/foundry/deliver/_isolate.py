"""Run one job in a child process of its own (``isolate=True`` units, the ``processes``
execution model): a crash, a leak or a hang is contained to that job, a timeout kills
only that child, and the child exits by itself if the worker that started it dies.

The child finds the function by module and qualified name (loading the app's file when
the module was loaded from a path), so the function must be defined at module level.
Arguments and the result cross the pipe pickled (they already passed the unit's codec).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from foundry.errors import ChildCrashedError, SubmitError, WorkTimeoutError
from foundry.runtime import UnitSpec
from foundry.serialize import decode_error, encode_error

__all__ = ["run_isolated"]


def _target(spec: UnitSpec) -> tuple[str, str, str | None]:
    module = sys.modules.get(spec.module)
    path = getattr(module, "__file__", None)
    if not spec.module or not spec.qualname or "<locals>" in spec.qualname:
        raise SubmitError(
            f"unit {spec.name!r}: an isolated unit must be a module-level function so a child process "
            f"can import it (module={spec.module!r}, qualname={spec.qualname!r}). Fix: define it at the "
            "top level of a module"
        )
    return spec.module, spec.qualname, path


def _load(module_name: str, qualname: str, path: str | None) -> Callable[..., Any]:
    try:
        if module_name == "__main__":
            raise ImportError(module_name)
        module = importlib.import_module(module_name)
    except ImportError:
        if path is None:
            raise
        name = "__mp_main__" if module_name == "__main__" else module_name
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    fn = getattr(obj, "fn", obj)  # a WorkUnit wraps the function
    return fn  # type: ignore[no-any-return]


def _watch_parent(parent_pid: int) -> None:
    while True:
        try:
            os.kill(parent_pid, 0)
        except ProcessLookupError:
            os._exit(70)  # the worker died: do not outlive it (its lease will lapse)
        except PermissionError:
            pass
        threading.Event().wait(0.5)


def _child(target: tuple[str, str, str | None], args: Any, kwargs: Any, out: Connection, parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    try:
        fn = _load(*target)
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = asyncio.run(value)  # type: ignore[arg-type]
        try:
            out.send(("ok", value))
        except Exception as exc:
            out.send(("err", encode_error(exc)))
    except BaseException as exc:
        out.send(("err", encode_error(exc)))
    finally:
        out.close()


def run_isolated(
    spec: UnitSpec,
    args: list[Any],
    kwargs: dict[str, Any],
    *,
    timeout: float | None,
    started: Callable[[BaseProcess], None] | None = None,
) -> Any:
    """Run ``spec``'s function in a fresh child; its value, or its exception rebuilt."""
    ctx = multiprocessing.get_context("forkserver")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=_child, args=(_target(spec), args, kwargs, send, os.getpid()), name=f"foundry-job-{spec.name}"
    )
    try:
        proc.start()
        send.close()
        if started is not None:
            started(proc)
        if not receive.poll(timeout):
            raise WorkTimeoutError(
                f"unit {spec.name!r}: the job ran past its timeout of {timeout}s; its child process was "
                "killed. Fix: raise timeout= (or options(timeout=...)), or make the work shorter"
            )
        try:
            kind, value = receive.recv()
        except EOFError:
            proc.join(5.0)
            code = proc.exitcode
            name = signal.Signals(-code).name if code is not None and code < 0 else None
            raise ChildCrashedError(spec.name, code, name) from None
        if kind == "ok":
            return value
        raise decode_error(value)
    finally:
        receive.close()
        if proc.is_alive():
            proc.kill()
        if proc.pid is not None:
            proc.join(5.0)
            proc.close()
