"""One metrics registry for every model: counters, gauges, histograms, collected gauges.

Names are stable (see :mod:`foundry.observe.names`); every model registers under them
with labels (``unit``, ``queue``, ``stage``, ``group``, ``partition`` ...). The registry
is readable as a dict (:meth:`Registry.snapshot`) and as Prometheus text
(:meth:`Registry.prometheus`).

Hot paths pay one uncontended lock and an add per event. Gauges whose value lives
elsewhere (queue depth in a database, the age of the oldest queued item) are
*collected*: a callback runs only when someone reads the registry.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

__all__ = [
    "DEFAULT_BUCKETS",
    "Counter",
    "Gauge",
    "Histogram",
    "Registry",
]

DEFAULT_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
_RATE_WINDOW = 10  # seconds of history for throughput

LabelKey = tuple[str, ...]


class Counter:
    """A monotonically increasing count, with a rolling per-second rate."""

    __slots__ = ("_buckets", "_lock", "_second", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self._lock = threading.Lock()
        self._buckets: deque[tuple[int, float]] = deque(maxlen=_RATE_WINDOW + 1)
        self._second = -1

    def inc(self, amount: float = 1.0) -> None:
        now = int(time.monotonic())
        with self._lock:
            self.value += amount
            if now == self._second:
                second, count = self._buckets[-1]
                self._buckets[-1] = (second, count + amount)
            else:
                self._second = now
                self._buckets.append((now, amount))

    def rate(self, window: int = _RATE_WINDOW) -> float:
        """Events per second over the last ``window`` complete seconds."""
        now = int(time.monotonic())
        with self._lock:
            total = sum(c for s, c in self._buckets if now - window <= s < now)
        return total / window


class Gauge:
    """A value that goes up and down (in-flight, busy workers, buffer fill)."""

    __slots__ = ("_lock", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self._lock = threading.Lock()

    def set(self, value: float) -> None:
        self.value = float(value)

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value -= amount


class Histogram:
    """Bucketed observations for Prometheus, plus a recent window for p50/p99/max."""

    __slots__ = ("_lock", "buckets", "count", "counts", "max", "recent", "sum")

    def __init__(self, buckets: tuple[float, ...] = DEFAULT_BUCKETS, window: int = 2048) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.count = 0
        self.sum = 0.0
        self.max = 0.0
        self.recent: deque[float] = deque(maxlen=window)
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self.buckets, value)
        with self._lock:
            self.counts[index] += 1
            self.count += 1
            self.sum += value
            if value > self.max:
                self.max = value
            self.recent.append(value)

    def observe_many(self, values: Iterable[float]) -> None:
        """Record several observations under one lock (hot paths that buffer and flush)."""
        observed = values if isinstance(values, list | tuple) else list(values)
        if not observed:
            return
        buckets, where = self.buckets, bisect.bisect_left
        indices = [where(buckets, v) for v in observed]  # (a stream consumer's: once per event)
        total, top = sum(observed), max(observed)
        with self._lock:
            counts = self.counts
            for index in indices:
                counts[index] += 1
            self.sum += total
            if top > self.max:
                self.max = top
            self.recent.extend(observed)
            self.count += len(observed)

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of the recent window (0.0 when empty)."""
        with self._lock:
            data = sorted(self.recent)
        if not data:
            return 0.0
        rank = min(len(data) - 1, max(0, math.ceil(q * len(data)) - 1))
        return data[rank]

    def summary(self) -> dict[str, float]:
        return {
            "count": float(self.count),
            "sum": self.sum,
            "p50": self.quantile(0.50),
            "p99": self.quantile(0.99),
            "max": self.max,
        }


M = TypeVar("M", Counter, Gauge, Histogram)


class Family(Generic[M]):
    """A metric name with its label names; ``labels(...)`` returns the child."""

    def __init__(
        self, name: str, help: str, kind: str, labelnames: tuple[str, ...], make: Callable[[], M]
    ) -> None:
        self.name = name
        self.help = help
        self.kind = kind
        self.labelnames = labelnames
        self._make: Callable[[], M] = make
        self._children: dict[LabelKey, M] = {}
        self._lock = threading.Lock()

    def labels(self, *values: str, **named: str) -> M:
        if named:
            values = tuple(str(named[n]) for n in self.labelnames)
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            if len(key) != len(self.labelnames):
                raise ValueError(f"metric {self.name} takes labels {self.labelnames}, got {key}")
            with self._lock:
                child = self._children.setdefault(key, self._make())
        return child

    def adopt(self, child: M, *values: str) -> M:
        """Make ``child`` (a metric another registry made) this family's child for
        ``values``: one series, readable through both registries (a process-wide event
        loop shared by several apps exports its lag into each app's registry)."""
        key = tuple(str(v) for v in values)
        if len(key) != len(self.labelnames):
            raise ValueError(f"metric {self.name} takes labels {self.labelnames}, got {key}")
        with self._lock:
            self._children[key] = child
        return child

    def remove(self, *values: str) -> None:
        with self._lock:
            self._children.pop(tuple(values), None)

    def children(self) -> list[tuple[LabelKey, M]]:
        with self._lock:
            return list(self._children.items())


Collector = Callable[[], Iterable[tuple[Mapping[str, str], float]]]


