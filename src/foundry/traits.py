"""The declaration of a unit of work: its traits, parsed and validated.

Traits are the answers to the decision engine's questions. Every one is optional;
what is not declared can be measured (``foundry profile``) or asked (``foundry advise``).
Human units are accepted everywhere a duration, rate or size is: ``"35ms"``, ``"90s"``,
``"5m"``, ``"2h"``, ``"300/s"``, ``"50/day"``, ``"10MB"``.

Every bad or contradictory declaration raises :class:`~foundry.errors.DeclarationError`
naming the unit, the field, the value and the fix, at declaration time.

This module imports nothing from the rest of Foundry except ``errors`` so that the
decision engine can use it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from foundry._suggest import closest, closest_path
from foundry.errors import DeclarationError, UnknownTraitError

__all__ = [
    "DELIVERIES",
    "EXECUTIONS",
    "QUEUE_NAME_RULE",
    "Bound",
    "Overflow",
    "RateLimit",
    "Traits",
    "parse_duration",
    "parse_rate",
    "parse_rate_limit",
    "parse_size",
    "queue_name_problem",
    "traits_from_kwargs",
]

Bound = Literal["cpu", "io", "mixed"]
Overflow = Literal["block", "reject", "caller_runs"]

DELIVERIES: tuple[str, ...] = ("direct", "pool", "queue", "stream", "workflow")
EXECUTIONS: tuple[str, ...] = (
    "sequential",
    "async",
    "threads",
    "bounded_pool",
    "processes",
    "channels",
    "parallel",
)

# One rule for queue names on every engine, so a unit declared against SQLite keeps working on
# RabbitMQ: AMQP 0-9-1's queue-name domain (letters, digits, "-", "_", ".", ":"), and short
# enough that the RabbitMQ engine's longest derived name (``<prefix>.<queue>.delay.<ms>``, with
# a prefix of up to 100 characters) stays within AMQP's 255 bytes.
QUEUE_NAME_RULE = "1-100 characters from A-Z, a-z, 0-9 and - _ . : (AMQP's queue-name characters)"
_QUEUE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,100}")


def queue_name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a durable queue on every engine (``None`` when it can)."""
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not a string"
    if not _QUEUE_NAME.fullmatch(name):
        return f"is not a queue name every engine accepts: use {QUEUE_NAME_RULE}"
    return None


_DURATION_UNITS: dict[str, float] = {
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
}
_PER_UNITS: dict[str, float] = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hour": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "w": 604800.0,
    "week": 604800.0,
}
_SIZE_UNITS: dict[str, int] = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
}
_NUM = r"(\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_DURATION_RE = re.compile(rf"^\s*(?P<n>-?{_NUM})\s*(?P<u>[a-zµ]*)\s*$", re.IGNORECASE)
_RATE_RE = re.compile(rf"^\s*(?P<n>-?{_NUM})\s*/\s*(?P<u>[a-z]+?)s?\s*$", re.IGNORECASE)
_SIZE_RE = re.compile(rf"^\s*(?P<n>-?{_NUM})\s*(?P<u>[a-z]*)\s*$", re.IGNORECASE)


def _number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def parse_duration(value: str | float | int, *, unit: str = "?", field_name: str = "est") -> float:
    """Seconds from ``"35ms"``, ``"90s"``, ``"5m"``, ``"2h"`` or a number of seconds."""
    fix = 'give a non-negative duration such as "35ms", "90s", "5m" or a number of seconds'
    if isinstance(value, bool):
        raise DeclarationError(unit, field_name, value, "is a bool, not a duration", fix)
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION_RE.match(value)
        if not match:
            raise DeclarationError(unit, field_name, value, "is not a duration", fix)
        suffix = match["u"].lower() or "s"
        if suffix not in _DURATION_UNITS:
            raise DeclarationError(
                unit,
                field_name,
                value,
                f"has an unknown unit {match['u']!r}",
                f"use one of {', '.join(sorted(_DURATION_UNITS))}",
            )
        seconds = _number(match["n"]) * _DURATION_UNITS[suffix]
    else:
        raise DeclarationError(unit, field_name, value, "is not a duration", fix)
    if not math.isfinite(seconds):
        raise DeclarationError(unit, field_name, value, "is not finite", fix)
    if seconds < 0:
        raise DeclarationError(unit, field_name, value, "is negative", fix)
    return seconds


