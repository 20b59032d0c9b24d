"""Anti-patterns: combinations of traits and models that the seeds say end in an incident.

The first four are seed 000 §4; the rest are seed 003's failure modes that a
declaration can already reveal. Each check is pure: ``(traits, delivery, execution,
host, load) -> Warning | None``. The ``override-contradicts-traits`` warning needs the walk
that the override replaced, so the engine raises it (see ``engine.py``); its code is
listed here with the others so tools can enumerate every code.

A warning fires only where the failure can happen on *Foundry's* runtime for the
chosen model, with its actual defaults: every in-process intake is bounded by default
(pools, processes, channels, parallel runs, the async runner's ``submit``), so
``unbounded-intake`` is left for the one line that is not (callers of an async unit
waiting for a permit under ``overflow="block"``); a parallel map restores order at the
join and a unit with ``ordered=True, key=...`` runs in per-key lanes, so
``order-lost-by-parallel-model`` is left for the writes no join can reorder.
"""

from __future__ import annotations

from collections.abc import Callable

from foundry.decide.fmt import fmt_count, fmt_rate, fmt_seconds
from foundry.decide.model import Host, Load, Warning
from foundry.decide.questions import HIGH_THROUGHPUT, VOLUME_RATE
from foundry.traits import Traits

__all__ = ["CHECKS", "CODES", "OVERRIDE_CODE", "check_all"]

OVERRIDE_CODE = "override-contradicts-traits"
# A unit's round trip to a child of Foundry's process pool (pickle, pipe, wake-up) costs
# about 0.05 ms pipelined to 0.2 ms one at a time: below 1 ms of work it is a large share.
IPC_EST = 0.001
OVERSUBSCRIBE_FACTOR = 2  # runnable compute threads per core before throughput falls
_CONCURRENT = frozenset({"async", "threads", "bounded_pool", "processes", "channels", "parallel"})
_POOLED = frozenset({"threads", "bounded_pool", "processes"})
_THREADED = frozenset({"threads", "bounded_pool", "channels"})

Check = Callable[[Traits, str, str, Host, Load], Warning | None]


def _queue_when_order_matters(
    t: Traits, delivery: str, execution: str, host: Host, load: Load
) -> Warning | None:
    if delivery != "queue" or not t.ordered:
        return None
    return Warning(
        "queue-when-order-matters",
        "A queue for work whose order matters",
        "ordered=True but the delivery is a queue: consumers take jobs in parallel and retries "
        "reorder them, so two jobs for the same entity race and leave incorrect state",
        "use a stream keyed by the entity (key=...), or a workflow if the steps belong together",
    )


def _stream_for_simple_work(
    t: Traits, delivery: str, execution: str, host: Host, load: Load
) -> Warning | None:
    if delivery != "stream" or t.ordered or t.replay or (t.consumers or 1) > 1:
        return None
    if t.rate is not None and t.rate >= HIGH_THROUGHPUT:
        return None
    volume = f" at {fmt_rate(t.rate)}" if t.rate is not None else ""
    return Warning(
        "stream-for-simple-work",
        "An event stream for simple work",
        f"a stream{volume} with one consumer, no order, no replay: partitions, offsets and lag "
        "to operate for nothing a queue would not do (Kafka for 50 jobs/day)",
        'use a queue (model="queue"); keep the stream for order, fan-out, replay or high throughput',
    )


def _orchestrator_for_stateless(
    t: Traits, delivery: str, execution: str, host: Host, load: Load
) -> Warning | None:
    if delivery != "workflow" or t.multi_step or t.compensate:
        return None
    return Warning(
        "orchestrator-for-stateless-work",
        "An orchestrator for stateless work",
        "a workflow around one stateless step: a journal write per step and an orchestrator hop "
        "add latency and operations with nothing to retry, resume or undo",
        "call it directly (or from a pool if it is latency-bound); use a queue if it must be durable",
    )


