"""Idempotent stream handlers: a handler run once per event id, across consumers and hosts.

Two ways, both on an idempotency store (``foundry.backends.idempotency``):

* **A group declared idempotent** (``ConsumerOptions(idempotent=True)``, or a store URL):
  the consumer wraps the handler in :class:`OnceGuard` — *claim* the event id, run the
  handler, *record* it done (or *release* the claim when it raised). Another consumer
  holding the same id meanwhile is told ``busy`` and retries later; a recorded id is
  skipped and committed. The store is on the stream's own engine unless a URL names
  another, so a stream on NATS or Redis dedupes across hosts. At-least-once: a crash
  after the effect and before the record runs the handler again once the claim's lease
  (the group's ack deadline, or its timeout if longer) has passed.
* **:class:`Idempotency`**, a SQLite helper whose record commits *in the same transaction*
  as your own writes to that file: exactly-once effect for those writes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

from foundry.backends.idempotency import Claim, IdempotencyStore, TransactionalStore, open_idempotency_store
from foundry.deliver.stream.event import StreamEvent
from foundry.errors import BackendError, BackendUnavailableError, SubmitError

__all__ = ["ClaimedElsewhereError", "Idempotency", "IdempotencyUnavailableError", "OnceGuard"]

log = logging.getLogger("foundry.stream")

_FOREVER = 100 * 365 * 24 * 3600.0  # the helper keeps its records (it always did)


class ClaimedElsewhereError(BackendError):
    """Another consumer holds the claim of this event id: the event is retried later."""


class IdempotencyUnavailableError(BackendUnavailableError):
    """The idempotency store stayed unreachable until the consumer stopped: the event was
    not run and stays pending (redelivered), it is not a failure of the event."""


class OnceGuard:
    """Run a handler at most once per event id of one scope (``<stream>/<group>``), as
    ``owner`` (the consumer's name): claim, run, record; see the module docstring."""

    def __init__(
        self,
        store: IdempotencyStore,
        scope: str,
        owner: str,
        lease: float,
        ride: Callable[[Callable[[], Any]], Any] | None = None,
    ) -> None:
        self.store = store
        self.scope = scope
        self.owner = owner
        self.lease = lease
        # How a store call rides out an outage (the consumer retries until it stops): an
        # unreachable store delays events, it never fails or dead-letters them.
        self._ride = ride or (lambda call: call())

    def run(self, key: str, effect: Callable[[], Any]) -> bool:
        """Run ``effect`` unless ``key`` was handled; ``False`` when it was skipped.
        Raises :class:`ClaimedElsewhereError` while another consumer holds the claim, and
        what ``effect`` or the store raised (then nothing is recorded)."""
        try:
            claim: Claim = self._ride(lambda: self.store.claim(self.scope, key, self.owner, self.lease))
        except BackendUnavailableError as exc:
            raise IdempotencyUnavailableError(f"stream {self.scope}: event {key!r} not run: {exc}") from exc
        if claim.status == "done":
            log.debug("stream %s: event %s was handled already; skipped", self.scope, key)
            return False
        if claim.status == "busy":
            raise ClaimedElsewhereError(
                f"stream {self.scope}: event {key!r} is being handled by {claim.owner} (its claim runs "
                f"{max(0.0, claim.until - time.time()):.1f}s more); retried after it"
            )
        if claim.took_over:
            log.warning(
                "stream %s: event %s: the consumer that claimed it first did not record it (it crashed "
                "or overran its lease); its effect may have happened, and the handler runs again",
                self.scope,
                key,
            )
        try:
            effect()
        except BaseException:
            with contextlib.suppress(BackendError):
                self.store.release(self.scope, key, self.owner)
            raise
        try:
            recorded = bool(self._ride(lambda: self.store.complete(self.scope, key, self.owner)))
        except BackendError as exc:
            log.warning(
                "stream %s: event %s was handled but its record could not be written (%s); a "
                "redelivery after %gs may run it again",
                self.scope,
                key,
                exc,
                self.lease,
            )
            return True
        if not recorded:
            log.warning(
                "stream %s: event %s was handled after its claim expired (the handler ran over %gs) "
                "and another consumer took it over: its effect may have happened twice",
                self.scope,
                key,
                self.lease,
            )
        return True


class Idempotency:
    """A record of the event ids a group has handled, in a SQLite file, for handlers that
    must not apply an event twice.

    ``with idem.once(event) as tx:`` opens one transaction, records ``event.id`` for
    ``event.group`` and hands you the connection (``tx``) — or ``None`` when the id was
    already recorded, i.e. this is a redelivery or a replay of an event already applied.
    Write your effect through ``tx``: the effect and the record commit together or not at
    all (exactly-once effect for writes to this database). For effects elsewhere, the
    record narrows duplicates to a crash between your effect and the commit.

    ``forget(group)`` drops a group's record — do it before a deliberate replay whose
    effects you *want* applied again. Records are kept until forgotten. The file is an
    idempotency store (``foundry.backends.idempotency.sqlite``): ``store`` is it.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        store = open_idempotency_store(f"sqlite:///{self.path}", max_age=_FOREVER, max_records=1 << 62)
        self.store = cast(TransactionalStore, store)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A plain transaction on the same database (set-up, reports, resets)."""
        with self.store.transaction() as conn:
            yield conn

    @staticmethod
    def _check_id(group: Any, event_id: Any) -> None:
        if not isinstance(event_id, str) or not event_id or not isinstance(group, str):
            raise SubmitError(
                f"Idempotency: event id {event_id!r} (group {group!r}) cannot be recorded: an empty id "
                "would make every other id-less event look applied already. Fix: pass the StreamEvent "
                "your handler received (Foundry gives every event an id, derived from its stream, "
                "partition and offset when its producer set none)"
            )

    @contextlib.contextmanager
    def once(self, event: StreamEvent) -> Iterator[sqlite3.Connection | None]:
        """Record ``event.id`` for ``event.group`` with your writes; ``None`` when it was
        recorded before. An event without an id is refused (:class:`SubmitError`), never
        treated as seen."""
        self._check_id(event.group, event.id)
        with self.store.once_in_transaction(event.group, event.id) as conn:
            yield conn

    def seen(self, group: str, event_id: str) -> bool:
        self._check_id(group, event_id)
        return self.store.lookup(group, event_id) is not None

    def forget(self, group: str) -> int:
        return self.store.forget(group)

    def close(self) -> None:
        self.store.close()