def parse_rate(value: str | float | int, *, unit: str = "?", field_name: str = "rate") -> float:
    """Events per second from ``"300/s"``, ``"50/day"``, ``"10/min"`` or a number per second."""
    fix = 'give a non-negative rate such as "300/s", "10/min" or "50/day"'
    if isinstance(value, bool):
        raise DeclarationError(unit, field_name, value, "is a bool, not a rate", fix)
    if isinstance(value, int | float):
        per_second = float(value)
    elif isinstance(value, str):
        match = _RATE_RE.match(value)
        if not match:
            raise DeclarationError(unit, field_name, value, "is not a rate", fix)
        per = match["u"].lower()
        if per not in _PER_UNITS:
            raise DeclarationError(
                unit,
                field_name,
                value,
                f"has an unknown period {match['u']!r}",
                f"use one of {', '.join(sorted(_PER_UNITS))}",
            )
        per_second = _number(match["n"]) / _PER_UNITS[per]
    else:
        raise DeclarationError(unit, field_name, value, "is not a rate", fix)
    if not math.isfinite(per_second) or per_second < 0:
        raise DeclarationError(unit, field_name, value, "is negative or not finite", fix)
    return per_second


def parse_size(value: str | int, *, unit: str = "?", field_name: str = "max_payload") -> int:
    """Bytes from ``"10MB"``, ``"64KiB"`` or an int."""
    fix = 'give a non-negative size such as "64KiB", "10MB" or a number of bytes'
    if isinstance(value, bool):
        raise DeclarationError(unit, field_name, value, "is a bool, not a size", fix)
    if isinstance(value, int):
        size = value
    elif isinstance(value, str):
        match = _SIZE_RE.match(value)
        suffix = (match["u"].lower() if match else "") or "b"
        if not match or suffix not in _SIZE_UNITS:
            raise DeclarationError(unit, field_name, value, "is not a size", fix)
        size = int(_number(match["n"]) * _SIZE_UNITS[suffix])
    else:
        raise DeclarationError(unit, field_name, value, "is not a size", fix)
    if size < 0:
        raise DeclarationError(unit, field_name, value, "is negative", fix)
    return size


_RATE_LIMIT_RE = re.compile(r"^\s*(?P<n>\d+)\s*/\s*(?P<u>[A-Za-z]+)\s*$")
_RATE_LIMIT_PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE_LIMIT_FIX = 'write it as "N/s", "N/m" or "N/h" with N a whole number ≥ 1, e.g. rate_limit="100/s"'


@dataclass(frozen=True, slots=True)
class RateLimit:
    """``rate_limit="100/s"``: a token bucket of ``count`` tokens refilled at ``count``
    per ``period`` seconds, kept in the queue's engine for the whole fleet. Its burst
    capacity is ``count``: in any window of ``w`` seconds at most ``count + w × rate``
    jobs of the unit (of the key, with ``per=``) start."""

    count: int
    period: float  # seconds: 1, 60 or 3600

    @property
    def rate(self) -> float:
        """Tokens per second."""
        return self.count / self.period

    def __str__(self) -> str:
        return f"{self.count}/{ {1.0: 's', 60.0: 'm', 3600.0: 'h'}[self.period] }"