def _direct_for_durable(t: Traits, delivery: str, execution: str, host: Host, load: Load) -> Warning | None:
    if delivery not in ("direct", "pool") or not t.durable:
        return None
    return Warning(
        "direct-for-durable-work",
        "Direct execution for durable work",
        f"durable=True but the delivery is {delivery}: nothing is persisted, so a crash of this "
        "process loses the work (a payment processed in-process is lost on a crash)",
        'use a queue (or a stream when order or fan-out matter): drop model= or set model="queue"',
    )


def _cpu_on_event_loop(t: Traits, delivery: str, execution: str, host: Host, load: Load) -> Warning | None:
    if execution != "async" or t.bound not in ("cpu", "mixed"):
        return None
    est = f" of {fmt_seconds(t.est)}" if t.est is not None else ""
    return Warning(
        "cpu-on-event-loop",
        "CPU work on the event loop",
        f"bound={t.bound!r} work{est} on an event loop holds it: every other task, health checks "
        "included, waits behind it (35 ms of RSA at 300/s left a health check ready for 180 ms "
        "and the orchestrator killed a healthy process)",
        'declare the computing part as a phase (phases={"sign": {"bound": "cpu", "est": ...}}) so it '
        "runs on a bounded pool, off the loop",
    )


def _pool_deadlock(t: Traits, delivery: str, execution: str, host: Host, load: Load) -> Warning | None:
    if not t.waits_on_pool or (execution not in _POOLED and delivery != "pool"):
        return None
    return Warning(
        "pool-deadlock",
        "A pooled task waiting on its own pool",
        f"waits_on_pool=True on {delivery}/{execution}: when every slot holds a task waiting for "
        "another task of the same pool, nothing can ever complete (no lock involved)",
        "give the inner work its own pool (a separate unit or phase), or restructure it as a "
        "pipeline that does not wait (channels)",
    )


def _unbounded_intake(t: Traits, delivery: str, execution: str, host: Host, load: Load) -> Warning | None:
    # Every in-process runtime bounds its intake by default (pools, processes and channels
    # at 4 per worker, parallel at 4 runs, async submit() at 4 per permit) and durable
    # deliveries keep their backlog on disk. The one line with no bound: `await unit(...)`
    # callers of an async unit waiting for a permit, unless overflow="reject" caps them.
    if delivery not in ("direct", "pool") or execution != "async" or t.overflow == "reject":
        return None
    if t.rate is None or t.rate < VOLUME_RATE:
        return None
    permits = load.concurrency if load.concurrency is not None else "the"
    return Warning(
        "unbounded-intake",
        "Unbounded intake",
        f"rate {fmt_rate(t.rate)} on an event loop with overflow={t.overflow!r}: callers of "
        f"`await unit(...)` past the {permits} permits wait in a line with no bound (max_pending "
        "bounds submit(), not them), so an overload grows the heap until an out-of-memory kill "
        "instead of pushing back",
        'declare overflow="reject" (with max_pending=N): waiters past N get an OverloadError at '
        "once, which a server turns into a 503",
    )


def _thread_oversubscription(
    t: Traits, delivery: str, execution: str, host: Host, load: Load
) -> Warning | None:
    # Foundry sizes a computing pool to the cores itself; only an explicit workers= can
    # oversubscribe it.
    if t.bound != "cpu" or execution not in _THREADED or t.workers is None:
        return None
    cores = load.cores
    if t.workers <= OVERSUBSCRIBE_FACTOR * cores:
        return None
    assumed = " (assumed; pass the host to check this machine)" if load.cores_assumed else ""
    return Warning(
        "thread-oversubscription",
        "Thread oversubscription",
        f"workers={t.workers}: {t.workers} compute threads on {cores} cores{assumed}: past the core "
        "count throughput falls as concurrency rises (context switches, cache misses, GIL handoffs)",
        f"drop workers= (Foundry sizes a computing pool to the cores) or set workers={cores}; the rest "
        "wait in the bounded intake",
    )


