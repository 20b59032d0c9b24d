"""A phase's call site: ``@unit.phase("sign")`` marks the function that does one phase of
an ``async def`` unit, so that Foundry knows where that phase runs and can move it.

::

    @app.work(est="40ms", bound="io", concurrency=300, rate="300/s", adaptive=True)
    async def handle_payment(payment: dict) -> dict:
        replies = await call_upstreams(payment)          # waiting: on the loop
        return {"replies": replies, "signature": await sign(payment["body"])}

    @handle_payment.phase("sign")
    def sign(body: bytes) -> str: ...                    # 35 ms of pure-Python CPU

**Where it runs.** ``await sign(x)`` runs the function on the phase's decision. While that
decision keeps the work in its caller (``sequential``, ``async``) it runs *inline*: in the
awaiting task, on the loop, exactly as the plain call ``sign(x)`` would — no thread hop,
no pickling, and a CPU step that holds the loop holds it (the watchdog sees it). Once the
decision runs it elsewhere (``threads``, ``bounded_pool``, ``processes``), the call goes to
a runner of that model (:func:`foundry.execute.make_runner`) and is awaited without
blocking the loop. A phase declared compute-bound (``phases={"sign": {"bound": "cpu"}}``)
is off the loop from its first call.

**Moving.** :meth:`Phase.move` swaps the runner in one assignment: calls that already run
inline finish on the loop, every call that starts afterwards goes to the new runner. The
new runner is made and started (a process pool's first child has answered) *before* the
swap, so no call waits for a pool to boot. :class:`foundry.execute.adaptive.PhaseMover`
calls it when the watchdog keeps finding the phase holding the loop and the unit opted
in (``adaptive=True``).

The function itself stays callable as ``sign.fn(x)``; a child process that imports the
module by name gets the function, not this wrapper.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from foundry.decide import Decision
from foundry.runtime import Runner, RuntimeContext, SubmitOptions, UnitSpec
from foundry.traits import Traits

__all__ = ["IN_THE_CALLER", "POOLS", "Phase"]

IN_THE_CALLER = frozenset({"sequential", "async"})
"""Executions that run a phase in its caller: for a phase awaited on a loop, on that loop."""
POOLS = frozenset({"threads", "bounded_pool", "processes"})
"""Executions a phase can be moved to: a pool that runs one call at a time per worker."""

_OPTIONS = SubmitOptions()


class Phase:
    """The call site of phase ``name`` of unit ``unit`` (see the module docstring)."""

    def __init__(
        self,
        unit: str,
        name: str,
        fn: Callable[..., Any],
        traits: Traits,
        decision: Decision,
        spec: UnitSpec,
        context: Callable[[], RuntimeContext],
        on_change: Callable[[Phase], None] | None = None,
    ) -> None:
        self.unit = unit
        self.name = name
        self.fn = fn
        self.traits = traits
        self.decision = decision
        """How the phase runs now: the declared decision, then whatever it was moved to."""
        self.declared = decision
        self.spec = spec  # named "<unit>.<phase>": its runner's metrics carry that unit label
        self.drift: Decision | None = None
        """A decision a measurement proposed without moving the phase (reported once)."""
        self._context = context
        self._on_change = on_change
        self._runner: Runner | None = None
        self._lock = threading.Lock()
        self.on_runner: Callable[[Phase], None] | None = None
        """Called once a runner off the loop is made (the mover watches its measurements)."""
        functools.update_wrapper(self, fn)

    @property
    def subject(self) -> str:
        return f"{self.unit}.{self.name}"

    @property
    def inline(self) -> bool:
        """The phase runs in its caller (on the loop, when awaited there)."""
        return self.decision.execution in IN_THE_CALLER

    @property
    def adaptive(self) -> bool:
        return self.traits.adaptive

    @property
    def runner(self) -> Runner | None:
        """The runner calls go to now (``None`` while the phase runs inline)."""
        return self._runner

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        runner = self._runner  # one read: a swap between two calls, never inside one
        if runner is None:
            if self.decision.execution in IN_THE_CALLER:
                return self.fn(*args, **kwargs)
            runner = self._start()
        handle = await runner.asubmit(args, kwargs, _OPTIONS)
        try:
            return await handle
        except asyncio.CancelledError:
            handle.cancel()  # the caller gave up: do not leave the work running for nobody
            raise

    def _start(self) -> Runner:
        """The runner for the current (off-loop) decision, made on first use."""
        with self._lock:
            runner = self._runner
            if runner is None:
                from foundry.execute import make_runner

                runner = self._runner = make_runner(
                    replace(self.spec, decision=self.decision), self._context()
                )
        if self.on_runner is not None:
            self.on_runner(self)
        return runner

    def prepare(self, decision: Decision) -> Runner:
        """A started runner for ``decision`` (not yet in use): made and warmed off the loop."""
        from foundry.execute import make_runner

        runner = make_runner(replace(self.spec, decision=decision), self._context())
        warm = getattr(runner, "warm", None)
        try:
            if warm is not None:
                warm()
        except BaseException:
            runner.close(1.0)
            raise
        return runner

    def swap(self, runner: Runner, decision: Decision) -> Decision:
        """From now on, calls go to ``runner`` (made by :meth:`prepare` for ``decision``);
        returns the decision it had. In-flight calls finish where they started."""
        with self._lock:
            old, previous = self._runner, self.decision
            self._runner, self.decision = runner, decision
        if old is not None:
            old.close(10.0)
        if self._on_change is not None:
            self._on_change(self)
        if self.on_runner is not None:
            self.on_runner(self)
        return previous

    def close(self, timeout: float = 10.0) -> None:
        """Drain and stop the runner (a later call makes a new one for the same decision)."""
        with self._lock:
            runner, self._runner = self._runner, None
        if runner is not None:
            runner.close(timeout)

    def __repr__(self) -> str:
        where = "inline" if self.inline else self.decision.model
        return f"<Phase {self.subject} {where}>"
