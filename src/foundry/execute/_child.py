"""The child side of :mod:`foundry.execute.processes`: what runs in each child process.

A child resolves its unit's function by module and qualified name, then runs the units
it is sent, one at a time and in order, answering each on its pipe before it starts the
next (so the parent always knows which unit a dead child was running). It dies with its
parent: ``PR_SET_PDEATHSIG`` on Linux, and a thread that exits the process when the
lifeline pipe from the parent closes.

Messages, pickled: parent → child ``("run", [(number, payload), ...])``, ``("skip",
number)``, ``("stop",)``; child → parent ``("ready", pid)``, ``("fatal", error record)``,
``("progress", number, done, total, note)`` while a unit runs (its
:func:`foundry.progress` calls, at most one per :data:`PROGRESS_EVERY` seconds unless it
reports the end), then ``(number, kind, value, seconds, cpu)`` per unit, ``kind`` one of :data:`OK`,
:data:`ERROR` (the exception), :data:`ERROR_RECORD` (a JSON record of it), :data:`SKIPPED`;
``seconds`` is the call's wall time and ``cpu`` the CPU time the child spent on it
(``time.process_time``: what tells computing from waiting).
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
from foundry.execute.progress import reporting
from foundry.serialize import encode_error

__all__ = ["ERROR", "ERROR_RECORD", "OK", "PICKLE", "SKIPPED", "child_main", "resolve_target"]

PICKLE = pickle.HIGHEST_PROTOCOL
OK, ERROR, ERROR_RECORD, SKIPPED = range(4)
PROGRESS_EVERY = 0.05  # seconds between two progress messages of one unit, at most


# Foundry's wrappers that a module attribute may be: a ``@app.work`` unit, a ``@unit.phase``.
_WRAPPERS = frozenset({("WorkUnit", "foundry.units"), ("Phase", "foundry.execute.phase")})


def resolve_target(module: str, qualname: str) -> Callable[..., Any]:
    """Import ``module`` and walk ``qualname``; a ``@app.work`` unit or a ``@unit.phase``
    gives its function."""
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    if (type(target).__name__, type(target).__module__) in _WRAPPERS:
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


class _Progress:
    """A unit's progress sink in the child: a record goes up the pipe at once unless one
    went less than :data:`PROGRESS_EVERY` ago; then it waits as *pending* for the flusher
    thread (or the end of the unit), so the latest record always arrives, before the
    unit's result."""

    __slots__ = ("last", "lock", "pending", "send", "tid")

    def __init__(self, tid: int, send: Callable[[bytes], None]) -> None:
        self.tid, self.send = tid, send
        self.last = 0.0
        self.pending: tuple[float, float | None, str] | None = None
        self.lock = threading.Lock()  # the unit's own threads and the flusher may report too

    def __call__(self, done: float, total: float | None, note: str) -> None:
        with self.lock:
            self.pending = (done, total, note[:200])
            if time.monotonic() - self.last >= PROGRESS_EVERY:
                self._send()
            else:
                _flusher.wake(self)

    def flush(self) -> None:
        with self.lock:
            if self.pending is not None:
                self._send()

    def _send(self) -> None:
        record, self.pending = self.pending, None
        self.last = time.monotonic()
        if record is not None:
            try:
                self.send(pickle.dumps(("progress", self.tid, *record), PICKLE))
            except (EOFError, OSError):  # the parent is gone: the lifeline thread ends us
                pass


class _Flusher:
    """One thread per child, started by the first throttled record: sends a unit's pending
    progress :data:`PROGRESS_EVERY` seconds after it was throttled."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._waiting: _Progress | None = None
        self._thread: threading.Thread | None = None

    def wake(self, sink: _Progress) -> None:
        with self._cond:
            self._waiting = sink
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="foundry-progress", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:  # pragma: no cover - runs in the child
        while True:
            with self._cond:
                while self._waiting is None:
                    self._cond.wait()
                sink, self._waiting = self._waiting, None
            time.sleep(PROGRESS_EVERY)
            sink.flush()


_flusher = _Flusher()


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
    recv, poll = conn.recv_bytes, conn.poll
    sending = threading.Lock()  # results (this thread) and progress (the flusher too) share the pipe

    def send(blob: bytes) -> None:
        with sending:
            conn.send_bytes(blob)

    perf, cpu_time = time.perf_counter, time.process_time

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
            send(pickle.dumps((tid, SKIPPED, None, 0.0, 0.0), PICKLE))
            continue
        started, cpu = perf(), cpu_time()
        try:
            args, kwargs = pickle.loads(payload)
            sink = _Progress(tid, send)
            try:
                with reporting(sink):
                    value = fn(*args, **kwargs)
            finally:
                sink.flush()  # the latest record goes before the result
        except BaseException as exc:
            kind, data = _portable(exc)
            message = (tid, kind, data, perf() - started, cpu_time() - cpu)
        else:
            message = (tid, OK, value, perf() - started, cpu_time() - cpu)
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
                    message[4],
                ),
                PICKLE,
            )
        try:
            send(blob)
        except (EOFError, OSError):
            return