def parse_rate_limit(value: Any, *, unit: str = "?", field_name: str = "rate_limit") -> RateLimit:
    """``"100/s"``, ``"10/m"``, ``"500/h"`` (a :class:`RateLimit`); anything else is a
    :class:`DeclarationError` saying how to write it (``"100/sec"`` → ``use "100/s"``)."""
    if isinstance(value, RateLimit):
        return value
    if not isinstance(value, str):
        raise DeclarationError(unit, field_name, value, "is not a rate limit", _RATE_LIMIT_FIX)
    match = _RATE_LIMIT_RE.match(value)
    if not match:
        raise DeclarationError(unit, field_name, value, "is not a rate limit", _RATE_LIMIT_FIX)
    count, word = int(match["n"]), match["u"].lower()
    period = _RATE_LIMIT_PERIODS.get(word)
    if period is None:
        seconds = _PER_UNITS.get(word.removesuffix("s")) or _PER_UNITS.get(word)
        short = {1.0: "s", 60.0: "m", 3600.0: "h"}.get(seconds or 0.0)
        fix = f'use "{count}/{short}"' if short else _RATE_LIMIT_FIX
        raise DeclarationError(
            unit, field_name, value, f"has the period {match['u']!r}; a rate limit takes s, m or h", fix
        )
    if count < 1:
        raise DeclarationError(
            unit, field_name, value, "lets nothing run", 'give at least 1, e.g. rate_limit="1/m"'
        )
    return RateLimit(count, period)


