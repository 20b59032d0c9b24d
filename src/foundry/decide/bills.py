"""The bills: one row per model, both axes, as data.

Every recommendation Foundry makes is one of these rows. A row says when to choose
the model, why it wins, what it costs, how it fails, which part of the invariant
("the work completes exactly once, its result is observed by whoever asked for it,
and no failure in one unit of work silently discards another's") it keeps, which
metrics show it going wrong, and the simpler thing to consider before paying for it.

Paraphrased from the seeds (000: the five system models; 003: the seven in-process
models). Metric names are the stable names of ``foundry.observe.names``, kept as
plain strings so this package imports nothing but traits and errors.
"""

from __future__ import annotations

from foundry.decide.model import Bill

__all__ = ["BILLS", "DELIVERY_BILLS", "EXECUTION_BILLS", "bill_for"]

_IN_FLIGHT = "foundry_unit_in_flight"
_COMPLETED = "foundry_unit_completed_total"
_FAILED = "foundry_unit_failed_total"
_DURATION = "foundry_unit_duration_seconds"
_DEPTH = "foundry_queue_depth"
_AGE = "foundry_queue_oldest_age_seconds"
_LOOP_LAG = "foundry_loop_lag_seconds"
_LOOP_BLOCKED = "foundry_loop_blocked_total"
_POOL_BUSY = "foundry_pool_busy"
_POOL_REJECTED = "foundry_pool_rejected_total"
_POOL_QUEUE_WAIT = "foundry_pool_queue_wait_seconds"
_POOL_LOST = "foundry_pool_lost_total"
_CHILD_EXITS = "foundry_child_exits_total"
_CHILD_RESTARTS = "foundry_child_restarts_total"
_CHANNEL_FILL = "foundry_channel_fill"
_CHANNEL_BLOCKED = "foundry_channel_blocked_senders"
_CPU = "foundry_cpu_utilisation"
_RETRIES = "foundry_job_retries_total"
_DEAD = "foundry_job_dead_total"
_REDELIVERIES = "foundry_job_redeliveries_total"
_LAG = "foundry_stream_consumer_lag"
_STEPS = "foundry_workflow_steps"
_COMPENSATIONS = "foundry_workflow_compensations_total"

