"""What every pool engine shares: the wire format, the worker's one-request step, and the
start-up of a worker process.

Wire format (the same over a pipe and over NATS)::

    request = b"FP1" + u32 header length + header JSON + body
              header: {"id", "key", "unit", "n" (attempt), "codec", "timeout", "wait"}
    reply   = 1 kind byte + f64 service seconds + body

Besides the engine's reply kinds, a network front may send two *notices* that are not
answers: ``BOUNCE`` ("this host did not run it: send it elsewhere", e.g. it is
closing) and ``QUEUED`` ("it waits here, at host ``body``", so the client watches that
host's heartbeat instead of guessing).

The header is read as hostile input: a frame that does not parse, names another unit or
another codec than the worker serves, is answered ``ERROR`` with the reason; it never
stops the worker, and the worker never decodes a body with a codec its unit did not
declare (a JSON unit never unpickles).
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib
import inspect
import json
import multiprocessing
import os
import signal
import socket
import struct
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from foundry.backends.pool.base import (
    CANCELLED,
    DEADLINE,
    ERROR,
    LOST,
    NO_WORKER,
    OK,
    OVERLOAD,
    Attempt,
    Reply,
)
from foundry.errors import SubmitError
from foundry.serialize import encode_error, get_codec

__all__ = [
    "BOUNCE",
    "QUEUED",
    "KeyCache",
    "attempt_from_frame",
    "decode_reply",
    "decode_request",
    "describe_exit",
    "die_with_parent",
    "encode_reply",
    "encode_request",
    "host_name",
    "process_context",
    "refusal",
    "resolve_target",
    "run_request",
]

BOUNCE = "bounce"  # a front's notice: not run here, send it to another host
QUEUED = "queued"  # a front's notice: it waits for a free worker at host ``body``

_MAGIC = b"FP1"
_KINDS = {
    OK: b"o",
    ERROR: b"e",
    LOST: b"l",
    NO_WORKER: b"n",
    DEADLINE: b"d",
    OVERLOAD: b"v",
    CANCELLED: b"c",
    BOUNCE: b"b",
    QUEUED: b"q",
}
_NAMES = {v[0]: k for k, v in _KINDS.items()}
_HEAD = struct.Struct("!I")
_SECONDS = struct.Struct("!d")
KEY_CACHE = 256  # answers a worker remembers by idempotency key


_HEADER = json.JSONEncoder(separators=(",", ":"))  # made once: json.dumps(..., separators=) makes one a call


def encode_request(attempt: Attempt) -> bytes:
    header = _HEADER.encode(
        {
            "id": attempt.request,
            "key": attempt.key,
            "unit": attempt.unit,
            "n": attempt.number,
            "codec": attempt.codec,
            "timeout": attempt.timeout,
            "wait": attempt.wait,
        }
    ).encode()
    return b"".join((_MAGIC, _HEAD.pack(len(header)), header, attempt.body))


def decode_request(frame: bytes) -> tuple[dict[str, Any], bytes]:
    """``(header, body)``; ``ValueError`` naming what is wrong with a malformed frame."""
    if len(frame) < 7 or frame[:3] != _MAGIC:
        raise ValueError("not a Foundry pool request (bad magic)")
    (size,) = _HEAD.unpack_from(frame, 3)
    if size > len(frame) - 7:
        raise ValueError("truncated header")
    try:
        header = json.loads(frame[7 : 7 + size])
    except ValueError as exc:
        raise ValueError(f"header is not JSON ({exc})") from exc
    if not (
        isinstance(header, dict)
        and isinstance(header.get("id"), str)
        and isinstance(header.get("key"), str)
        and isinstance(header.get("unit"), str)
        and isinstance(header.get("codec"), str)
    ):
        raise ValueError("header lacks id, key, unit or codec")
    return header, frame[7 + size :]


def attempt_from_frame(frame: bytes, unit: str, codec: str) -> Attempt:
    """The :class:`Attempt` a request frame carries, for a front that queues it before a
    worker runs it (the worker decodes the frame again). ``ValueError`` naming what is
    wrong with a frame that is malformed, or for another unit or codec."""
    header, _ = decode_request(frame)
    if header["unit"] != unit:
        raise ValueError(f"it is for unit {header['unit']!r}, and this pool serves {unit!r}")
    if header["codec"] != codec:
        raise ValueError(f"it is encoded with {header['codec']!r}, and the unit declares {codec!r}")
    numbers = []
    for field in ("wait", "timeout"):
        value = header.get(field)
        if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value < 1e9:
            raise ValueError(f"its {field} {value!r} is not a number of seconds")
        numbers.append(float(value))
    n = header.get("n")
    return Attempt(
        request=header["id"],
        key=header["key"],
        unit=unit,
        number=n if isinstance(n, int) else 0,
        body=b"",
        codec=codec,
        wait=numbers[0],
        timeout=numbers[1],
    )


def refusal(unit: str, why: str) -> bytes:
    """The ``ERROR`` reply to a frame a worker or front refuses (hostile or foreign input)."""
    error = SubmitError(
        f"unit {unit!r}: the worker refused a request: {why}. Fix: send it with the unit's own app"
    )
    return encode_reply(ERROR, json.dumps(encode_error(error)).encode())


def encode_reply(kind: str, body: bytes = b"", seconds: float = 0.0) -> bytes:
    return _KINDS[kind] + _SECONDS.pack(seconds) + body


def decode_reply(frame: bytes, worker: str = "") -> Reply:
    """A reply frame as a :class:`Reply`; a malformed one becomes ``LOST`` (we cannot
    tell what the worker did) with the reason."""
    if len(frame) < 9 or frame[0] not in _NAMES:
        return Reply(
            LOST, worker=worker, detail=f"the worker answered a malformed frame ({len(frame)} bytes)"
        )
    (seconds,) = _SECONDS.unpack_from(frame, 1)
    return Reply(_NAMES[frame[0]], frame[9:], worker=worker, seconds=seconds)


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


class KeyCache:
    """The last :data:`KEY_CACHE` answers of one worker, by idempotency key."""

    def __init__(self, size: int = KEY_CACHE) -> None:
        self._size = size
        self._answers: OrderedDict[str, bytes] = OrderedDict()

    def get(self, key: str) -> bytes | None:
        return self._answers.get(key)

    def put(self, key: str, reply: bytes) -> None:
        self._answers[key] = reply
        if len(self._answers) > self._size:
            self._answers.popitem(last=False)


class _Loop:
    """One event loop per worker for ``async def`` units (made on first use)."""

    loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def run(cls, coro: Any) -> Any:
        if cls.loop is None:
            cls.loop = asyncio.new_event_loop()
        return cls.loop.run_until_complete(coro)


def run_request(
    unit: str, codec: str, fn: Callable[..., Any], frame: bytes, cache: KeyCache
) -> tuple[bytes, dict[str, Any] | None]:
    """Run one request frame with ``fn`` and return ``(reply frame, header)``.

    A key already answered by this worker gets the stored answer (no second run). The
    function's exception is answered ``ERROR`` with its JSON record; a result the codec
    cannot carry is an ``ERROR`` naming the fix."""
    try:
        header, body = decode_request(frame)
        if header["unit"] != unit:
            raise ValueError(f"it is for unit {header['unit']!r}, and this worker serves {unit!r}")
        if header["codec"] != codec:
            raise ValueError(f"it is encoded with {header['codec']!r}, and the unit declares {codec!r}")
    except ValueError as exc:
        return refusal(unit, str(exc)), None
    cached = cache.get(header["key"])
    if cached is not None:
        return cached, header
    started = time.perf_counter()
    coder = get_codec(codec)
    try:
        args, kwargs = coder.decode(body)
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = _Loop.run(value)
    except Exception as exc:
        reply = encode_reply(ERROR, json.dumps(encode_error(exc)).encode(), time.perf_counter() - started)
    else:
        seconds = time.perf_counter() - started
        try:
            reply = encode_reply(OK, coder.encode(value, unit=unit, what="the result"), seconds)
        except SubmitError as exc:
            reply = encode_reply(ERROR, json.dumps(encode_error(exc)).encode(), seconds)
    cache.put(header["key"], reply)
    return reply, header


WORKER_MODULE = "foundry.backends.pool._dispatch"  # what a pool worker runs (``_worker_main``)


def process_context() -> Any:
    """``forkserver`` on Linux (``fork`` is unsafe in a process with threads), else ``spawn``.

    The forkserver is asked to import the worker's code before it forks anything (added
    to its preload list, whatever else is on it), so a new worker starts as a fork of a
    process that has Foundry imported: ready in ~10 ms instead of ~180 ms (the import),
    which is how soon the elastic controller's growth serves requests. It takes effect
    when this process starts its forkserver (once); a module that fails to import there
    is only skipped by multiprocessing, and the worker imports it itself."""
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" not in methods:
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    from multiprocessing import forkserver

    preload = list(getattr(forkserver._forkserver, "_preload_modules", ["__main__"]))
    if WORKER_MODULE not in preload:
        ctx.set_forkserver_preload([*preload, WORKER_MODULE])
    return ctx


def die_with_parent(lifeline: Any) -> None:  # pragma: no cover - runs in a worker
    """A worker dies with whoever started it: ``PR_SET_PDEATHSIG`` on Linux, and a thread
    that exits the process when the lifeline pipe from the parent closes."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        try:
            lifeline.recv_bytes()
        except (EOFError, OSError):
            pass
        os._exit(70)

    threading.Thread(target=watch, name="foundry-lifeline", daemon=True).start()


def host_name() -> str:
    return socket.gethostname()


def describe_exit(code: int | None) -> str:
    """``"SIGKILL"``, ``"exit code 1"``: how a worker process ended."""
    if code is None:
        return "unknown"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