def _threads_under_gil(t: Traits, delivery: str, execution: str, host: Host, load: Load) -> Warning | None:
    if t.bound != "cpu" or execution not in _THREADED or host.gil is False or t.releases_gil:
        return None
    if load.concurrency is not None and load.concurrency <= 1:
        return None
    why = (
        f"units share {', '.join(t.shares)}, which keeps them on threads"
        if t.shares and execution == "threads"
        else "a thread pool was chosen for computing work"
    )
    assumed = " (assumed: pass the host, or check sys._is_gil_enabled())" if host.gil is None else ""
    return Warning(
        "cpu-threads-under-gil",
        "A thread pool for CPU work under the GIL",
        f"bound='cpu' on {execution} under the GIL{assumed}: {why}, but its threads run Python "
        "bytecode one at a time, so the pool computes on one core however many threads it has",
        "if the computing is native code that releases the GIL (hashlib on large buffers, zlib, "
        "cryptography, numpy) declare releases_gil=True (`foundry profile` measures it); otherwise "
        'use process workers (model="processes"), and partition shared state by key so they need '
        "none",
    )


def _saturation(
    t: Traits, delivery: str, execution: str, host: Host, load: Load, what: str = "computing"
) -> Warning | None:
    if not load.saturated or load.rate is None or load.capacity is None or load.utilisation is None:
        return None
    needed = f" with {fmt_count(load.in_flight)} needed in flight" if load.in_flight is not None else ""
    if load.computing and load.cores_needed is not None and load.cores_needed > load.cores:
        where = f"{load.cores} (assumed)" if load.cores_assumed else str(load.cores)
        message = (
            f"{fmt_count(load.cores_needed)} cores of {what} on {where}: add hosts or shed load. "
            f"{fmt_rate(load.rate)} × {fmt_seconds(load.est or 0)} needs more cores than the host "
            f"has (ρ = {load.utilisation:.2f}); no queue drains that, the backlog grows until the "
            "intake rejects"
        )
        fix = (
            "add hosts (run more workers or processes elsewhere: a queue or pool delivery spreads "
            "them), make each unit cheaper, or shed load (overflow='reject', max_pending=N)"
        )
    else:
        served = f"{load.concurrency} {load.runs_on}" if load.concurrency else "the chosen model"
        message = (
            f"{fmt_rate(load.rate)} arriving but {served} serve {fmt_rate(load.capacity)} (ρ = "
            f"{load.utilisation:.2f}){needed}: the backlog grows without end until the intake rejects"
        )
        fix = (
            "raise workers= (or drop it and let Foundry size the pool from the load), run it on more "
            "hosts, or shed load (overflow='reject', max_pending=N)"
        )
        if load.computing and execution in ("threads", "bounded_pool", "channels", "async", "sequential"):
            fix = (
                "computing serialised on one core: use process workers (drop model=, or "
                "releases_gil=True if native code releases the GIL), or shed load"
            )
    return Warning("saturation", "Demand exceeds capacity", message, fix)


def _order_lost(t: Traits, delivery: str, execution: str, host: Host, load: Load) -> Warning | None:
    # Results are restored to input order at the join (map(ordered=True), a parallel map)
    # and a declared key runs in per-key lanes; what no join restores is the order of the
    # units' own writes to shared state when no key serialises them.
    if not t.ordered or t.key or not t.shares or execution not in _CONCURRENT:
        return None
    if load.concurrency is not None and load.concurrency <= 1:
        return None
    shared = ", ".join(t.shares)
    return Warning(
        "order-lost-by-parallel-model",
        "Order lost by a parallel model",
        f"ordered=True and the units write {shared}, but {execution} runs several at once: they "
        f"write {shared} out of order; restoring order at the join fixes the results, not the writes",
        "declare key= (the entity whose writes must stay in order): Foundry then runs one unit per "
        "key at a time, in submission order, and different keys in parallel",
    )


