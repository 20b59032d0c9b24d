"""The limits backend contract: rate limits and concurrency caps kept in the engine, so
they hold across every worker process on every host (``docs/limits.md``).

A *limit* (:class:`Limit`) belongs to one unit: a token bucket (``rate`` tokens per
second, ``burst`` tokens at most), a number of concurrency slots (``slots``), or both.
With ``per=`` each value of the job's argument has its own bucket and slots: the
*scope* of a call is ``(limit.unit, key)``, ``key`` being ``""`` without ``per=``.

Every engine (SQLite, PostgreSQL, Redis; RabbitMQ's jobs use the engine of the AMQP
queue's state store) implements :class:`LimitsBackend` and passes the one conformance
suite (``tests/backends/limits``). The contract:

* **Acquire is atomic and all-or-nothing.** :meth:`LimitsBackend.acquire` either takes
  a token *and* leases a slot to ``holder`` (what the limit has of each), returning a
  granted :class:`Verdict`, or takes nothing and says which limit refused and how long
  to wait before asking again. No two callers, in any process on any host, can both be
  granted the last token or the last slot: the check and the take are one transaction
  (one ``BEGIN IMMEDIATE`` on SQLite, one row lock on PostgreSQL, one Lua script on
  Redis).
* **The bucket.** It starts full (``burst`` tokens) and refills continuously at ``rate``
  tokens per second up to ``burst``; a grant takes one token. So in any window of
  ``w`` seconds at most ``burst + w × rate`` grants happen in one scope, and over a
  long run the average is ``rate``. The engine's clock is the bucket's (PostgreSQL's
  ``clock_timestamp()``, Redis's ``TIME``; SQLite serves one host): workers whose clocks
  disagree share one bucket still.
* **Slots are leases.** A granted slot is held by ``holder`` until ``lease`` seconds
  from the grant (or the last :meth:`~LimitsBackend.renew`); a slot past its lease is
  free for anyone. A worker renews the slots of the jobs it runs with their leases, so
  a SIGKILLed worker's slot comes back when its job's lease lapses, never forever.
  Acquiring a slot a holder already holds renews it and takes no token (idempotent per
  holder: a retried call never takes two slots).
* **Release is idempotent.** :meth:`~LimitsBackend.release` frees the holder's slot; a
  second release, or the release of a lapsed slot, changes nothing and returns
  ``False``. Tokens are never given back: a started job has spent its token.
* **Nothing waits inside the engine.** ``acquire`` never blocks for a token or a slot;
  the caller decides how to wait (the queue worker parks the job, see
  ``foundry.deliver.limits``).

Every method may raise :class:`~foundry.errors.BackendUnavailableError` when the engine
cannot be reached; the worker then waits and asks again (a job never starts without its
grant).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from foundry.errors import SubmitError

__all__ = ["SLOT_POLL", "Limit", "LimitsBackend", "Verdict", "check_limit", "scope_key"]

SLOT_POLL = 0.1
"""Seconds a caller refused a slot waits before it asks again (a slot freed on another
host sends no notification; one freed in the same worker wakes its waiters at once)."""


@dataclass(frozen=True, slots=True)
class Limit:
    """The limits of one unit: a bucket (``rate`` > 0, ``burst`` ≥ 1), slots, or both."""

    unit: str
    rate: float | None = None  # tokens per second
    burst: int | None = None  # the bucket's capacity (tokens); ``rate_limit="100/s"``: 100
    slots: int | None = None  # jobs at once (``max_concurrency``)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What :meth:`LimitsBackend.acquire` decided."""

    granted: bool
    wait: float = 0.0  # refused: seconds until asking again may succeed (a token refills; a slot: SLOT_POLL)
    limit: str = ""  # refused: "rate_limit" or "max_concurrency"


def check_limit(limit: Limit, key: str, holder: str, lease: float) -> None:
    """Reject arguments no engine could honour (every engine calls it first)."""
    if limit.rate is None and limit.slots is None:
        raise SubmitError(f"limit of unit {limit.unit!r} has neither a rate nor slots. Fix: give one")
    if limit.rate is not None and (
        not math.isfinite(limit.rate) or limit.rate <= 0 or (limit.burst or 0) < 1
    ):
        raise SubmitError(
            f"limit of unit {limit.unit!r}: rate={limit.rate} and burst={limit.burst} must be positive. "
            'Fix: e.g. rate_limit="100/s"'
        )
    if limit.slots is not None and limit.slots < 1:
        raise SubmitError(
            f"limit of unit {limit.unit!r}: slots={limit.slots} must be ≥ 1. Fix: max_concurrency=1"
        )
    if not holder or not math.isfinite(lease) or lease <= 0:
        raise SubmitError(
            f"limit of unit {limit.unit!r}: holder={holder!r} and lease={lease} must be given. "
            "Fix: the job's id and token, and its lease in seconds"
        )
    if len(key) > 200:
        raise SubmitError(f"limit of unit {limit.unit!r}: key is {len(key)} characters. Fix: use scope_key()")


def scope_key(value: object) -> str:
    """The key of a ``per=`` argument's value: short strings and integers as themselves,
    anything else by a digest of its ``repr`` (so a large value never makes a large key)."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        text = f"{type(value).__name__}:{value!r}"
        return "#" + hashlib.sha256(text.encode()).hexdigest()[:32]
    text = str(value)
    if len(text) <= 100 and text.isprintable() and not text.startswith("#"):
        return text
    return "#" + hashlib.sha256(text.encode()).hexdigest()[:32]


class LimitsBackend(Protocol):
    """Token buckets and leased slots in one engine. See the module docstring."""

    @property
    def url(self) -> str:
        """The engine's URL with its secrets masked."""
        ...

    def acquire(self, limit: Limit, key: str, holder: str, *, lease: float) -> Verdict:
        """Take a token and lease a slot to ``holder`` in scope ``(limit.unit, key)``, both
        or neither; never blocks for them."""
        ...

    def renew(self, held: Sequence[tuple[str, str, str]], *, lease: float) -> int:
        """Extend the leases of the slots ``(unit, key, holder)`` to now + ``lease``; how
        many were still held (a lapsed slot is not taken back)."""
        ...

    def release(self, unit: str, key: str, holder: str) -> bool:
        """Free the holder's slot; ``False`` when it held none (released, or lapsed)."""
        ...

    def in_use(self, unit: str, key: str) -> int:
        """Slots held now (not lapsed) in the scope."""
        ...

    def tokens(self, unit: str, key: str, limit: Limit) -> float:
        """Tokens in the scope's bucket now (``limit.burst`` for a bucket never used)."""
        ...

    def close(self) -> None: ...
