"""The concurrency lab: capacity answers before production gives them.

Closed forms where they exist, simulation where they do not, both side by side where
both apply — and every number labelled with the method that produced it.

- :mod:`~foundry.lab.queueing`: M/M/c (exact Erlang C, stable for large c), Allen–Cunneen
  and Sakasegawa G/G/c approximations, Little's law, exact M/M/c percentiles;
- :mod:`~foundry.lab.sim`: seeded discrete-event simulation of G/G/c with Poisson,
  deterministic, gamma, hyperexponential and batch arrivals; replications and CIs;
- :mod:`~foundry.lab.permits`: bounding concurrency with permits against a downstream;
- :mod:`~foundry.lab.servers`: thread per request vs fixed pool vs async;
- :mod:`~foundry.lab.loop`: the loop-starvation schedule and its liveness budget;
- :mod:`~foundry.lab.fit`: pool size, permits and intake bound from measurements;
- :mod:`~foundry.lab.plot`: PNG/SVG plots (needs the ``lab`` extra: matplotlib).

Nothing here imports numpy or matplotlib at import time.
"""

from foundry.lab.distributions import Dist
from foundry.lab.fit import Fit, Measured, load_csv, load_snapshot, recommend
from foundry.lab.loop import LoopSchedule, LoopSettings, schedule
from foundry.lab.permits import PermitRow, PermitSettings, simulate_permits, sweep
from foundry.lab.queueing import (
    ALLEN_CUNNEEN,
    ERLANG_C,
    SAKASEGAWA,
    Metrics,
    PoolAnalysis,
    allen_cunneen,
    analyse_pool,
    erlang_b,
    erlang_c,
    mmc,
    sakasegawa,
    workers_for,
)
from foundry.lab.servers import ServerResult, ServerSettings, compare
from foundry.lab.sim import PoolSim, simulate_pool
from foundry.lab.stats import Estimate

__all__ = [
    "ALLEN_CUNNEEN",
    "ERLANG_C",
    "SAKASEGAWA",
    "Dist",
    "Estimate",
    "Fit",
    "LoopSchedule",
    "LoopSettings",
    "Measured",
    "Metrics",
    "PermitRow",
    "PermitSettings",
    "PoolAnalysis",
    "PoolSim",
    "ServerResult",
    "ServerSettings",
    "allen_cunneen",
    "analyse_pool",
    "compare",
    "erlang_b",
    "erlang_c",
    "load_csv",
    "load_snapshot",
    "mmc",
    "recommend",
    "sakasegawa",
    "schedule",
    "simulate_permits",
    "simulate_pool",
    "sweep",
    "workers_for",
]
