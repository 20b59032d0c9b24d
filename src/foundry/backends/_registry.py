"""Engines by name: each family (queue, stream, journal, pool, cluster) keeps one
:class:`Registry` in its ``__init__`` that maps a URL scheme to the module and class of
its engine and to the extra that installs the engine's driver — as anyio names its
backends — so an engine is found by its scheme, never by looking at what a module
defines, and its driver is imported only when a URL asks for it.

Opening a URL whose driver is not installed is a :class:`~foundry.errors.ConfigError`
naming the extra to install (``pip install "foundry-exec[redis]"``), never a bare
``ModuleNotFoundError``. Adding an engine is one :meth:`Registry.add` line in its
family's ``__init__``.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from foundry.config import check_url, safe_url
from foundry.errors import ConfigError

__all__ = ["AMQP", "PSYCOPG", "Engine", "Registry"]

# the drivers of the extras more than one family uses
PSYCOPG = ("psycopg", "psycopg_binary", "psycopg_c", "psycopg_pool")  # postgres
AMQP = ("aio_pika", "aiormq", "pamqp")  # rabbitmq


@dataclass(frozen=True, slots=True)
class Engine:
    """Where an engine lives and what it needs: ``module`` (relative to the family's
    package: ``".redis"``) defines the class ``name``;
    ``drivers`` are the top-level modules it imports that ``pip install
    "foundry-exec[<extra>]"`` brings (none for an engine on the standard library)."""

    module: str
    name: str
    extra: str = ""
    drivers: tuple[str, ...] = ()


class Registry:
    """The engines of one family, by URL scheme (see the module docstring)."""

    def __init__(
        self, family: str, package: str, *, hint: str = "", key: Callable[[str], str] | None = None
    ) -> None:
        self.package = package  # the family's package, which relative engine modules are in
        self._key = key  # the engine name of a URL, where the scheme alone does not say it
        self.family = family  # "queue", "stream"… as in messages and ``foundry.config.SCHEMES``
        self._hint = hint  # appended to a missing driver's fix (a cluster's workers need it too)
        self._engines: dict[str, Engine] = {}

    def add(self, schemes: tuple[str, ...], engine: Engine) -> None:
        """Register ``engine`` for each of ``schemes`` (``("redis", "rediss")``; engine
        names, with a ``key``)."""
        for scheme in schemes:
            self._engines[scheme] = engine

    def schemes(self) -> list[str]:
        return sorted(self._engines)

    def engines(self) -> dict[str, Engine]:
        """Every registered engine by scheme (or engine name)."""
        return dict(self._engines)

    def engine(self, url: str) -> Engine:
        """The engine of ``url``'s scheme (a typo or an unknown scheme is a ConfigError)."""
        check_url(self.family, url)
        scheme = self._key(url) if self._key is not None else url.split("://", 1)[0].lower()
        found = self._engines.get(scheme)
        if found is None:
            raise ConfigError(
                f"{self.family} URL {safe_url(url)!r}: no {self.family} engine serves {scheme}://. "
                f"Fix: use one of {', '.join(s + '://' for s in self.schemes())}"
            )
        return found

    def module(self, url: str, module: str | None = None) -> Any:
        """Import the module of ``url``'s engine (or ``module``, another one of the same
        engine, such as its worker host), mapping a missing driver to a ConfigError."""
        engine = self.engine(url)
        name = importlib.util.resolve_name(module or engine.module, self.package)
        try:
            return importlib.import_module(name)
        except ImportError as exc:  # ModuleNotFoundError, or a driver broken on import
            root = (exc.name or "").split(".")[0]
            if root in engine.drivers:
                raise ConfigError(
                    f"{self.family} URL {safe_url(url)!r} needs the {root!r} client library, which is not "
                    f'installed. Fix: pip install "foundry-exec[{engine.extra}]"{self._hint}'
                ) from exc
            if exc.name == name:
                raise ConfigError(
                    f"{self.family} URL {safe_url(url)!r}: its engine ({name}) is not part of this "
                    "installation. Fix: upgrade foundry-exec"
                ) from exc
            raise

    def load(self, url: str) -> Any:
        """The engine class of ``url`` (its module imported, see :meth:`module`)."""
        return getattr(self.module(url), self.engine(url).name)
