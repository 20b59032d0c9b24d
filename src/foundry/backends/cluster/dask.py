"""Dask distributed: chunks as tasks on an existing Dask cluster.

``tcp://scheduler:8786`` (or ``dask://scheduler:8786``, the same) connects a
``distributed.Client`` of Foundry's own (never the process's default client) to the
scheduler. Chunks are submitted as impure tasks with unique keys; the scheduler places
them on workers, re-runs a task whose worker died (up to its
``distributed.scheduler.allowed-failures``) and then gives up with ``KilledWorker``,
which becomes :class:`~foundry.errors.ClusterWorkerLostError` for that chunk's items.
A client that loses its scheduler cancels every future with
``scheduler-connection-lost``: :class:`~foundry.errors.ClusterUnavailableError`.

Cancel drops a chunk that is still waiting; a task already running finishes on its
worker (Dask cannot interrupt a running task) and its result is released unread.
Needs ``pip install "foundry-exec[dask]"`` here *and on the workers*, with the mapped
function's module importable there (it is sent by reference).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from distributed import Client
from distributed.client import FutureCancelledError
from distributed.scheduler import KilledWorker

from foundry.backends.cluster._common import CallbackCall, parse_url, probe, unavailable
from foundry.backends.cluster.base import ChunkCall
from foundry.errors import CancelledError, ClusterError, ClusterWorkerLostError

__all__ = ["DaskCluster"]

_FIX_REACH = (
    "start the scheduler (`dask scheduler`) and its workers (`dask worker tcp://HOST:8786`), "
    "or check the address and that this machine can reach it"
)

_FIX_LOST = (
    "restart the scheduler (its workers reconnect), or check the network between here and it; "
    "then run the map again"
)

_HANDSHAKE_TRIES = 3  # connection attempts when the handshake meets a broadcast


class DaskCluster:
    """A connection to one Dask scheduler (see the module docstring)."""

    kind = "dask"

    def __init__(self, url: str) -> None:
        where = parse_url(url)
        self.url = where.safe
        self._timeout = where.connect_timeout
        if where.port is None:
            raise unavailable(
                self.kind, self.url, "no port in the URL", "give host:port, e.g. tcp://HOST:8786"
            )
        probe(self.kind, where, _FIX_REACH)
        self._client = self._connect(f"tcp://{where.netloc}")

    def _connect(self, address: str) -> Any:
        """A client of the scheduler at ``address``. distributed's handshake asserts that
        the scheduler's first batch to a new client is its ``stream-start`` alone; a message
        the scheduler broadcasts to every client at that moment (another client cancelling
        a key the scheduler has already forgotten does) can share that batch, and the
        connection fails with a bare ``AssertionError``. That race is the scheduler's, not
        this connection's: try again, a bounded number of times."""
        attempt = 1
        while True:
            try:
                return Client(address, timeout=self._timeout, set_as_default=False)
            except (OSError, TimeoutError) as exc:
                raise unavailable(self.kind, self.url, f"{type(exc).__name__}: {exc}", _FIX_REACH) from exc
            except AssertionError as exc:
                if attempt >= _HANDSHAKE_TRIES:
                    raise unavailable(
                        self.kind,
                        self.url,
                        f"the scheduler's handshake failed {attempt} times running (distributed's "
                        f"client check: {exc!r})",
                        _FIX_REACH,
                    ) from exc
                attempt += 1

    def _check_running(self) -> None:
        if self._client.status != "running":
            raise unavailable(
                self.kind,
                self.url,
                f"the client lost its scheduler (status {self._client.status!r})",
                _FIX_LOST,
            )

    def cores(self) -> int:
        self._check_running()
        try:
            threads = self._client.nthreads(callback_timeout=self._timeout)
        except (OSError, TimeoutError) as exc:
            raise unavailable(self.kind, self.url, f"{type(exc).__name__}: {exc}", _FIX_REACH) from exc
        if not threads:
            try:
                self._client.wait_for_workers(1, timeout=self._timeout)
                threads = self._client.nthreads(callback_timeout=self._timeout)
            except (OSError, TimeoutError) as exc:
                raise ClusterError(
                    f"dask cluster at {self.url!r} has no worker (none joined within {self._timeout:g} s). "
                    "Fix: start workers with `dask worker tcp://HOST:8786`, or raise ?connect_timeout="
                ) from exc
        return max(1, int(sum(threads.values())))

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...], *, unit: str, chunk: int) -> ChunkCall:
        self._check_running()
        key = f"foundry-{unit}-chunk{chunk}-{uuid.uuid4().hex[:12]}"
        future: Any = None

        def translate(exc: BaseException) -> BaseException:
            return self._translate(exc, unit, chunk)

        def cancel() -> None:
            # Off this thread: a lost scheduler must not block the caller. A finished
            # future is left alone: cancelling a key the scheduler has forgotten is
            # broadcast to every client, and races their handshakes (see _connect).
            if future is not None and not future.done():
                client = self._client
                loop: Any = client.loop
                loop.add_callback(
                    client.cancel, [future], asynchronous=True, reason="foundry: the parallel run stopped"
                )

        call = CallbackCall(translate, cancel)
        try:
            future = self._client.submit(fn, *args, key=key, pure=False)
        except (OSError, TimeoutError) as exc:
            raise self._translate(exc, unit, chunk) from exc
        call.keep(future)  # a collected Future releases its task
        future.add_done_callback(lambda done: call.settle(done.result))
        return call

    def _translate(self, exc: BaseException, unit: str, chunk: int) -> BaseException:
        if isinstance(exc, KilledWorker):
            return ClusterWorkerLostError(unit, self.kind, f"chunk {chunk}: {exc}")
        if isinstance(exc, FutureCancelledError):
            if exc.reason == "scheduler-connection-lost":
                return unavailable(
                    self.kind,
                    self.url,
                    f"the scheduler went away while chunk {chunk} of {unit!r} was computing",
                    _FIX_LOST,
                )
            return CancelledError(f"parallel {unit!r}: chunk {chunk} was cancelled ({exc.reason})")
        if isinstance(exc, OSError | TimeoutError):
            return unavailable(
                self.kind,
                self.url,
                f"the connection to the scheduler broke at chunk {chunk} of {unit!r} "
                f"({type(exc).__name__}: {exc})",
                _FIX_LOST,
            )
        return ClusterError(
            f"parallel {unit!r}: the dask cluster at {self.url!r} could not compute chunk {chunk} "
            f"({type(exc).__name__}: {exc}). Fix: the workers must run the same code and packages as "
            "this process (the function is sent by reference): install them on every worker"
        )

    def close(self) -> None:
        try:
            self._client.close(timeout=self._timeout)
        except Exception:  # already gone: nothing to release
            pass
