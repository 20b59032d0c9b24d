"""Each family finds its engines by name in one registry (``foundry.backends._registry``):
every scheme Foundry accepts for a family has an engine, and every engine registered
names a module and a class that exist, with the extra that installs its driver."""

from __future__ import annotations

import importlib.util

import pytest

from foundry.backends import cluster, journal, pool, queue, stream
from foundry.backends._registry import Registry
from foundry.config import SCHEMES
from foundry.errors import ConfigError

FAMILIES: dict[str, Registry] = {
    "queue": queue.ENGINES,
    "stream": stream.ENGINES,
    "journal": journal.ENGINES,
    "pool": pool.ENGINES,
    "cluster": cluster.ENGINES,
}
DRIVERLESS = {"sqlite", "memory", "local", "served"}  # the standard library is enough


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_accepted_scheme_has_an_engine(family: str) -> None:
    registered = set(FAMILIES[family].schemes())
    accepted = set(SCHEMES[family])
    if family == "pool":  # keyed by engine name: local:// is "local" or "served"
        accepted = (accepted - {"local"}) | {"local", "served"}
    if family == "cluster":  # local:// is Foundry's own processes, not an engine
        accepted -= {"local"}
    assert registered == accepted


@pytest.mark.parametrize(
    ("family", "scheme"), [(f, s) for f, r in sorted(FAMILIES.items()) for s in r.schemes()]
)
def test_every_engine_names_a_module_and_an_extra(family: str, scheme: str) -> None:
    registry = FAMILIES[family]
    engine = registry.engines()[scheme]
    module = importlib.util.resolve_name(engine.module, registry.package)
    assert importlib.util.find_spec(module) is not None, module
    assert module.startswith(f"foundry.backends.{family}.")
    if scheme in DRIVERLESS:
        assert (engine.extra, engine.drivers) == ("", ())
    else:
        assert engine.extra, (family, scheme)
        assert engine.drivers, (family, scheme)


def test_the_class_is_loaded_by_name_and_a_typo_says_the_fix() -> None:
    assert queue.ENGINES.load("sqlite:///q.db").__name__ == "SqliteQueue"
    assert stream.ENGINES.load("memory://").__name__ == "SqliteStreamBackend"
    assert journal.ENGINES.load("memory://").__name__ == "SqliteJournal"
    with pytest.raises(ConfigError, match=r"did you mean redis://"):
        queue.ENGINES.load("rdis://localhost")