def _ipc_dominated(t: Traits, delivery: str, execution: str, host: Host, load: Load) -> Warning | None:
    if execution != "processes" or t.est is None or t.est >= IPC_EST:
        return None
    return Warning(
        "ipc-dominated-process-work",
        "Process work dominated by IPC",
        f"est={fmt_seconds(t.est)} per unit on processes: pickling the arguments and result and "
        "crossing a pipe (0.05-0.2 ms a unit on Foundry's process pool) is a large share of the "
        "work, so more processes buy little",
        "batch many items per call (one call per chunk), or use a bounded pool of threads if "
        "isolation is not required",
    )


def _limit_below_demand(t: Traits, delivery: str, execution: str, host: Host, load: Load) -> Warning | None:
    """A fleet-wide ``rate_limit=`` or ``max_concurrency=`` that serves less than the
    declared arrival rate (per key, ``per=``, the split of ``rate`` is unknown: silent)."""
    if delivery != "queue" or t.rate is None or t.per is not None:
        return None
    served: list[tuple[float, str]] = []
    if t.rate_limit is not None:
        served.append((t.rate_limit.rate, f'rate_limit="{t.rate_limit}"'))
    if t.max_concurrency is not None and t.est:
        served.append(
            (t.max_concurrency / t.est, f"max_concurrency={t.max_concurrency} × est={fmt_seconds(t.est)}")
        )
    if not served:
        return None
    capacity, what = min(served)
    if t.rate <= capacity:
        return None
    return Warning(
        "limit-below-demand",
        "A limit below the arrival rate",
        f"{fmt_rate(t.rate)} arriving but {what} lets {fmt_rate(capacity)} start, for the whole fleet: the "
        "backlog grows without end (the jobs wait, they do not fail) and no number of workers drains it",
        "raise the limit, or shed load before it is submitted; the limit is only right if the backlog "
        "can wait (watch foundry_limit_waiting and foundry_queue_oldest_age_seconds)",
    )


CHECKS: tuple[tuple[str, Check], ...] = (
    ("queue-when-order-matters", _queue_when_order_matters),
    ("stream-for-simple-work", _stream_for_simple_work),
    ("orchestrator-for-stateless-work", _orchestrator_for_stateless),
    ("direct-for-durable-work", _direct_for_durable),
    ("cpu-on-event-loop", _cpu_on_event_loop),
    ("pool-deadlock", _pool_deadlock),
    ("unbounded-intake", _unbounded_intake),
    ("thread-oversubscription", _thread_oversubscription),
    ("cpu-threads-under-gil", _threads_under_gil),
    ("saturation", _saturation),
    ("order-lost-by-parallel-model", _order_lost),
    ("ipc-dominated-process-work", _ipc_dominated),
    ("limit-below-demand", _limit_below_demand),
)
CODES: tuple[str, ...] = (*(code for code, _ in CHECKS), OVERRIDE_CODE)


def check_all(
    t: Traits, delivery: str, execution: str, host: Host, load: Load, phase: str = "main"
) -> tuple[Warning, ...]:
    """Every anti-pattern these traits walk into on ``delivery/execution``, in table order
    (``phase`` names the work in the saturation message: "10.5 cores of sign on 8")."""
    what = "computing" if phase == "main" else phase
    found = (
        _saturation(t, delivery, execution, host, load, what)
        if code == "saturation"
        else check(t, delivery, execution, host, load)
        for code, check in CHECKS
    )
    return tuple(w for w in found if w is not None)


def override_warning(
    t: Traits, axis: str, given: str, traits_choice: str, decided_by: str, answer: str
) -> Warning:
    """The explicit model= disagrees with what the traits decided on ``axis``."""
    return Warning(
        OVERRIDE_CODE,
        "An explicit model= that contradicts the traits",
        f"model={t.model!r} sets {axis} to {given}, but the traits point at {traits_choice} "
        f"(decided by {decided_by}: {answer}); the override wins and this decision is recorded",
        f"drop model= to follow the traits, or correct the traits that say {traits_choice}",
    )
