"""The eager queue delivery: what ``foundry.app`` routes ``queue`` units to in a sandbox.

A :class:`EagerQueueRunner` is the real :class:`~foundry.deliver.queue.QueueRunner` up
to the moment a job would be enqueued — the arguments encoded with the unit's codec and
checked against ``max_payload``, the idempotency key derived, ``delay``/``eta`` checked
— and then, instead of writing the job to a store for a worker, hands it to the sandbox,
which runs it here (:mod:`foundry.testing._jobs`), in the caller's thread, the way a
worker would: the arguments *decoded* from those bytes, the unit called, retried at once
while ``retries``/``retry_on`` allow, the result encoded with the codec (and checked
against ``max_payload``) and decoded back for the handle. A payload or a result the JSON
codec would refuse fails here with the error the real path raises. A failure reaches
``handle.result()`` as the original exception (its traceback into your code intact) —
unless the real path would rebuild it as another type (one its allow-list does not
admit, ``docs/security.md``): then that is what you get, with the original as its
``__cause__``.

Not done eagerly: a job with ``delay=``/``eta=`` waits for the sandbox's
:class:`~foundry.testing.ManualClock` to reach it; a retry does not wait its back-off;
``timeout=`` is not enforced; ``isolate=True`` units run in this process too.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from foundry.backends.queue import NewJob
from foundry.deliver.queue import QueueRunner
from foundry.handle import Handle
from foundry.runtime import RuntimeContext, SubmitOptions, UnitSpec
from foundry.testing.sandbox import Sandbox, sandbox_of

__all__ = ["EagerQueueRunner", "make_runner"]


class EagerQueueRunner(QueueRunner):
    """A queue unit's runner that runs each job at submit (see the module docstring)."""

    def __init__(self, spec: UnitSpec, ctx: RuntimeContext, sandbox: Sandbox) -> None:
        super().__init__(spec, ctx)
        self.sandbox = sandbox

    def _new_job(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], options: SubmitOptions, trace: str | None = None
    ) -> NewJob:
        job = super()._new_job(args, kwargs, options, trace)
        if options.delay is not None:  # on the sandbox's clock, not the real one
            job = replace(job, eta=self.sandbox.clock.time() + options.delay)
        return job

    def _submit(self, job: NewJob) -> Handle:
        return self.sandbox.take_job(self.spec, job)

    def _enqueue_chunk(self, chunk: list[NewJob], name: str) -> list[Handle]:
        return [self._submit(job) for job in chunk]

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        handle = self.submit(args, kwargs, SubmitOptions())
        return handle.result(timeout=0)


def make_runner(spec: UnitSpec, ctx: RuntimeContext) -> EagerQueueRunner:
    return EagerQueueRunner(spec, ctx, sandbox_of(ctx))
