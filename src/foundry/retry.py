"""One back-off policy for every retry in Foundry: exponential, capped, with jitter.

    delay(n) = jitter(min(cap, base · factor^(n-1)))        n = 1 before the first retry

``n`` is always the *number of the retry* (1-based): the delay before retry 1 is ``base``
(before jitter), before retry 2 ``base · factor``, and so on up to ``cap``. Jitter spreads
the retries of many failures of the same cause (an upstream that went down for
everyone) so that they do not come back in step:

* ``"equal"`` (the default): uniform in the upper half, ``[d/2, d]`` — never less than
  half the nominal delay, so a back-off still backs off;
* ``"full"``: uniform in ``[0, d]`` (AWS's "full jitter");
* ``"none"``: exactly ``d`` — for a loop whose total duration is documented (riding out a
  store's restart) or one that is alone by construction (one stream partition).

Who uses it, with which parameters (each documented where it is declared):

=========================  ==================================  =========================
user                       parameters                          documented in
=========================  ==================================  =========================
queue worker (a job)       ``backoff=`` (1 s), cap 10 min,     ``docs/queue.md``
                           equal jitter
workflow step / undo       ``backoff=`` (1 s), ``max_backoff``  ``docs/workflows.md``
                           (5 min), equal jitter
stream consumer (an event) ``retry_backoff`` (100 ms), cap     ``docs/streams.md``
                           5 s, no jitter (one partition)
a store's outage           50 ms, cap 1–2 s, no jitter         the caller's docstring
=========================  ==================================  =========================

A workflow step's delay lands in the journal (the retry's wake-up time), so jitter does
not make a replay non-deterministic: the recorded time is what every replay reads.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from foundry.errors import DeclarationError

__all__ = ["JITTERS", "OUTAGE", "Backoff", "Jitter"]

Jitter = Literal["none", "equal", "full"]
JITTERS: tuple[str, ...] = ("none", "equal", "full")


@dataclass(frozen=True, slots=True)
class Backoff:
    """``base`` seconds before the first retry, times ``factor`` per retry, at most ``cap``."""

    base: float = 1.0
    cap: float = 300.0
    factor: float = 2.0
    jitter: Jitter = "equal"
    owner: str = "retry policy"  # who declared it, for the error a bad value gets

    def __post_init__(self) -> None:
        for name, low in (("base", 0.0), ("cap", 0.0), ("factor", 1.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise DeclarationError(self.owner, name, value, "is not a finite number", f"give {name}=1.0")
            if value < low:
                raise DeclarationError(
                    self.owner, name, value, f"is below {low:g}", f"give {name} ≥ {low:g} (seconds)"
                )
        if self.jitter not in JITTERS:
            raise DeclarationError(
                self.owner, "jitter", self.jitter, "is not a jitter", f"use one of {', '.join(JITTERS)}"
            )

    def nominal(self, retry: int) -> float:
        """The delay before retry number ``retry`` (1-based) without jitter."""
        if retry < 1:
            return 0.0
        try:
            grown = self.base * self.factor ** (retry - 1)
        except OverflowError:
            return self.cap
        return min(self.cap, grown)

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """The delay before retry number ``retry`` (1-based), jittered."""
        d = self.nominal(retry)
        if self.jitter == "none" or d <= 0:
            return d
        draw = (rng or random).uniform
        return draw(d / 2.0, d) if self.jitter == "equal" else draw(0.0, d)

    def pauses(self, rng: random.Random | None = None) -> Iterator[float]:
        """The delays before retry 1, 2, 3, … (endless: the caller bounds the tries)."""
        retry = 0
        while True:
            retry += 1
            yield self.delay(retry, rng)


# Riding out a store that cannot be reached (a restart): 50 ms doubling to 2 s, no jitter
# so that the documented totals hold (a workflow run's journal call: 8 tries, about 5 s).
OUTAGE = Backoff(0.05, 2.0, jitter="none", owner="a store's outage")