@dataclass(frozen=True, slots=True)
class Traits:
    """What the author knows about one unit of work (or one phase of it).

    The first group answers seed 003's seven questions, in order; the second answers
    seed 000's framework; the third is operational (used by the runtimes, not the
    decision). Durations are seconds, rates are per second.
    """

    # -- the seven questions --------------------------------------------------
    est: float | None = None
    """Q1 size: estimated wall time of one unit (``"35ms"``)."""
    rate: float | None = None
    """Q1 volume / throughput: arrivals per second (``"300/s"``, ``"50/day"``)."""
    bound: Bound | None = None
    """Q2: ``"cpu"`` (computing), ``"io"`` (waiting) or ``"mixed"``."""
    shares: tuple[str, ...] = ()
    """Q3 independence: state two units both touch (rows, files, caches, counters)."""
    ordered: bool = False
    """Q4: output order (per key, if ``key`` is set) is a requirement."""
    concurrency: int | None = None
    """Q5: how many units are in flight at once."""
    long_running: bool | None = None
    """Q6: long-running (derived from ``est`` when not given: ≥ 10 s)."""
    isolate: bool = False
    """Q7: a crash must be contained (untrusted, crash-prone or leaky native code)."""
    releases_gil: bool = False
    """Q2, for ``bound="cpu"``: the computing is native code that releases the GIL while it
    runs (hashlib on large buffers, zlib, ``cryptography``, numpy), so threads use several
    cores. ``False`` (the default): pure Python, which under the GIL needs processes to use
    more than one core. ``foundry profile`` measures it (2 threads against 1)."""
    stages: int | None = None
    """Stages that hand data on to each other (a pipeline): channels."""
    partitionable: bool = False
    """One large computation over data in memory that splits into chunks: parallel."""
    items: int | None = None
    """Input size for partitionable work (element count)."""
    workers: int | None = None
    """Threads or processes that run units at once (a pool's size). ``None``: the decision
    sizes it from the load (``decision.load.concurrency``), else the runtime's default."""
    min_workers: int | None = None
    """Work pool: the fewest worker processes kept (the elastic controller never goes below)."""
    max_workers: int | None = None
    """Work pool: the most worker processes started (the elastic controller never goes above)."""
    waits_on_pool: bool = False
    """A unit submits work to its own pool and waits for the result (pool deadlock risk)."""

    # -- the framework (delivery) ---------------------------------------------
    durable: bool = False
    """Must survive a crash of the process that accepted it."""
    latency: float | None = None
    """Latency budget a caller waits within."""
    multi_step: bool = False
    """Several steps spanning services."""
    compensate: bool = False
    """Steps must be undone when a later step fails for good (saga)."""
    consumers: int | None = None
    """Independent consumers that each need every event."""
    replay: bool = False
    """Consumers must be able to re-read history."""
    background: bool = False
    """Nobody waits for the result (fire and forget, occasional)."""
    idempotent: bool = False
    """Running it twice has the same effect as once. A work pool retries a lost attempt of
    an idempotent unit on another worker, with the same idempotency key; any other unit
    fails with :class:`~foundry.errors.WorkerLostError` instead."""
    key: str | None = None
    """Name of the argument/field that orders and partitions work (per-key order): with
    ``ordered=True`` a stream keeps it per partition and in-process models run one unit
    per key at a time (per-key lanes)."""

    # -- operational ----------------------------------------------------------
    model: str | None = None
    """Explicit override: ``"queue"``, ``"processes"`` or ``"queue/processes"``."""
    retries: int = 0
    timeout: float | None = None
    deadline: float | None = None
    """Work pool: the whole request's budget (waiting for a free worker, every attempt);
    ``None``: 30 s. ``timeout`` bounds one attempt on one worker."""
    overflow: Overflow = "block"
    max_pending: int | None = None
    """Bound on accepted-but-not-started work (the intake). ``None``: the runtime's default."""
    max_tasks_per_child: int | None = None
    """Processes: replace a child after this many units (native leaks). ``None``: never."""
    queue: str | None = None
    """Durable queue the unit's jobs go to (``None``: ``"default"``); workers serve queues."""
    codec: Literal["json", "pickle"] = "json"
    """How a durable model stores arguments and results; pickle only when declared."""
    retry_on: tuple[type[BaseException] | str, ...] = ()
    """Exceptions (types, or names like ``"TimeoutError"``) worth a retry; ``()``: any."""
    errors: tuple[type[BaseException], ...] = ()
    """Exception types of other modules this unit raises, rebuilt by type when its error
    record is read back from a store (besides builtins', Foundry's and the unit's own
    module's; everything else arrives as ``RemoteError``). See ``docs/security.md``."""
    backoff: float | None = None
    """First retry delay; doubles per attempt with jitter (``None``: the runtime's default)."""
    max_payload: int | None = None
    """Largest encoded arguments a durable model accepts (``"1MB"``; ``None``: 1 MiB)."""
    rate_limit: RateLimit | None = None
    """Durable queue: at most this many starts of the unit for the whole fleet (``"100/s"``,
    ``"10/m"``, ``"500/h"``; a token bucket in the queue's engine, burst = the count; with
    ``per=``, per key). A job over it waits; it is not failed (``docs/limits.md``)."""
    max_concurrency: int | None = None
    """Durable queue: at most this many jobs of the unit run at once across every worker
    (with ``per=``, per key). The slots are leases: a dead worker's slot lapses with its job."""
    per: str | None = None
    """Durable queue: the argument whose value keys ``rate_limit`` and ``max_concurrency``
    (``per="customer_id"``: each customer has its own bucket and slots)."""
    result_ttl: float | None = None
    """Queue: how long a finished job's record (its result or error) is kept after it
    finished, however often it is read (``"1h"``, ``"7d"``; ``None``: 7 days). Then a
    worker purges it and its id reads as unknown."""
    adaptive: bool = False
    """Let Foundry move a phase off the event loop at run time: when the loop watchdog keeps
    finding a phase (``@unit.phase``) of this ``async def`` unit holding the loop, the phase
    is re-decided from the measurement and runs on that pool from then on (a phase may
    declare it alone). ``False``: the drift is only reported (``docs/execution.md``)."""

    @property
    def is_long(self) -> bool:
        if self.long_running is not None:
            return self.long_running
        return self.est is not None and self.est >= 10.0

    @property
    def override(self) -> tuple[str | None, str | None]:
        """The explicit ``model=`` split into (delivery, execution)."""
        if self.model is None:
            return (None, None)
        parts = self.model.split("/")
        if len(parts) == 2:
            return (parts[0], parts[1])
        return (self.model, None) if self.model in DELIVERIES else (None, self.model)

    def merged(self, **changes: Any) -> Traits:
        """A copy with ``changes`` applied (already-parsed values)."""
        return replace(self, **changes)


