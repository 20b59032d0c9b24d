"""The child side of :mod:`foundry.execute.processes`: what runs in each child process.

A child resolves its unit's function by module and qualified name, then runs the units
it is sent, one at a time and in order, answering each on its pipe before it starts the
next (so the parent always knows which unit a dead child was running). It dies with its
parent: ``PR_SET_PDEATHSIG`` on Linux, and a thread that exits the process when the
lifeline pipe from the parent closes.

Messages, pickled: parent → child ``("run", [(number, payload), ...])``, ``("skip",
number)``, ``("stop",)``; child → parent ``("ready", pid)``, ``("fatal", error record)``,
then ``(number, kind, value, seconds)`` per unit, ``kind`` one of :data:`OK`,
:data:`ERROR` (the exception), :data:`ERROR_RECORD` (a JSON record of it), :data:`SKIPPED`.
"""

from __future__ import annotations

import importlib
import multiprocessing.connection as mpc
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

from foundry.errors import SubmitError
from foundry.serialize import encode_error

__all__ = ["ERROR", "ERROR_RECORD", "OK", "PICKLE", "SKIPPED", "child_main", "resolve_target"]

PICKLE = pickle.HIGHEST_PROTOCOL
OK, ERROR, ERROR_RECORD, SKIPPED = range(4)


def resolve_target(module: str, qualname: str) -> Callable[..., Any]:
    """Import ``module`` and walk ``qualname``; a ``@app.work`` unit gives its function."""
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    if type(target).__name__ == "WorkUnit" and type(target).__module__ == "foundry.units":
        target = target.fn
    if not callable(target):
        raise TypeError(f"{module}.{qualname} is {type(target).__name__}, not a function")
    return target  # type: ignore[no-any-return]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux: SIGKILL this process when the thread that forked it dies."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _watch_lifeline(lifeline: mpc.Connection) -> None:  # pragma: no cover - runs in the child
    """Exit the child as soon as the parent's end of the lifeline closes (it died)."""
    try:
        lifeline.recv_bytes()
    except (EOFError, OSError):
        pass
    os._exit(70)


def _portable(error: BaseException) -> tuple[int, Any]:
    """The exception itself when it pickles (with the child's traceback as a note), else
    a JSON record that the parent rebuilds as the original type or a RemoteError."""
    text = "".join(traceback.format_exception(error))
    try:
        error.add_note(f"--- raised in child pid {os.getpid()} ---\n{text}")
        pickle.loads(pickle.dumps(error, PICKLE))
    except Exception:
        return ERROR_RECORD, encode_error(error)
    return ERROR, error


def child_main(
    conn: mpc.Connection, lifeline: mpc.Connection, unit: str, module: str, qualname: str
) -> None:  # pragma: no cover - runs in the child (covered by the tests, in another process)
    """The child's loop: resolve the function, then run units in the order received."""
    _die_with_parent()
    threading.Thread(target=_watch_lifeline, args=(lifeline,), name="foundry-lifeline", daemon=True).start()
    try:
        fn = resolve_target(module, qualname)
    except BaseException as exc:
        conn.send_bytes(pickle.dumps(("fatal", encode_error(exc)), PICKLE))
        return
    conn.send_bytes(pickle.dumps(("ready", os.getpid()), PICKLE))
    work: deque[tuple[int, bytes]] = deque()
    skips: set[int] = set()
    send, recv, poll = conn.send_bytes, conn.recv_bytes, conn.poll
    perf = time.perf_counter

    def take(message: Any) -> bool:
        kind = message[0]
        if kind == "run":
            work.extend(message[1])
        elif kind == "skip":
            skips.add(message[1])
        elif kind == "stop":
            return False
        return True

    while True:
        try:
            if not work and not take(pickle.loads(recv())):
                return
            while poll():
                if not take(pickle.loads(recv())):
                    return
        except (EOFError, OSError):
            return
        if not work:
            continue
        tid, payload = work.popleft()
        if tid in skips:
            skips.discard(tid)
            send(pickle.dumps((tid, SKIPPED, None, 0.0), PICKLE))
            continue
        started = perf()
        try:
            args, kwargs = pickle.loads(payload)
            value = fn(*args, **kwargs)
        except BaseException as exc:
            kind, data = _portable(exc)
            message = (tid, kind, data, perf() - started)
        else:
            message = (tid, OK, value, perf() - started)
        del payload
        try:
            blob = pickle.dumps(message, PICKLE)
        except Exception as exc:
            blob = pickle.dumps(
                (
                    tid,
                    ERROR_RECORD,
                    encode_error(
                        SubmitError(
                            f"unit {unit!r}: its result cannot be pickled back to the parent "
                            f"({type(exc).__name__}: {exc}). Fix: return plain data"
                        )
                    ),
                    message[3],
                ),
                PICKLE,
            )
        try:
            send(blob)
        except (EOFError, OSError):
            return