class Registry:
    """The app's metrics. Thread-safe; registering the same name twice returns the
    existing family (so runtimes can register idempotently)."""

    def __init__(self) -> None:
        self._families: dict[str, Family[Any]] = {}
        self._collected: dict[str, tuple[str, list[Collector]]] = {}
        self._read_hooks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def _family(
        self, name: str, help: str, kind: str, labels: Iterable[str], make: Callable[[], M]
    ) -> Family[M]:
        labelnames = tuple(labels)
        with self._lock:
            family = self._families.get(name)
            if family is None:
                family = Family(name, help, kind, labelnames, make)
                self._families[name] = family
            elif family.kind != kind or family.labelnames != labelnames:
                raise ValueError(
                    f"metric {name} is already registered as a {family.kind} with labels "
                    f"{family.labelnames}; cannot re-register as a {kind} with {labelnames}"
                )
            return family

    def counter(self, name: str, help: str, labels: Iterable[str] = ()) -> Family[Counter]:
        return self._family(name, help, "counter", labels, Counter)

    def gauge(self, name: str, help: str, labels: Iterable[str] = ()) -> Family[Gauge]:
        return self._family(name, help, "gauge", labels, Gauge)

    def histogram(
        self, name: str, help: str, labels: Iterable[str] = (), buckets: tuple[float, ...] = DEFAULT_BUCKETS
    ) -> Family[Histogram]:
        return self._family(name, help, "histogram", labels, lambda: Histogram(buckets))

    def collect(self, name: str, help: str, collector: Collector) -> Callable[[], None]:
        """Register a gauge computed at read time; returns a function that unregisters it."""
        with self._lock:
            entry = self._collected.setdefault(name, (help, []))
            entry[1].append(collector)

        def unregister() -> None:
            with self._lock:
                entry_now = self._collected.get(name)
                if entry_now and collector in entry_now[1]:
                    entry_now[1].remove(collector)

        return unregister

    def on_read(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Run ``hook`` before every read (``snapshot``, ``prometheus``, ``value``): hot
        paths that buffer observations locally flush them here. Returns an unregister
        function."""
        with self._lock:
            self._read_hooks.append(hook)

        def unregister() -> None:
            with self._lock:
                if hook in self._read_hooks:
                    self._read_hooks.remove(hook)

        return unregister

    def _before_read(self) -> None:
        with self._lock:
            hooks = list(self._read_hooks)
        for hook in hooks:
            try:
                hook()
            except Exception:  # a broken hook must not break the whole read
                continue

    def _collected_samples(self) -> dict[str, tuple[str, list[tuple[dict[str, str], float]]]]:
        with self._lock:
            items = [(n, h, list(cs)) for n, (h, cs) in self._collected.items()]
        out: dict[str, tuple[str, list[tuple[dict[str, str], float]]]] = {}
        for name, help, collectors in items:
            samples: list[tuple[dict[str, str], float]] = []
            for collector in collectors:
                try:
                    samples.extend((dict(labels), float(value)) for labels, value in collector())
                except Exception:  # a broken collector must not break the whole read
                    continue
            out[name] = (help, samples)
        return out

    def snapshot(self, *, collected: bool = True) -> dict[str, list[dict[str, Any]]]:
        """``{name: [{"labels": {...}, "value": v}, ...]}``; histograms give
        count/sum/p50/p99/max and counters also their rolling ``rate`` per second.

        ``collected=False`` leaves out the collected gauges, whose callbacks may query a
        database (a durable queue's depth): what a heartbeat sends every second reads
        only this process's memory."""
        self._before_read()
        with self._lock:
            families = list(self._families.values())
        out: dict[str, list[dict[str, Any]]] = {}
        for family in families:
            rows: list[dict[str, Any]] = []
            for key, child in family.children():
                labels = dict(zip(family.labelnames, key, strict=True))
                if isinstance(child, Histogram):
                    rows.append({"labels": labels, **child.summary()})
                elif isinstance(child, Counter):
                    rows.append({"labels": labels, "value": child.value, "rate": child.rate()})
                else:
                    rows.append({"labels": labels, "value": child.value})
            out[family.name] = rows
        if collected:
            for name, (_, samples) in self._collected_samples().items():
                out.setdefault(name, []).extend(
                    {"labels": labels, "value": value} for labels, value in samples
                )
        return out

    def value(self, name: str, **labels: str) -> float:
        """One sample's value (0.0 when absent); histograms give their count."""
        for row in self.snapshot().get(name, []):
            if all(row["labels"].get(k) == v for k, v in labels.items()):
                return float(row.get("value", row.get("count", 0.0)))
        return 0.0

    def prometheus(self) -> str:
        """The registry in Prometheus text exposition format 0.0.4."""
        self._before_read()
        lines: list[str] = []
        with self._lock:
            families = sorted(self._families.values(), key=lambda f: f.name)
        for family in families:
            lines.append(f"# HELP {family.name} {_escape_help(family.help)}")
            lines.append(f"# TYPE {family.name} {family.kind}")
            for key, child in family.children():
                labels = dict(zip(family.labelnames, key, strict=True))
                if isinstance(child, Histogram):
                    cumulative = 0
                    for bound, count in zip((*child.buckets, math.inf), child.counts, strict=True):
                        cumulative += count
                        le = "+Inf" if bound == math.inf else _num(bound)
                        lines.append(f"{family.name}_bucket{_labels({**labels, 'le': le})} {cumulative}")
                    lines.append(f"{family.name}_sum{_labels(labels)} {_num(child.sum)}")
                    lines.append(f"{family.name}_count{_labels(labels)} {child.count}")
                else:
                    lines.append(f"{family.name}{_labels(labels)} {_num(child.value)}")
        for name, (help, samples) in sorted(self._collected_samples().items()):
            lines.append(f"# HELP {name} {_escape_help(help)}")
            lines.append(f"# TYPE {name} gauge")
            lines.extend(f"{name}{_labels(labels)} {_num(value)}" for labels, value in samples)
        return "\n".join(lines) + "\n"


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape_value(str(v))}"' for k, v in labels.items()) + "}"


def _num(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if math.isnan(value):
        return "NaN"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))
