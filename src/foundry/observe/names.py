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
# Per pool (labels: unit)
POOL_BUSY = "foundry_pool_busy"
POOL_REJECTED = "foundry_pool_rejected_total"
CPU_UTILISATION = "foundry_cpu_utilisation"
# Per process pool (labels: unit, code / unit)
CHILD_EXITS = "foundry_child_exits_total"
CHILD_RESTARTS = "foundry_child_restarts_total"
# Per channel (labels: stage)
CHANNEL_FILL = "foundry_channel_fill"
CHANNEL_BLOCKED_SENDERS = "foundry_channel_blocked_senders"
# Durable queue (labels: unit)
JOB_RETRIES = "foundry_job_retries_total"
JOB_DEAD = "foundry_job_dead_total"
JOB_REDELIVERIES = "foundry_job_redeliveries_total"
# Streams (labels: stream, group, partition)
STREAM_CONSUMER_LAG = "foundry_stream_consumer_lag"
STREAM_PUBLISHED = "foundry_stream_published_total"  # labels: stream
STREAM_CONSUMED = "foundry_stream_consumed_total"  # labels: stream, group (the same below)
STREAM_REDELIVERED = "foundry_stream_redelivered_total"
STREAM_DEAD = "foundry_stream_dead_letters_total"
STREAM_IN_FLIGHT = "foundry_stream_in_flight"
STREAM_HANDLER_SECONDS = "foundry_stream_handler_seconds"
# Workflows (labels: workflow, state)
WORKFLOW_STEPS = "foundry_workflow_steps"
WORKFLOW_COMPENSATIONS = "foundry_workflow_compensations_total"

ALL: tuple[str, ...] = tuple(v for k, v in dict(globals()).items() if k.isupper() and isinstance(v, str))
