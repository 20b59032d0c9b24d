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

import importlib

from foundry.backends.cluster.base import ChunkCall, ClusterEngine
from foundry.config import check_url, safe_url
from foundry.errors import ConfigError

__all__ = ["ENGINES", "ChunkCall", "ClusterEngine", "is_local", "open_cluster"]

# scheme -> (module, engine class, the driver modules it imports, the extra that installs them)
ENGINES: dict[str, tuple[str, str, tuple[str, ...], str]] = {
    "tcp": ("foundry.backends.cluster.dask", "DaskCluster", ("dask", "distributed"), "dask"),
    "ray": ("foundry.backends.cluster.ray", "RayCluster", ("ray",), "ray"),
}
ENGINES["dask"] = ENGINES["tcp"]


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
    module_name, class_name, drivers, extra = ENGINES[scheme]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        root = (exc.name or "").split(".")[0]
        if root in drivers:
            raise ConfigError(
                f"cluster URL {safe_url(url)!r} needs the {root!r} library, which is not installed. "
                f'Fix: pip install "foundry-exec[{extra}]" (here and on the workers)'
            ) from exc
        raise
    engine: ClusterEngine = getattr(module, class_name)(url)
    return engine
