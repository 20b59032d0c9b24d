"""The cluster engine contract: the cut between ``parallel`` and a compute cluster.

``parallel`` (:mod:`foundry.execute.parallel`) plans a map into chunks, sends each
chunk to be computed, and merges the results in input order. Where a chunk is computed
is the only thing an engine decides: Foundry's own worker processes on this machine
(the default, not an engine of this family: it lives in ``execute/``), or a cluster
that the user already runs — Dask distributed (``tcp://scheduler:8786``) or Ray
(``ray://head:10001``). Engines are siblings, one module each, registered by URL scheme
in :mod:`foundry.backends.cluster`; each imports its driver when it is opened, so
``import foundry`` needs neither.

An engine carries **one chunk call** at a time to the cluster and brings back what
happened. The runtime owns everything else — the plan, item-level errors (the chunk
function records them, it does not raise), the bound on chunks in flight, deadlines,
cancellation, the merge and the metrics — so those behave the same on every engine.

The contract (checked on every engine by ``tests/execute/test_parallel.py``, the same
conformance tests the local processes pass, parametrized over local, Dask and Ray;
engine-specific faults in ``tests/execute/test_parallel_cluster.py``):

* **Open fails fast and clearly.** Opening an engine connects within ``connect_timeout``
  (URL option, default 10 s) or raises :class:`~foundry.errors.ClusterUnavailableError`
  naming the URL (password masked) and the fix; a missing driver is a
  :class:`~foundry.errors.ConfigError` naming the extra to install.
* **Cores are what the cluster offers now.** :meth:`ClusterEngine.cores` is the number
  of chunks the cluster can compute at once (Dask: the workers' threads; Ray: its CPUs),
  asked each run, so a cluster that grew or shrank is planned for as it is.
* **One answer per call, exactly once.** ``submit`` returns at once; the call's
  ``add_done_callback`` callbacks run once the outcome is final (at once if it already
  is), from an engine thread, never while the engine holds a lock the caller might need.
  :meth:`ChunkCall.outcome` is then either the chunk function's return value or one of
  the errors below — never a driver's exception.
* **What a cluster can throw is mapped.** A worker that died computing the chunk, after
  the cluster's own re-runs of it (Dask's scheduler re-runs a lost task up to its
  ``distributed.scheduler.allowed-failures``, default 3; the Ray engine asks for the
  same with ``max_retries=3``), is :class:`~foundry.errors.ClusterWorkerLostError`
  (also a :class:`~foundry.errors.ChildCrashedError`, as a dead local child is); a
  scheduler or head node that went away is :class:`~foundry.errors.ClusterUnavailableError`;
  anything else the driver raises is :class:`~foundry.errors.ClusterError` with the
  driver's message. Each names the engine, the chunk and the fix.
* **Re-runs are the cluster's, and only for lost workers.** A chunk whose worker died
  may be computed more than once (by the cluster's re-runs above); its result is
  delivered once. An engine never re-sends a chunk by itself otherwise.
* **Cancel is best effort and never blocks.** :meth:`ChunkCall.cancel` drops a chunk
  that has not started. A chunk already computing is interrupted where the engine can
  (Ray interrupts the task), and otherwise finishes on its worker with its result
  discarded (Dask cannot stop a running task; the planner keeps chunks to at most
  ~0.1 s of estimated work, so this is short). Its outcome, if it still arrives, is
  ignored by the runtime.
* **Payloads are the runtime's.** The chunk function and its arguments (the mapped
  function by reference, the items already pickled by the runtime) are sent with the
  driver's own serializer; an engine never unpickles anything on the caller's side but
  the chunk's return value.
* **close() releases what the engine opened** (its client, its connection), never the
  cluster itself — except a private local instance that the engine started for
  ``ray://local``, which it shuts down.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from foundry.handle import Outcome

__all__ = ["ChunkCall", "ClusterEngine"]


@runtime_checkable
class ChunkCall(Protocol):
    """One chunk sent to the cluster (shaped like the in-process ``Task``)."""

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Run ``callback()`` once the outcome is final (now, if it already is)."""
        ...

    def outcome(self) -> Outcome:
        """The chunk function's value, or a mapped Foundry error. Only after done."""
        ...

    def cancel(self) -> bool:
        """Drop the chunk if it has not started; interrupt it where the engine can.
        Returns ``True`` when the request was passed on (not a promise it stopped)."""
        ...


@runtime_checkable
class ClusterEngine(Protocol):
    """A connection to one compute cluster (see the module docstring for the contract)."""

    kind: str
    """``"dask"`` or ``"ray"``: the metric label and what messages call it."""
    url: str
    """The URL it was opened with, password masked (safe to print)."""

    def cores(self) -> int:
        """Chunks the cluster can compute at once now (≥ 1). Raises
        :class:`~foundry.errors.ClusterUnavailableError` when the cluster is gone, or
        :class:`~foundry.errors.ClusterError` when it has no worker at all."""
        ...

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...], *, unit: str, chunk: int) -> ChunkCall:
        """Compute ``fn(*args)`` on one worker. ``unit`` and ``chunk`` name the call in
        the cluster's own dashboard (``foundry-<unit>-chunk<N>-…``) and in errors. Raises
        :class:`~foundry.errors.ClusterUnavailableError` at once when the cluster is gone."""
        ...

    def close(self) -> None:
        """Release the client/connection this engine opened. Idempotent."""
        ...
