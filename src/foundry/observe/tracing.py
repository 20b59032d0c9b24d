"""Tracing: whether an app traces its durable work, and the tracer when it does.

OpenTelemetry is optional (``pip install 'foundry-exec[otel]'``: the API only; the SDK
and an exporter are the application's choice). This module never imports it by itself:

* ``Foundry(tracing=True)`` (or ``FOUNDRY_TRACING=on``): trace; the API must be
  installed (a :class:`~foundry.errors.ConfigError` at construction otherwise). Spans go
  to whatever ``TracerProvider`` the application sets, whenever it sets it.
* ``Foundry(tracing=provider)``: trace on that ``TracerProvider`` and not the global one
  (an app among others in one process, a test with an in-memory exporter).
* ``Foundry(tracing=False)`` (or ``FOUNDRY_TRACING=off``): never trace, never import it.
* the default, *auto*: trace once the application has imported OpenTelemetry **and** set
  a real ``TracerProvider`` (``trace.set_tracer_provider(...)``, or
  ``opentelemetry-instrument``); until then Foundry does not import it and pays one
  dictionary lookup per submit (and, once OpenTelemetry is imported, asks it for the
  provider at most once a second). A provider set after ``Foundry()`` is seen within a
  second.

:meth:`Tracing.tracer` is the one question the runtimes ask: ``None`` (not tracing)
or a :class:`foundry.observe._otel.Tracer`. What is traced and under which names:
``docs/tracing.md``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from foundry.errors import ConfigError

if TYPE_CHECKING:
    from foundry.decide.model import Decision
    from foundry.observe._otel import Tracer

__all__ = ["OFF", "Tracing", "decision_attributes", "messaging_system", "parse_tracing"]

# messaging.system per engine (OpenTelemetry's well-known values where there is one)
_SYSTEMS = {
    "amqp": "rabbitmq",
    "amqps": "rabbitmq",
    "redis": "redis",
    "rediss": "redis",
    "nats": "nats",
    "tls": "nats",
    "postgresql": "postgresql",
    "postgres": "postgresql",
}

_LOOK_EVERY = 1.0  # seconds between two looks of auto mode for a TracerProvider
_WORDS = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False, "auto": None}


def parse_tracing(value: object, where: str) -> bool | None:
    """``True`` (on), ``False`` (off) or ``None`` (auto) from an argument or a variable (a
    ``TracerProvider`` is on)."""
    if value is None or isinstance(value, bool):
        return value
    if callable(getattr(value, "get_tracer", None)):
        return True
    if isinstance(value, str) and value.strip().lower() in _WORDS:
        return _WORDS[value.strip().lower()]
    raise ConfigError(
        f"{where}: {value!r} is not a tracing setting. Fix: tracing=True (on), False (off), or leave it "
        "out (auto: on once an OpenTelemetry TracerProvider is set); FOUNDRY_TRACING=on|off|auto"
    )


class Tracing:
    """An app's tracing switch (see the module docstring)."""

    __slots__ = ("_lock", "_looked", "_provider", "_tracer", "mode")

    def __init__(self, mode: bool | None = None, provider: Any = None) -> None:
        self.mode = True if provider is not None else mode  # True on, False off, None auto
        self._provider = provider  # None: the global TracerProvider
        self._tracer: Tracer | None = None
        self._lock = threading.Lock()
        self._looked = -_LOOK_EVERY  # monotonic time auto mode last asked for a provider
        if self.mode:
            self._tracer = self._make()

    @classmethod
    def from_setting(cls, value: object) -> Tracing:
        """The switch for ``Foundry(tracing=value)``: the argument, else ``FOUNDRY_TRACING``,
        else auto."""
        if value is None and os.environ.get("FOUNDRY_TRACING", "").strip():
            return cls(parse_tracing(os.environ["FOUNDRY_TRACING"], "FOUNDRY_TRACING"))
        mode = parse_tracing(value, "Foundry(tracing=...)")
        return cls(mode, provider=value if mode and not isinstance(value, bool | str) else None)

    def tracer(self) -> Tracer | None:
        """The tracer, or ``None`` when this app does not trace (now)."""
        tracer = self._tracer
        if tracer is not None or self.mode is False:
            return tracer
        if "opentelemetry.trace" not in sys.modules:  # auto: the application never imported it
            return None
        now = time.monotonic()
        if now - self._looked < _LOOK_EVERY:  # asking the API costs microseconds: once a second
            return None
        self._looked = now
        from foundry.observe._otel import provider_is_set

        if not provider_is_set():
            return None
        with self._lock:
            if self._tracer is None:
                self._tracer = self._make()
            return self._tracer

    def _make(self) -> Tracer:
        try:
            from foundry.observe._otel import Tracer
        except ImportError as exc:
            raise ConfigError(
                f"tracing is on, but OpenTelemetry's API cannot be imported ({exc}). Fix: "
                "pip install 'foundry-exec[otel]' (and an SDK with an exporter), or tracing=False"
            ) from exc
        return Tracer(self._provider)

    def __repr__(self) -> str:
        mode = {True: "on", False: "off", None: "auto"}[self.mode]
        return f"Tracing({mode}, {'tracing' if self._tracer is not None else 'idle'})"


def messaging_system(url: str) -> str:
    """``messaging.system`` of a store URL: ``rabbitmq``, ``redis``, ``nats``,
    ``postgresql`` or ``sqlite`` (the embedded default, and any path)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    return _SYSTEMS.get(scheme, "sqlite")


def decision_attributes(unit: str, decision: Decision) -> dict[str, Any]:
    """The unit's decision as span attributes (``foundry.*``)."""
    return {
        "foundry.unit": unit,
        "foundry.delivery": decision.delivery,
        "foundry.execution": decision.execution,
        "foundry.decided_by": decision.decided_by,
        "foundry.delivery_decided_by": decision.delivery_decided_by,
        "foundry.overridden": decision.overridden,
    }


OFF = Tracing(False)
"""The switch of a runtime made without an app (tests, tools): never traces."""