DELIVERY_BILLS: dict[str, Bill] = {
    "direct": Bill(
        model="direct",
        choose_when="someone is waiting for the result now and can retry by hand if it fails",
        why="no infrastructure, no hand-off, the lowest latency there is, and the easiest to debug",
        costs="the caller is blocked until the work ends; no retry, no load balancing, one process",
        fails="the process dies and the work in it is gone; nothing retries it unless the caller does",
        guarantees=(
            "exactly once and observed while the process lives (the caller holds the result); "
            "a crash discards in-flight work, so the caller must be present to retry"
        ),
        watch=(_FAILED, _DURATION),
        simpler="nothing: direct is the floor on this axis",
    ),
    "pool": Bill(
        model="pool",
        choose_when="a latency budget under ~50 ms, served by interchangeable stateless workers, "
        "for work the client can safely retry",
        why="the first free worker process answers; the pool sizes itself between min_workers and "
        "max_workers with M/M/c to hold the latency target; no broker on one machine (local://, or "
        "local://served for workers run by foundry pool serve), NATS queue groups for workers on many "
        "hosts (nats://, foundry pool serve on each)",
        costs="nothing is persisted, so durability is the client's job: only idempotent=True units "
        "are retried; arguments and results cross a process (JSON by default); every request "
        "carries a deadline (30 s unless deadline=) and the intake is bounded (max_pending=)",
        fails="a worker that dies, times out or is cut off loses the request in it: idempotent units "
        "retry on another worker with the same key, others fail with WorkerLostError (it may or may "
        "not have happened); saturation shows as queue wait, then DeadlineExceededError and "
        "OverloadError; no worker at all is NoWorkerError at once",
        guarantees=(
            "at most once per attempt, answered once; observed by the caller on success; exactly "
            "once in effect only for idempotent units, through the client's retry"
        ),
        watch=(_POOL_BUSY, _POOL_QUEUE_WAIT, _POOL_LOST, _POOL_REJECTED, _CHILD_RESTARTS, _DURATION),
        simpler="direct execution in the request handler, if one process can carry the load",
    ),
    "queue": Bill(
        model="queue",
        choose_when="background work that must survive a crash and whose items need no order",
        why="simple and well understood; the work outlives any worker; load spreads over consumers; "
        "failures retry on their own",
        costs="a broker (SQLite by default) to keep; at-least-once delivery, so jobs must be "
        "idempotent or keyed; no order between jobs",
        fails="depth hides a slowdown until the oldest job is hours old; poison jobs loop until "
        "dead-lettered; two jobs for the same entity race",
        guarantees=(
            "exactly once in effect (at-least-once delivery + idempotency key + one completion "
            "record); the result is stored until read or expired; a crashed worker's lease "
            "expires and another worker redelivers"
        ),
        watch=(_DEPTH, _AGE, _RETRIES, _DEAD, _REDELIVERIES),
        simpler="direct execution with a retry, if losing the work on a crash is acceptable",
    ),
    "stream": Bill(
        model="stream",
        choose_when="events that must stay in order per key, be read by several independent "
        "consumers, be replayed, or arrive at high throughput",
        why="order per partition, replay from any offset, many consumer groups reading the same "
        "events, producers fully decoupled from consumers",
        costs="the most to operate: partitions, offsets, retention and consumer lag to watch; "
        "order is per partition, never global",
        fails="a slow consumer falls behind silently until lag is measured; one poison event blocks "
        "its partition; a rebalance replays uncommitted events",
        guarantees=(
            "at-least-once per consumer group; exactly once in effect only with idempotent "
            "consumers; nothing is discarded while the log retains it"
        ),
        watch=(_LAG, _FAILED, _DURATION),
        simpler="a queue, if there is one consumer, no replay and no order to keep",
    ),
    "workflow": Bill(
        model="workflow",
        choose_when="several steps across services, each of which can fail, that must be retried "
        "or undone (compensated), possibly over minutes or hours",
        why="retries, timeouts and compensation are built in; every step's state is visible; "
        "long runs survive restarts",
        costs="a journal and an orchestrator to run; step code must be deterministic on replay; "
        "a learning curve; overkill for one call",
        fails="the orchestrator's store is a single point of failure; changed code no longer "
        "matches old journals; a compensation can itself fail",
        guarantees=(
            "each step completes once in effect (journaled result, replay skips done steps); "
            "a failed step is retried or compensated, never silently dropped"
        ),
        watch=(_STEPS, _COMPENSATIONS, _RETRIES, _FAILED),
        simpler="a queue job that calls the steps in order, if nothing has to be undone",
    ),
}

