"""The cut between the app (which knows units) and the runtimes (which run them).

``app`` builds a :class:`UnitSpec` for each declared unit and asks the runtime that
its Decision names for a :class:`Runner`. Runtimes (``execute/``, ``deliver/``) see
only these types, never the app.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from foundry.config import Settings
from foundry.decide.model import Decision
from foundry.handle import Handle
from foundry.observe.metrics import Registry
from foundry.observe.tracing import OFF, Tracing
from foundry.serialize import DEFAULT_ERROR_TYPES, ErrorTypes
from foundry.traits import Traits

__all__ = ["Closers", "Runner", "RuntimeContext", "SubmitOptions", "UnitSpec"]


@dataclass(frozen=True, slots=True)
class UnitSpec:
    """Everything a runtime needs to know about one unit of work."""

    name: str
    fn: Callable[..., Any]
    traits: Traits
    decision: Decision  # the unit's main decision
    phases: Mapping[str, Decision] = field(default_factory=dict)
    phase_traits: Mapping[str, Traits] = field(default_factory=dict)  # each phase's own traits
    is_async: bool = False
    module: str = ""  # importable module of fn ("" when not importable)
    qualname: str = ""
    # The exception types its error records may be rebuilt as (builtins, Foundry's, its
    # module's, its errors=/retry_on= types and the app's registered ones).
    errors: ErrorTypes = DEFAULT_ERROR_TYPES


@dataclass(frozen=True, slots=True)
class SubmitOptions:
    """Per-submission options (``unit.options(...)``). Durable runtimes honour all of
    them; in-process runtimes honour ``timeout`` and reject the rest clearly."""

    key: str | None = None  # idempotency key: a duplicate returns the first handle
    delay: float | None = None  # seconds from now
    eta: float | None = None  # absolute unix time
    priority: int = 0  # higher runs first
    timeout: float | None = None  # per-task timeout, overrides the unit's
    deadline: float | None = None  # work pool: the whole request's budget, overrides the unit's


class Runner(Protocol):
    """Runs one unit on one model."""

    def submit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        """Accept the work (bounded intake) and return its handle at once."""
        ...

    async def asubmit(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions) -> Handle:
        """Same, from async code, without blocking the loop."""
        ...

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run to completion and return the result (``unit(...)``). Sequential runs inline."""
        ...

    def close(self, timeout: float = 10.0) -> None:
        """Stop accepting, drain accepted work within ``timeout``, release resources."""
        ...


class Closers:
    """What a runtime opened on the app's behalf outside a runner (a handle's connection,
    a shared store) and must give back when the app closes: each registers a closer once,
    by key, and ``app.close()`` runs them. The app never has to know which runtime
    modules were imported."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closers: dict[str, Callable[[], None]] = {}

    def add(self, key: str, close: Callable[[], None]) -> None:
        """Run ``close`` when the app closes (a second ``add`` with the same key keeps the first)."""
        with self._lock:
            self._closers.setdefault(key, close)

    def close(self) -> None:
        """Run every closer once, in the order they were added; one that raises is logged and
        the others still run."""
        with self._lock:
            closers, self._closers = list(self._closers.values()), {}
        for close in closers:
            try:
                close()
            except Exception:
                logging.getLogger("foundry").exception("closing a runtime resource failed")


@dataclass(frozen=True, slots=True)
class RuntimeContext:
    """What the app hands every runtime factory ``make_runner(spec, ctx)``."""

    app_name: str
    settings: Settings
    metrics: Registry
    lookup: Callable[[str], UnitSpec]  # unit name -> spec (for workers and workflows)
    errors: ErrorTypes = DEFAULT_ERROR_TYPES  # the app's allow-list (``app.errors``)
    tracing: Tracing = OFF  # the app's OpenTelemetry switch (``Foundry(tracing=...)``)
    closers: Closers = field(default_factory=Closers)  # the app's: run by app.close()
