"""Observability: one metrics registry, stable names, exporters."""

from foundry.observe import names
from foundry.observe.metrics import Counter, Gauge, Histogram, Registry

__all__ = ["Counter", "Gauge", "Histogram", "Registry", "names"]