EXECUTION_BILLS: dict[str, Bill] = {
    "sequential": Bill(
        model="sequential",
        choose_when="the work is small, or order between items is the requirement",
        why="no coordination and no interleavings: deterministic and trivially debuggable",
        costs="wall time is the sum of every step, every wait included",
        fails="it does not: it is slow, visibly and predictably",
        guarantees="everything the delivery model keeps; no failure class is added",
        watch=(_DURATION, _COMPLETED),
        simpler="nothing: sequential is the model the others have to beat",
    ),
    "async": Bill(
        model="async",
        choose_when="waiting-bound work, thousands in flight, short handlers",
        why="thousands in flight on one thread; each costs a task frame, not a thread stack",
        costs="async colours the whole call graph; every await is a point where others interleave",
        fails="one CPU-bound handler stalls every task on the loop (health checks included); "
        "unbounded task creation grows the heap until the OOM killer",
        guarantees="no data races (one thread), race conditions at every await remain",
        watch=(_LOOP_LAG, _LOOP_BLOCKED, _IN_FLIGHT, _DURATION),
        simpler="a bounded pool of threads if tens, not thousands, are in flight; or the server "
        "framework's own model",
    ),
    "threads": Bill(
        model="threads",
        choose_when="compute-bound units that must share one mutable structure",
        why="shared memory with no copying, and true parallelism where the GIL is released or absent",
        costs="every shared field needs an invariant and a lock; the memory model is now yours",
        fails="data races, lost updates, deadlock, lock convoys, false sharing",
        guarantees="none beyond the delivery model's: correctness rests on your locks",
        watch=(_IN_FLIGHT, _CPU, _DURATION, _FAILED),
        simpler="remove the shared state (partition it by key, or pass messages) and use a pool",
    ),
    "bounded_pool": Bill(
        model="bounded_pool",
        choose_when="many short compute-bound or blocking tasks that need a cap",
        why="caps resource use, reuses workers, and makes the queue visible and measurable",
        costs="a size to choose with no universal formula, and a queue that must be bounded too",
        fails="saturation with a growing queue; deadlock when a pooled task waits on another "
        "task of the same pool",
        guarantees="an upper bound on concurrent work; nothing about latency once the queue is non-empty",
        watch=(_POOL_BUSY, _DEPTH, _AGE, _POOL_REJECTED, _CPU),
        simpler="sequential, if the wall time of one-at-a-time is acceptable",
    ),
    "processes": Bill(
        model="processes",
        choose_when="isolation or crash containment, untrusted or leaky native code, or "
        "compute that threads cannot spread over cores",
        why="a crash, leak or segfault stays in one address space; separate interpreters use separate cores",
        costs="tens of milliseconds to start; every argument and result is serialised; memory "
        "multiplied by the process count",
        fails="serialisation dominates chatty work; orphaned children; 16 workers x 10 connections "
        "exhausts the database",
        guarantees="memory isolation and crash containment (a dead child is a failed unit, not a "
        "dead parent); shared files, databases and locks are not isolated",
        watch=(_CHILD_EXITS, _CHILD_RESTARTS, _CPU, _DEPTH, _AGE),
        simpler="N single-threaded processes behind a load balancer (scale out, not in)",
    ),
    "channels": Bill(
        model="channels",
        choose_when="stages or actors that hand data on rather than share it",
        why="no shared mutable state: ownership moves with the message",
        costs="a copy or move per message; the buffer size and policy are design decisions",
        fails="unbounded buffers grow; a full channel deadlocks its sender; messages in buffers "
        "are lost at shutdown unless drained",
        guarantees="no shared mutable state along a channel; no delivery or cross-channel order guarantee",
        watch=(_CHANNEL_FILL, _CHANNEL_BLOCKED, _COMPLETED, _DEPTH),
        simpler="one sequential function that calls the stages in turn",
    ),
    "parallel": Bill(
        model="parallel",
        choose_when="one large computation over data already in memory that splits into chunks",
        why="the highest ceiling there is; the parallel phase needs no synchronisation",
        costs="partition and merge logic; floating-point results can differ run to run; "
        "memory bandwidth caps it; on a Dask or Ray cluster (cluster=), shipping every chunk "
        "over the network and the same code installed on every worker",
        fails="off-by-one chunk boundaries; load imbalance; false sharing; slower than sequential "
        "on small inputs; on a cluster, a worker lost mid-chunk (the cluster re-runs it)",
        guarantees="each item's result lands once at its own index, merged at the join (restore "
        "order there); a chunk is computed once on local processes, and may be re-run by a "
        "cluster after its worker died",
        watch=(_CPU, _DURATION, _IN_FLIGHT),
        simpler="a better algorithm, a vectorised library, or a database aggregate",
    ),
}

BILLS: dict[str, Bill] = {**DELIVERY_BILLS, **EXECUTION_BILLS}


def bill_for(model: str) -> Bill:
    """The row for ``model`` (a delivery or an execution name)."""
    return BILLS[model]
