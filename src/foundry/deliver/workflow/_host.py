"""What a workflow run needs from the runtime that runs it: the :class:`RunHost` Protocol.

The runtime (``runtime.py``) makes each :class:`~foundry.deliver.workflow.run.Run` and
drives its plan (``_plan.py``), so it imports both; they, in turn, call back into it for
the journal, the clock, the codec, the metrics and the helpers in its "helpers the runs
use" section. Typing that as the concrete ``WorkflowRuntime`` would make the three
modules a circle; ``run.py`` and ``_plan.py`` type it by this Protocol instead, which
``WorkflowRuntime`` satisfies (``mypy --strict`` checks it where the runtime hands
``self`` to a run).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from foundry.backends.journal.base import Claim, Clock, JournalBackend, WorkflowStatus
    from foundry.observe.metrics import Registry
    from foundry.observe.tracing import Tracing
    from foundry.runtime import UnitSpec
    from foundry.serialize import Codec, ErrorTypes

__all__ = ["RunHost"]

T = TypeVar("T")


class RunHost(Protocol):
    """The part of ``WorkflowRuntime`` a run and its plan use."""

    @property
    def journal(self) -> JournalBackend: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def json(self) -> Codec:
        """The codec of the journal's own records (errors, step results)."""

    @property
    def metrics(self) -> Registry: ...
    @property
    def tracing(self) -> Tracing: ...
    @property
    def watchdog(self) -> float | None:
        """The loop watchdog's threshold on async steps' loops (``None``: off)."""

    @property
    def inline_wait(self) -> float:
        """How long a run waits in its thread (a sleep, a child, a back-off) before it parks."""

    @property
    def poll_slice(self) -> float:
        """The longest single nap while waiting inline."""

    @property
    def stopping(self) -> bool:
        """True once the runtime is closing: a run releases its lease at its next step."""

    def spec(self, name: str) -> UnitSpec: ...
    def error_types(self, name: str) -> ErrorTypes: ...
    def encode_args(self, spec: UnitSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes: ...
    def decode_args(self, claim: Claim, spec: UnitSpec) -> tuple[list[Any], dict[str, Any]]: ...
    def ride_outage(self, call: Callable[[], T]) -> T: ...
    def nap(self, mark: int | None, seconds: float) -> None: ...
    async def anap(self, mark: int | None, seconds: float) -> None: ...
    def step_threads(self) -> ThreadPoolExecutor: ...
    def count_step(self, workflow: str, state: str) -> None: ...
    def count_compensation(self, workflow: str) -> None: ...
    def count_outcome(self, workflow: str, status: WorkflowStatus) -> None: ...
    def parked(self, workflow_id: str, wake_at: float) -> None: ...
    def start_child(
        self, spec: UnitSpec, payload: bytes, child_id: str, *, parent: tuple[str, int]
    ) -> None: ...
    def adopt(self, workflow_id: str) -> None: ...
