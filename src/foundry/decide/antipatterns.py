"""Anti-patterns: combinations of traits and models that the seeds say end in an incident.

The first four are seed 000 §4; the rest are seed 003's failure modes that a
declaration can already reveal. Each check is pure: ``(traits, delivery, execution,
host) -> Warning | None``. The ``override-contradicts-traits`` warning needs the walk
that the override replaced, so the engine raises it (see ``engine.py``); its code is
listed here with the others so tools can enumerate every code.
"""

from __future__ import annotations

from collections.abc import Callable

from foundry.decide.model import Host, Warning
from foundry.decide.questions import ASSUMED_CORES, HIGH_THROUGHPUT, VOLUME_RATE, fmt_rate, fmt_seconds
from foundry.traits import Traits

__all__ = ["CHECKS", "CODES", "OVERRIDE_CODE", "check_all"]

OVERRIDE_CODE = "override-contradicts-traits"
IPC_EST = 0.010  # below this a process hop (pickle, pipe, wake-up) rivals the work
OVERSUBSCRIBE_FACTOR = 2  # runnable compute threads per core before throughput falls
_CONCURRENT = frozenset({"async", "threads", "bounded_pool", "processes", "parallel"})
_POOLED = frozenset({"threads", "bounded_pool", "processes"})

Check = Callable[[Traits, str, str, Host], Warning | None]


def _queue_when_order_matters(t: Traits, delivery: str, execution: str, host: Host) -> Warning | None:
    if delivery != "queue" or not t.ordered:
        return None
    return Warning(
        "queue-when-order-matters",
        "A queue for work whose order matters",
        "ordered=True but the delivery is a queue: consumers take jobs in parallel and retries "
        "reorder them, so two jobs for the same entity race and leave incorrect state",
        "use a stream keyed by the entity (key=...), or a workflow if the steps belong together",
    )


def _stream_for_simple_work(t: Traits, delivery: str, execution: str, host: Host) -> Warning | None:
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


def _orchestrator_for_stateless(t: Traits, delivery: str, execution: str, host: Host) -> Warning | None:
    if delivery != "workflow" or t.multi_step or t.compensate:
        return None
    return Warning(
        "orchestrator-for-stateless-work",
        "An orchestrator for stateless work",
        "a workflow around one stateless step: a journal write per step and an orchestrator hop "
        "add latency and operations with nothing to retry, resume or undo",
        "call it directly (or from a pool if it is latency-bound); use a queue if it must be durable",
    )


def _direct_for_durable(t: Traits, delivery: str, execution: str, host: Host) -> Warning | None:
    if delivery not in ("direct", "pool") or not t.durable:
        return None
    return Warning(
        "direct-for-durable-work",
        "Direct execution for durable work",
        f"durable=True but the delivery is {delivery}: nothing is persisted, so a crash of this "
        "process loses the work (a payment processed in-process is lost on a crash)",
        'use a queue (or a stream when order or fan-out matter): drop model= or set model="queue"',
    )


def _cpu_on_event_loop(t: Traits, delivery: str, execution: str, host: Host) -> Warning | None:
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


def _pool_deadlock(t: Traits, delivery: str, execution: str, host: Host) -> Warning | None:
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


def _unbounded_intake(t: Traits, delivery: str, execution: str, host: Host) -> Warning | None:
    # Durable deliveries keep their backlog on disk (watch its age); in-process ones in memory.
    if t.max_pending is not None or t.concurrency is not None or delivery not in ("direct", "pool"):
        return None
    high = t.rate is not None and t.rate >= VOLUME_RATE
    if not high and execution != "async":
        return None
    what = f"rate {fmt_rate(t.rate)}" if high and t.rate is not None else "tasks on an event loop"
    return Warning(
        "unbounded-intake",
        "Unbounded intake",
        f"{what} with no concurrency= or max_pending= declared: an overload becomes a growing "
        "backlog in memory and then an out-of-memory kill instead of backpressure",
        'declare max_pending=N (and concurrency=) with overflow="block" or "reject" so overload '
        "becomes backpressure or a clear OverloadError",
    )


def _thread_oversubscription(t: Traits, delivery: str, execution: str, host: Host) -> Warning | None:
    if t.bound != "cpu" or execution not in ("threads", "bounded_pool"):
        return None
    threads = t.workers if t.workers is not None else (t.concurrency if execution == "threads" else None)
    cores = host.cores if host.cores is not None else ASSUMED_CORES
    if threads is None or threads <= OVERSUBSCRIBE_FACTOR * cores:
        return None
    assumed = "" if host.cores is not None else " (assumed; pass the host to check this machine)"
    return Warning(
        "thread-oversubscription",
        "Thread oversubscription",
        f"{threads} compute threads on {cores} cores{assumed}: past the core count throughput "
        "falls as concurrency rises (context switches, cache misses, GIL handoffs)",
        f"cap the pool near the core count (workers={cores}); let the rest wait in the bounded queue",
    )


def _order_lost(t: Traits, delivery: str, execution: str, host: Host) -> Warning | None:
    if not t.ordered or execution not in _CONCURRENT or t.concurrency == 1 or t.workers == 1:
        return None
    return Warning(
        "order-lost-by-parallel-model",
        "Order lost by a parallel model",
        f"ordered=True but {execution} completes units out of order: consumers that assume input "
        "order silently see another one",
        "restore order at the join (map(ordered=True), or merge chunks by index), or declare "
        "key= to keep order per key on one in-order consumer",
    )


def _ipc_dominated(t: Traits, delivery: str, execution: str, host: Host) -> Warning | None:
    if execution != "processes" or t.est is None or t.est >= IPC_EST:
        return None
    return Warning(
        "ipc-dominated-process-work",
        "Process work dominated by IPC",
        f"est={fmt_seconds(t.est)} per unit on processes: pickling the arguments and result and "
        "crossing a pipe costs about as much as the work, so more processes buy little",
        "batch many items per call (one call per chunk), or use a bounded pool of threads if "
        "isolation is not required",
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
    ("order-lost-by-parallel-model", _order_lost),
    ("ipc-dominated-process-work", _ipc_dominated),
)
CODES: tuple[str, ...] = (*(code for code, _ in CHECKS), OVERRIDE_CODE)


def check_all(t: Traits, delivery: str, execution: str, host: Host) -> tuple[Warning, ...]:
    """Every anti-pattern these traits walk into on ``delivery/execution``, in table order."""
    found = (check(t, delivery, execution, host) for _, check in CHECKS)
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
