"""Ray: chunks as Ray tasks.

=======================  ===========================================================
``ray://head:10001``     Ray Client: a remote driver connects to the head node
``ray://auto``           the cluster this machine is a node of (``ray.init("auto")``)
``ray://local``          a private Ray instance started here (development, tests);
                         ``?num_cpus=N`` sizes it; shut down when the engine closes
=======================  ===========================================================

Options: ``?max_retries=3`` (how many times Ray re-runs a chunk whose worker died),
``?connect_timeout=10``.

Ray allows one connection per process: an engine reuses the connection already made
(by another engine, or by your own ``ray.init``, whatever its address). A connection
the engines made is closed (a ``ray://local`` instance shut down) when the last engine
using it closes; one your code made is left alone.

Chunks are tasks of one CPU each with ``max_retries=3`` (Ray re-runs a task whose
worker process or node died, as Dask's scheduler does; ``?max_retries=0`` fails the
chunk at the first loss, for work that crashes its worker) and ``retry_exceptions=False``
(item errors are recorded by the chunk function, never raised). A task that still lost
its worker is :class:`~foundry.errors.ClusterWorkerLostError`; a lost head node or
client connection is :class:`~foundry.errors.ClusterUnavailableError`. Cancel drops a
waiting task and interrupts a running one (``ray.cancel``).
Needs ``pip install "foundry-exec[ray]"`` here and the same Ray version on the cluster.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import ray
from ray import exceptions as rx

from foundry.backends.cluster._common import CallbackCall, parse_url, probe, unavailable
from foundry.backends.cluster.base import ChunkCall
from foundry.errors import CancelledError, ClusterError, ClusterWorkerLostError, ConfigError

__all__ = ["RayCluster"]

LOST_RETRIES = 3
_FIX_REACH = (
    "start the head node (`ray start --head`), check the address (Ray Client listens on 10001), "
    "and that this machine can reach it"
)

_lock = threading.Lock()
_users = 0
_opened_here = False
_remote: dict[Callable[..., Any], Any] = {}

# Ray Client's proxy forks a server per client; that fork sometimes dies at birth (it races
# the proxy's own gRPC threads) and the client is told "Initialization failure from server".
# Nothing is wrong with the cluster: a second connection gets a fresh server.
_INIT_ATTEMPTS = 3


def _init(ray_module: Any, kwargs: dict[str, Any], kind: str, url: str) -> None:
    for attempt in range(1, _INIT_ATTEMPTS + 1):
        try:
            ray_module.init(**kwargs)
            return
        except (ConnectionError, OSError, TimeoutError, rx.RayError) as exc:
            born_dead = isinstance(exc, ConnectionAbortedError) and "Initialization failure" in str(exc)
            if not born_dead or attempt == _INIT_ATTEMPTS:
                raise unavailable(kind, url, f"{type(exc).__name__}: {exc}", _FIX_REACH) from exc
            with contextlib.suppress(Exception):
                ray_module.shutdown()
            time.sleep(0.5 * attempt)


class RayCluster:
    """A connection to one Ray cluster (see the module docstring)."""

    kind = "ray"

    def __init__(self, url: str) -> None:
        global _users, _opened_here
        where = parse_url(url, known=("num_cpus", "max_retries"))
        self.url = where.safe
        self._closed = False
        self._retries = LOST_RETRIES
        if "max_retries" in where.options:
            try:
                self._retries = int(where.options["max_retries"])
            except ValueError:
                self._retries = -1
            if self._retries < 0:
                raise ConfigError(
                    f"cluster URL {self.url!r}: max_retries must be an integer ≥ 0. Fix: ?max_retries=3"
                )
        host = where.netloc.lower()
        kwargs: dict[str, Any] = {"logging_level": logging.WARNING}
        if host == "local":
            kwargs.update(include_dashboard=False, log_to_driver=False)
            if "num_cpus" in where.options:
                try:
                    kwargs["num_cpus"] = int(where.options["num_cpus"])
                except ValueError:
                    kwargs["num_cpus"] = 0
                if kwargs["num_cpus"] < 1:
                    raise ConfigError(
                        f"cluster URL {self.url!r}: num_cpus must be an integer ≥ 1. Fix: ?num_cpus=2"
                    )
        elif "num_cpus" in where.options:
            raise ConfigError(
                f"cluster URL {self.url!r}: num_cpus sizes a private instance only. Fix: use ray://local?num_cpus=N"
            )
        elif host == "auto":
            kwargs["address"] = "auto"
        else:
            if where.port is None:
                raise unavailable(
                    self.kind, self.url, "no port in the URL", "give host:port, e.g. ray://HEAD:10001"
                )
            probe(self.kind, where, _FIX_REACH)
            kwargs["address"] = f"ray://{where.netloc}"
        with _lock:
            if not ray.is_initialized():
                _init(ray, kwargs, self.kind, self.url)
                _opened_here = True
            _users += 1

    def cores(self) -> int:
        try:
            cpus = float(ray.cluster_resources().get("CPU", 0))
        except (ConnectionError, OSError, rx.RayError) as exc:
            raise unavailable(self.kind, self.url, f"{type(exc).__name__}: {exc}", _FIX_REACH) from exc
        if cpus < 1:
            raise ClusterError(
                f"ray cluster at {self.url!r} offers no CPU. "
                "Fix: add worker nodes (`ray start --address=HEAD:6379`)"
            )
        return int(cpus)

    def _remote_of(self, fn: Callable[..., Any]) -> Any:
        with _lock:
            remote = _remote.get(fn)
            if remote is None:
                remote = _remote[fn] = ray.remote(num_cpus=1, retry_exceptions=False)(fn)
            return remote

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...], *, unit: str, chunk: int) -> ChunkCall:
        remote = self._remote_of(fn)
        ref: Any = None

        def translate(exc: BaseException) -> BaseException:
            return self._translate(exc, unit, chunk)

        def cancel() -> None:
            if ref is not None:
                ray.cancel(ref, force=False)

        call = CallbackCall(translate, cancel)
        try:
            ref = remote.options(name=f"foundry-{unit}-chunk{chunk}", max_retries=self._retries).remote(*args)
            future = ref.future()
        except (ConnectionError, OSError, rx.RayError) as exc:
            raise self._translate(exc, unit, chunk) from exc
        call.keep(ref)
        future.add_done_callback(lambda done: call.settle(done.result))
        return call

    def _translate(self, exc: BaseException, unit: str, chunk: int) -> BaseException:
        if isinstance(
            exc, rx.WorkerCrashedError | rx.NodeDiedError | rx.OutOfMemoryError | rx.ObjectLostError
        ):
            return ClusterWorkerLostError(unit, self.kind, f"chunk {chunk}: {type(exc).__name__}: {exc}")
        if isinstance(exc, rx.TaskCancelledError):
            return CancelledError(f"parallel {unit!r}: chunk {chunk} was cancelled")
        if isinstance(exc, ConnectionError | OSError | rx.LocalRayletDiedError | rx.RaySystemError):
            return unavailable(
                self.kind,
                self.url,
                f"lost while chunk {chunk} of {unit!r} was computing ({type(exc).__name__}: {exc})",
                "restart the head node (or check the network to it), then run the map again",
            )
        cause = exc.cause if isinstance(exc, rx.RayTaskError) and exc.cause is not None else exc
        return ClusterError(
            f"parallel {unit!r}: the ray cluster at {self.url!r} could not compute chunk {chunk} "
            f"({type(cause).__name__}: {cause}). Fix: the workers must run the same code and packages as "
            "this process (the function is sent by reference): install them on every node"
        )

    def close(self) -> None:
        global _users, _opened_here
        with _lock:
            if self._closed:
                return
            self._closed = True
            _users -= 1
            if _users == 0 and _opened_here:
                _opened_here = False
                _remote.clear()
                ray.shutdown()
