"""Cluster engines for ``parallel``: the :class:`ClusterEngine` contract (``base``) and
one module per engine. :func:`open_cluster` picks the engine from the URL's scheme and
imports its driver only then, so ``import foundry`` needs neither Dask nor Ray.

===============================  ============================================================
``local://`` (default)           Foundry's own worker processes on this machine (not an
                                 engine of this family: :mod:`foundry.execute.parallel`)
``tcp://scheduler:8786``         a Dask distributed scheduler (``dask://`` is the same);
                                 ``pip install "foundry-exec[dask]"``
``ray://head:10001``             a Ray cluster through Ray Client; ``ray://auto`` the
                                 cluster this machine belongs to; ``ray://local`` a private
                                 instance; ``pip install "foundry-exec[ray]"``
===============================  ============================================================

Every engine passes the same parallel conformance tests (``tests/execute/test_parallel.py``).
"""

from __future__ import annotations

from foundry.backends._registry import Engine, Registry
from foundry.backends.cluster.base import ChunkCall, ClusterEngine
from foundry.config import check_url
from foundry.errors import ConfigError

__all__ = ["ENGINES", "ChunkCall", "ClusterEngine", "is_local", "open_cluster"]

# scheme -> the engine's module and class, and the extra that installs its driver
ENGINES = Registry("cluster", __name__, hint=" (here and on the workers)")
ENGINES.add(("tcp", "dask"), Engine(".dask", "DaskCluster", "dask", ("dask", "distributed")))
ENGINES.add(("ray",), Engine(".ray", "RayCluster", "ray", ("ray",)))


def is_local(url: str | None) -> bool:
    """``True`` for the default: Foundry's own processes on this machine."""
    return url is None or url.split("://", 1)[0].lower() == "local"


def open_cluster(url: str) -> ClusterEngine:
    """Connect to the cluster at ``url``. An unknown scheme, a missing driver or a bad
    option is a :class:`~foundry.errors.ConfigError`; a cluster that cannot be reached
    within ``?connect_timeout=`` (10 s) a :class:`~foundry.errors.ClusterUnavailableError`.
    Close the engine when done."""
    if not isinstance(url, str) or not url:
        raise ConfigError(
            f"cluster URL {url!r} is not a URL. Fix: e.g. tcp://scheduler:8786 or ray://head:10001"
        )
    check_url("cluster", url)
    scheme = url.split("://", 1)[0].lower()
    if scheme == "local":
        raise ConfigError(
            "cluster URL 'local://' is Foundry's own processes, not a cluster engine. "
            "Fix: a bug in Foundry; report it"
        )
    engine: ClusterEngine = ENGINES.load(url)(url)
    return engine