TRAIT_NAMES: frozenset[str] = frozenset(f.name for f in fields(Traits))
_BOOL_FIELDS = frozenset(
    {
        "ordered",
        "isolate",
        "partitionable",
        "durable",
        "multi_step",
        "compensate",
        "replay",
        "background",
        "idempotent",
        "waits_on_pool",
        "releases_gil",
        "adaptive",
    }
)
_COUNT_FIELDS = frozenset(
    {
        "concurrency",
        "stages",
        "consumers",
        "items",
        "max_pending",
        "workers",
        "min_workers",
        "max_workers",
        "max_tasks_per_child",
    }
)
_DURATION_FIELDS = frozenset({"est", "latency", "timeout", "backoff", "deadline", "result_ttl"})


def _check_count(unit: str, name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DeclarationError(
            unit,
            name,
            value,
            f"is not an integer ≥ {minimum}",
            f"give {name} as a whole number of at least {minimum}",
        )
    return value


def traits_from_kwargs(unit: str, raw: Mapping[str, Any], base: Traits | None = None) -> Traits:
    """Parse and validate keyword traits for ``unit``; raise on anything wrong.

    ``base`` supplies inherited values (a phase inherits its unit's delivery traits).
    """
    parsed: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in TRAIT_NAMES:
            near = closest(name, sorted(TRAIT_NAMES))
            hint = (
                f"did you mean {near!r}?" if near else f"known traits are: {', '.join(sorted(TRAIT_NAMES))}"
            )
            raise UnknownTraitError(unit, name, value, "is not a trait", hint)
        if value is None:
            continue
        if name in _DURATION_FIELDS:
            parsed[name] = parse_duration(value, unit=unit, field_name=name)
            if name == "result_ttl" and parsed[name] <= 0:
                raise DeclarationError(
                    unit,
                    name,
                    value,
                    "keeps a result for no time at all (nobody could read it)",
                    'give a positive duration, e.g. result_ttl="1h" or "7d"',
                )
        elif name == "rate":
            parsed[name] = parse_rate(value, unit=unit, field_name=name)
        elif name in _BOOL_FIELDS or name == "long_running":
            if not isinstance(value, bool):
                raise DeclarationError(
                    unit, name, value, "is not a bool", f"write {name}=True or {name}=False"
                )
            parsed[name] = value
        elif name in _COUNT_FIELDS:
            parsed[name] = _check_count(unit, name, value, 1)
        elif name == "retries":
            parsed[name] = _check_count(unit, name, value, 0)
        elif name == "bound":
            if value not in ("cpu", "io", "mixed"):
                raise DeclarationError(
                    unit,
                    "bound",
                    value,
                    "is not a kind of work",
                    'use bound="cpu" (computing), "io" (waiting) or "mixed"',
                )
            parsed[name] = value
        elif name == "overflow":
            if value not in ("block", "reject", "caller_runs"):
                raise DeclarationError(
                    unit,
                    "overflow",
                    value,
                    "is not an overflow policy",
                    'use overflow="block", "reject" or "caller_runs"',
                )
            parsed[name] = value
        elif name == "shares":
            items = (value,) if isinstance(value, str) else tuple(value)
            if not all(isinstance(item, str) and item for item in items):
                raise DeclarationError(
                    unit,
                    "shares",
                    value,
                    "is not a list of names",
                    'name the shared state, e.g. shares=["orders table", "price cache"]',
                )
            parsed[name] = items
        elif name == "key":
            if not isinstance(value, str) or not value:
                raise DeclarationError(
                    unit,
                    "key",
                    value,
                    "is not a field name",
                    'name the argument that orders the work, e.g. key="session_id"',
                )
            parsed[name] = value
        elif name == "model":
            parsed[name] = _check_model(unit, value)
        elif name == "max_payload":
            parsed[name] = parse_size(value, unit=unit, field_name=name)
        elif name in ("queue", "codec", "retry_on"):
            parsed[name] = _check_durable(unit, name, value)
        elif name == "errors":
            parsed[name] = _check_errors(unit, value)
        elif name == "rate_limit":
            parsed[name] = parse_rate_limit(value, unit=unit)
        elif name == "max_concurrency":
            parsed[name] = _check_count(unit, name, value, 1)
        elif name == "per":
            if not isinstance(value, str) or not value.isidentifier():
                raise DeclarationError(
                    unit,
                    "per",
                    value,
                    "is not an argument name",
                    'name the argument whose value keys the limits, e.g. per="customer_id"',
                )
            parsed[name] = value
    traits = replace(base, **parsed) if base is not None else Traits(**parsed)
    _check_consistency(unit, traits, set(parsed))
    return traits


def _check_durable(unit: str, name: str, value: Any) -> Any:
    """``queue``, ``codec`` and ``retry_on``: the durable models' options."""
    if name == "queue":
        problem = queue_name_problem(value)
        if problem is not None:
            raise DeclarationError(unit, "queue", value, problem, 'name the queue, e.g. queue="emails"')
        return value
    if name == "codec":
        if value not in ("json", "pickle"):
            raise DeclarationError(
                unit,
                "codec",
                value,
                "is not a codec",
                'use codec="json" (default) or codec="pickle" if every producer is trusted',
            )
        return value
    items = (value,) if isinstance(value, str | type) else tuple(value)
    for item in items:
        ok = (isinstance(item, type) and issubclass(item, BaseException)) or (isinstance(item, str) and item)
        if not ok:
            raise DeclarationError(
                unit,
                "retry_on",
                value,
                f"has {item!r}, which is not an exception type or name",
                'list exception types or names, e.g. retry_on=(TimeoutError, "requests.ConnectionError")',
            )
    return items


def _check_errors(unit: str, value: Any) -> tuple[type[BaseException], ...]:
    """``errors=[...]``: exception classes (not names: a name would have to be imported)."""
    if isinstance(value, type):
        items: tuple[Any, ...] = (value,)
    elif isinstance(value, list | tuple | set | frozenset):
        items = tuple(value)
    else:
        items = (value,)
    for item in items:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise DeclarationError(
                unit,
                "errors",
                value,
                f"has {item!r}, which is not an exception class",
                "list the exception classes the unit raises, e.g. errors=[requests.HTTPError]",
            )
    return items


def _check_model(unit: str, value: Any) -> str:
    fix = (
        f"use a delivery ({', '.join(DELIVERIES)}), an execution "
        f"({', '.join(EXECUTIONS)}) or both as 'delivery/execution'"
    )
    if not isinstance(value, str):
        raise DeclarationError(unit, "model", value, "is not a model name", fix)
    parts = value.split("/")
    if len(parts) == 1 and (value in DELIVERIES or value in EXECUTIONS):
        return value
    if len(parts) == 2 and parts[0] in DELIVERIES and parts[1] in EXECUTIONS:
        return value
    near: str | None = None
    if len(parts) == 2:  # corrected part by part: queue/thread -> queue/threads
        near = closest_path(value, (DELIVERIES, EXECUTIONS))
    elif len(parts) == 1:
        near = closest(value, [*DELIVERIES, *EXECUTIONS])
    hint = f"did you mean {near!r}? " if near else ""
    raise DeclarationError(unit, "model", value, "is not a model", hint + fix)


# Executions that never run a unit on an event loop: an adaptive phase has no loop to leave.
_OFF_THE_LOOP = frozenset({"threads", "bounded_pool", "processes", "channels", "parallel"})


def _check_consistency(unit: str, t: Traits, given: set[str]) -> None:
    """Contradictions that no decision could honour."""
    _, execution = t.override
    if t.compensate and not t.multi_step and "multi_step" in given:
        raise DeclarationError(
            unit,
            "compensate",
            True,
            "needs steps to undo but multi_step=False",
            "declare the unit with @app.workflow, or drop compensate=True",
        )
    if t.timeout is not None and t.timeout == 0:
        raise DeclarationError(
            unit,
            "timeout",
            "0s",
            "would stop the work before it starts",
            'give a positive timeout such as "30s", or leave it out for none',
        )
    if t.latency is not None and t.latency == 0:
        raise DeclarationError(
            unit,
            "latency",
            "0s",
            "is a budget nothing can meet",
            'give a positive latency budget such as "50ms"',
        )
    if t.est is not None and t.timeout is not None and t.timeout < t.est:
        raise DeclarationError(
            unit,
            "timeout",
            t.timeout,
            f"is shorter than the estimate est={t.est}s, so every run would time out",
            "raise the timeout above the estimate, or correct est=",
        )
    _check_pool(unit, t)
    if t.per is not None and t.rate_limit is None and t.max_concurrency is None:
        raise DeclarationError(
            unit,
            "per",
            t.per,
            "keys limits, and the unit declares none",
            'add rate_limit="100/s" and/or max_concurrency=5, or drop per=',
        )
    if t.adaptive and "adaptive" in given and execution in _OFF_THE_LOOP:
        raise DeclarationError(
            unit,
            "adaptive",
            True,
            f"moves phases off the event loop the unit runs on, but model={t.model!r} runs it on "
            f"{execution}, not on a loop: there is nothing to move",
            "drop adaptive=True, or drop the model= override so the unit runs on its event loop",
        )
    if t.partitionable and t.isolate and execution == "parallel":
        raise DeclarationError(
            unit,
            "model",
            t.model,
            "is parallel but isolate=True asks for crash containment",
            'use model="processes" for isolation, or drop isolate=True',
        )


def _check_pool(unit: str, t: Traits) -> None:
    """The work pool's traits: a deadline, worker bounds, and what idempotency permits."""
    if t.deadline is not None and t.deadline == 0:
        raise DeclarationError(
            unit, "deadline", "0s", "leaves no time to answer", 'give a positive deadline such as "2s"'
        )
    if t.deadline is not None and t.timeout is not None and t.timeout > t.deadline:
        raise DeclarationError(
            unit,
            "timeout",
            t.timeout,
            f"(one attempt) is longer than deadline={t.deadline}s (the whole request)",
            "make the attempt timeout shorter than the deadline, or raise the deadline",
        )
    if t.min_workers is not None and t.max_workers is not None and t.min_workers > t.max_workers:
        raise DeclarationError(
            unit,
            "min_workers",
            t.min_workers,
            f"is more than max_workers={t.max_workers}",
            "give min_workers ≤ max_workers",
        )
    if t.workers is not None and (t.min_workers is not None or t.max_workers is not None):
        raise DeclarationError(
            unit,
            "workers",
            t.workers,
            "pins the pool's size, but min_workers/max_workers ask for an elastic one",
            "declare either workers=N (fixed) or min_workers/max_workers (elastic)",
        )
    delivery, _ = t.override
    if delivery == "pool" and t.retries > 0 and not t.idempotent:
        raise DeclarationError(
            unit,
            "retries",
            t.retries,
            "asks a work pool to re-run work that is not idempotent: a lost attempt may already have "
            "had its effect, so a retry could do it twice",
            "declare idempotent=True if running it twice is safe, or drop retries (a lost attempt then "
            "fails with WorkerLostError)",
        )
