"""Stable metric names. Decisions list these in their watch lists; dashboards and
alerts key on them, so a rename is a breaking change."""

from __future__ import annotations

# Per unit (labels: unit, model)
UNIT_IN_FLIGHT = "foundry_unit_in_flight"
UNIT_COMPLETED = "foundry_unit_completed_total"
UNIT_FAILED = "foundry_unit_failed_total"
UNIT_DURATION = "foundry_unit_duration_seconds"
# Per hand-off (labels: unit or queue)
QUEUE_DEPTH = "foundry_queue_depth"
QUEUE_OLDEST_AGE = "foundry_queue_oldest_age_seconds"
# Per event loop (labels: loop)
LOOP_LAG = "foundry_loop_lag_seconds"
LOOP_BLOCKED = "foundry_loop_blocked_total"
LOOP_CULPRIT = "foundry_loop_culprit_total"  # labels: loop, unit, phase, culprit
# Live reclassification (foundry.execute.adaptive)
PHASE_MOVED = "foundry_phase_moved_total"  # labels: unit, phase, from, to (models)
PHASE_DRIFT = "foundry_phase_drift_total"  # labels: unit, phase, to (the proposed model)
# Per pool (labels: unit)
POOL_BUSY = "foundry_pool_busy"
POOL_REJECTED = "foundry_pool_rejected_total"
CPU_UTILISATION = "foundry_cpu_utilisation"
PARALLEL_WORKERS = "foundry_parallel_workers"  # labels: unit, engine (local, dask, ray)
PARALLEL_CHUNKS_LOST = "foundry_parallel_chunks_lost_total"  # labels: unit, engine
# Per process pool (labels: unit, code / unit)
CHILD_EXITS = "foundry_child_exits_total"
CHILD_RESTARTS = "foundry_child_restarts_total"
# Work pool (labels: unit; see foundry.deliver.pool)
POOL_QUEUE_WAIT = "foundry_pool_queue_wait_seconds"
POOL_WORKERS = "foundry_pool_workers"  # labels: unit, state (idle, busy, starting, retiring)
POOL_WORKER_STATE = "foundry_pool_worker_state"  # labels: unit, worker, state; 1 per live worker
POOL_RETRIES = "foundry_pool_retries_total"
POOL_LOST = "foundry_pool_lost_total"
POOL_RESIZES = "foundry_pool_resizes_total"  # labels: unit, direction (up, down)
POOL_TARGET_WORKERS = "foundry_pool_target_workers"
POOL_ARRIVAL_RATE = "foundry_pool_arrival_rate"
POOL_SERVICE_SECONDS = "foundry_pool_service_seconds"
POOL_PREDICTED_P99 = "foundry_pool_predicted_p99_seconds"
POOL_LATENCY_TARGET = "foundry_pool_latency_target_seconds"
# Per channel (labels: stage)
CHANNEL_FILL = "foundry_channel_fill"
CHANNEL_BLOCKED_SENDERS = "foundry_channel_blocked_senders"
# Durable queue (labels: unit)
JOB_RETRIES = "foundry_job_retries_total"
JOB_DEAD = "foundry_job_dead_total"
JOB_REDELIVERIES = "foundry_job_redeliveries_total"
JOB_CANCELLED = "foundry_job_cancelled_total"  # cancelled while a worker held them
# Rate limits and concurrency caps (labels: unit; see foundry.deliver.limits)
LIMIT_WAITING = "foundry_limit_waiting"  # jobs a worker holds that wait for a token or a slot now
LIMIT_WAIT_SECONDS = "foundry_limit_wait_seconds_total"  # seconds jobs waited on a limit before they started
LIMIT_REFUSED = "foundry_limit_refused_total"  # labels: unit, limit (rate_limit, max_concurrency)
# Schedules (labels: unit; see foundry.deliver.scheduler)
SCHEDULE_TICKS = "foundry_schedule_ticks_total"  # labels: unit, outcome (enqueued, duplicate, skipped, ...)
SCHEDULE_LATENESS = "foundry_schedule_lateness_seconds"  # tick time to its job's enqueue, by this scheduler
# Streams (labels: stream, group, partition)
STREAM_CONSUMER_LAG = "foundry_stream_consumer_lag"
STREAM_PUBLISHED = "foundry_stream_published_total"  # labels: stream
STREAM_CONSUMED = "foundry_stream_consumed_total"  # labels: stream, group (the same below)
STREAM_REDELIVERED = "foundry_stream_redelivered_total"
STREAM_DEAD = "foundry_stream_dead_letters_total"
STREAM_IN_FLIGHT = "foundry_stream_in_flight"
STREAM_HANDLER_SECONDS = "foundry_stream_handler_seconds"
STREAM_CONSUMER_FAILURES = "foundry_stream_consumer_failures_total"
# Workflows (labels: workflow, state)
WORKFLOW_STEPS = "foundry_workflow_steps"
WORKFLOW_COMPENSATIONS = "foundry_workflow_compensations_total"

ALL: tuple[str, ...] = tuple(v for k, v in dict(globals()).items() if k.isupper() and isinstance(v, str))
