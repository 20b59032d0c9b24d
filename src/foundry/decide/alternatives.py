"""Why each model that was not chosen lost, in terms of the traits that ruled it out.

A reason names the trait that eliminated the model when one did; otherwise it
points at the answer that decided for the winner.
"""

from __future__ import annotations

from collections.abc import Callable

from foundry.decide.load import Demand
from foundry.decide.model import Host, Rejected
from foundry.decide.questions import ASYNC_MIN, HIGH_THROUGHPUT, LATENCY_BUDGET, PARALLEL_MIN_ITEMS
from foundry.traits import DELIVERIES, EXECUTIONS, Traits

__all__ = ["rejected_delivery", "rejected_execution"]

Reason = Callable[[Traits, Demand, Host], str | None]


def _direct(t: Traits, d: Demand, host: Host) -> str | None:
    if t.durable:
        return "durable=True: a crash of the process loses the work, and nothing retries it"
    if t.compensate or t.multi_step:
        return "several steps: a failure halfway leaves the earlier steps done and nothing undoes them"
    if (t.consumers or 1) > 1 or t.replay:
        return "one caller runs it once: no fan-out to several consumers, no replay"
    if t.background:
        return "background=True: the caller would block on work nobody waits for"
    return None


def _pool(t: Traits, d: Demand, host: Host) -> str | None:
    if t.durable:
        return "nothing is persisted: a lost dispatcher or worker loses durable work"
    if t.latency is None or t.latency > LATENCY_BUDGET:
        return "no latency budget under 50 ms that would justify a dispatcher and a worker fleet"
    if not t.idempotent:
        return "not idempotent: a request lost with its worker cannot safely be retried by the client"
    if t.shares:
        return f"workers must be stateless, but units share {', '.join(t.shares)}"
    return None


def _queue(t: Traits, d: Demand, host: Host) -> str | None:
    if t.ordered:
        return "no order between jobs: parallel consumers and retries reorder them"
    if (t.consumers or 1) > 1 or t.replay:
        return "a job goes to one consumer and is gone once acknowledged: no fan-out, no replay"
    if t.compensate:
        return "a queue retries a job but does not undo earlier steps when a later one fails"
    if not t.durable and not t.background:
        return "nothing must survive a crash and someone is waiting: a broker hop for nothing"
    return None


def _stream(t: Traits, d: Demand, host: Host) -> str | None:
    if t.compensate:
        return "a log delivers events; it does not retry or undo steps of one process"
    if not t.ordered and not t.replay and (t.consumers or 1) <= 1 and (t.rate or 0) < HIGH_THROUGHPUT:
        return "no order, fan-out, replay or high throughput: partitions, offsets and lag to run for nothing"
    return None


def _workflow(t: Traits, d: Demand, host: Host) -> str | None:
    if not t.multi_step and not t.compensate:
        return "one step: nothing to orchestrate, resume step by step, or compensate"
    return None


def _sequential(t: Traits, d: Demand, host: Host) -> str | None:
    if t.isolate:
        return "isolate=True: a crash in the work would take the caller down with it"
    if d.known and not d.single:
        if d.in_flight is not None and d.in_flight >= 1:
            return (
                f"{d.describe()}: one worker would be busy {d.in_flight:.0%} of the time and never "
                "drain the backlog"
            )
        return f"{d.describe()}: one at a time, the wall time is the sum of every wait"
    if t.stages and t.stages >= 2:
        return f"{t.stages} stages could overlap; one at a time they cannot"
    return None


def _async(t: Traits, d: Demand, host: Host) -> str | None:
    if t.bound in ("cpu", "mixed"):
        return f"bound={t.bound!r}: one computing handler stalls every task on the loop"
    if t.isolate:
        return "no crash containment: one crash ends every task on the loop"
    if d.slots is not None and d.slots < ASYNC_MIN:
        return f"{d.describe()}: tens need no event loop, and async colours every caller"
    if t.bound is None:
        return "not declared waiting-bound (bound='io'): async only pays for waiting work"
    return None


def _threads(t: Traits, d: Demand, host: Host) -> str | None:
    if t.isolate:
        return "isolate=True: threads share one address space, a crash takes them all"
    if not t.shares:
        return "nothing shared is declared: threads would add locks around no state"
    if t.bound != "cpu":
        return "shared state but waiting-bound: serialise per key instead of locking across threads"
    return None


def _bounded_pool(t: Traits, d: Demand, host: Host) -> str | None:
    if t.isolate:
        return "isolate=True: pooled threads share one address space, a crash takes every unit"
    if t.bound == "io" and d.slots is not None and d.slots >= ASYNC_MIN:
        return f"{d.describe()}: {d.slots} waiting at once; a thread each does not scale, tasks do"
    if d.computing and not d.threads_use_cores and d.known and not d.single:
        return (
            "computing in pure Python under the GIL: pooled threads take turns on one core "
            "(declare releases_gil=True if the code is native and releases it)"
        )
    if not d.known and not t.is_long:
        return "no count declared that needs a cap (declare concurrency=, or rate= with est=)"
    return None


def _processes(t: Traits, d: Demand, host: Host) -> str | None:
    if t.isolate:
        return None
    if d.computing and d.threads_use_cores and d.known and not d.single:
        why = "this interpreter has no GIL" if host.gil is False else "releases_gil=True"
        return f"{why}: threads use the cores without start-up or pickling"
    if t.est is not None and t.est < 0.001:
        return "no isolation needed, and pickling each call would cost as much as the work"
    return "no isolation needed: start-up and serialisation would be paid for nothing"


def _channels(t: Traits, d: Demand, host: Host) -> str | None:
    if not t.stages or t.stages < 2:
        return "no stages hand data on to each other (declare stages= for a pipeline)"
    return None


def _parallel(t: Traits, d: Demand, host: Host) -> str | None:
    if not t.partitionable:
        return "not one partitionable computation over data in memory (partitionable=True)"
    if t.items is not None and t.items < PARALLEL_MIN_ITEMS:
        return (
            f"{t.items} items: partitioning and merging cost more than they save below {PARALLEL_MIN_ITEMS}"
        )
    if t.isolate:
        return "isolate=True: chunks need crash containment, processes give it"
    if t.bound == "io":
        return "waiting-bound: partitioning pays for computation, not waiting"
    return None


_DELIVERY: dict[str, Reason] = {
    "direct": _direct,
    "pool": _pool,
    "queue": _queue,
    "stream": _stream,
    "workflow": _workflow,
}
_EXECUTION: dict[str, Reason] = {
    "sequential": _sequential,
    "async": _async,
    "threads": _threads,
    "bounded_pool": _bounded_pool,
    "processes": _processes,
    "channels": _channels,
    "parallel": _parallel,
}


def _rejected(
    models: tuple[str, ...],
    reasons: dict[str, Reason],
    t: Traits,
    d: Demand,
    host: Host,
    chosen: str,
    decided: str,
) -> tuple[Rejected, ...]:
    out = []
    for model in models:
        if model == chosen:
            continue
        reason = reasons[model](t, d, host) or f"{chosen} fits better ({decided})"
        out.append(Rejected(model, reason))
    return tuple(out)


def rejected_delivery(t: Traits, d: Demand, host: Host, chosen: str, decided: str) -> tuple[Rejected, ...]:
    return _rejected(DELIVERIES, _DELIVERY, t, d, host, chosen, decided)


def rejected_execution(t: Traits, d: Demand, host: Host, chosen: str, decided: str) -> tuple[Rejected, ...]:
    return _rejected(EXECUTIONS, _EXECUTION, t, d, host, chosen, decided)
