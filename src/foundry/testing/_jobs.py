"""A queue job run eagerly, in the caller's thread, the way a worker would run it.

The sandbox (:mod:`foundry.testing.sandbox`) runs the jobs its eager runners
(:mod:`foundry.testing._queue`) hand it, and the jobs it held for the clock, with these:
a module of its own so that the sandbox and the runner both import it and neither
imports the other to reach it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import json
from typing import Any

from foundry.backends.queue import JobState, JobStatus, NewJob
from foundry.deliver.queue import outcome_of
from foundry.deliver.worker import retries_on
from foundry.errors import RecordError, SubmitError
from foundry.execute.progress import reporting
from foundry.handle import FutureSource, Handle, Outcome
from foundry.payload import DEFAULT_MAX_PAYLOAD, RESULT_FIX, too_large
from foundry.runtime import UnitSpec
from foundry.serialize import decode_call, encode_error, get_codec
from foundry.typed import payloads_for

__all__ = ["job_handle", "run_job", "settle"]


def job_handle(spec: UnitSpec, job: NewJob, future: cf.Future[Any]) -> Handle:
    return Handle(job.id, spec.name, FutureSource(future))


def settle(future: cf.Future[Any], outcome: Outcome) -> None:
    if future.done():
        return
    if outcome.error is not None:
        future.set_exception(outcome.error)
    else:
        future.set_result(outcome.value)


def run_job(spec: UnitSpec, job: NewJob) -> Outcome:
    """Run ``job`` as a worker would, in this thread: its outcome as its submitter sees it."""
    attempts = 0
    while True:
        try:  # a worker decodes the stored bytes on every delivery; a record it cannot is not retried
            args, kwargs = decode_call(
                job.payload,
                job.codec,
                spec.traits.codec,
                unit=spec.name,
                what=f"job {job.id}'s arguments",
                types=payloads_for(spec.name, spec.fn),  # rebuilt by the unit's annotations, as a worker does
            )
        except RecordError as exc:
            return Outcome(error=exc)
        try:
            with reporting(None):
                value = _invoke(spec, args, kwargs)
        except Exception as exc:
            if attempts < job.max_retries and retries_on(spec.traits.retry_on, exc):
                attempts += 1
                continue
            return _failed(spec, job, attempts, exc)
        return _succeeded(spec, job, attempts, value)


def _invoke(spec: UnitSpec, args: list[Any], kwargs: dict[str, Any]) -> Any:
    if not spec.is_async:
        return spec.fn(*args, **kwargs)
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop in this thread: run the coroutine on one of its own
        return asyncio.run(spec.fn(*args, **kwargs))
    with cf.ThreadPoolExecutor(1, thread_name_prefix="foundry-eager") as pool:  # a loop runs here
        return pool.submit(asyncio.run, spec.fn(*args, **kwargs)).result()


def _state(spec: UnitSpec, job: NewJob, attempts: int, status: JobStatus, **record: Any) -> JobState:
    return JobState(
        job.id,
        spec.name,
        job.queue,
        status,
        deliveries=attempts + 1,
        attempts=attempts,
        codec=job.codec,
        key=job.key,
        **record,
    )


def _succeeded(spec: UnitSpec, job: NewJob, attempts: int, value: Any) -> Outcome:
    try:  # as the worker records it: checked against the declared return type, then encoded
        codec = get_codec(spec.traits.codec)
        typed = payloads_for(spec.name, spec.fn).dump_result(value, what=f"the result of job {job.id}")
        data = codec.encode(typed if codec.name == "json" else value, unit=spec.name, what="the result")
    except SubmitError as exc:  # a result of the wrong type: the job fails, as on a worker
        return Outcome(error=exc)
    except Exception as exc:
        error = SubmitError(
            f"unit {spec.name!r}: the result of job {job.id} cannot be encoded with codec="
            f"{spec.traits.codec!r} ({type(exc).__name__}: {str(exc)[:200]}); a worker would fail the job "
            "the same way. Fix: return plain data (str, int, float, bool, None, list, dict), or a reference"
        )
        error.__cause__ = exc
        return Outcome(error=error)
    limit = spec.traits.max_payload or DEFAULT_MAX_PAYLOAD
    if len(data) > limit:
        return Outcome(
            error=too_large(
                f"unit {spec.name!r}",
                f"the result of job {job.id}",
                len(data),
                limit,
                stored="the job failed and the result was not stored",
                fix=RESULT_FIX,
            )
        )
    return outcome_of(_state(spec, job, attempts, JobStatus.SUCCEEDED, result=data), spec)


def _failed(spec: UnitSpec, job: NewJob, attempts: int, exc: Exception) -> Outcome:
    record = json.dumps(encode_error(exc)).encode()
    rebuilt = outcome_of(_state(spec, job, attempts, JobStatus.FAILED, error=record), spec).error
    if rebuilt is None or type(rebuilt) is type(exc):
        return Outcome(error=exc)  # what the submitter would see, and its traceback into the unit
    rebuilt.__cause__ = exc
    rebuilt.add_note(
        f"foundry.testing: the unit raised {type(exc).__module__}.{type(exc).__qualname__}, which a real "
        f"queue's submitter gets as {type(rebuilt).__name__}: its type is not on unit {spec.name!r}'s "
        "allow-list. Fix: app.errors.register(...) it, or name it in errors= (docs/security.md)"
    )
    return Outcome(error=rebuilt)
