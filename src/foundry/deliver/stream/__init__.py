"""The event-stream runtime: publishing, consumer groups, replay, lag, dead letters.

A :class:`StreamRuntime` serves one declared stream over a :class:`StreamBackend`
(``foundry.backends.stream``). Publishing appends JSON events; every *group* sees every
event; inside a group, *consumers* (threads here, or other processes on other hosts)
share the partitions.

How per-key order is kept, even under redelivery and with several consumers in a group:

1. **A key lives in one partition** (a stable hash of the key), appended in order.
2. **One consumer owns a partition at a time.** Consumers renew a membership record
   (``join``) and assign partitions by a range rule over the sorted live members; a
   consumer reads a partition only while it holds that partition's *lease*
   (``acquire``, renewed every third of ``session``). A consumer that dies stops
   renewing; after ``session`` seconds another consumer takes the lease over. Moving one
   partition pauses only that partition — no stop-the-world rebalance.
3. **One event in flight per partition.** The owner handles a batch strictly in offset
   order, one event after another, and commits the batch (cumulative) before reading
   the next one. A failing event is retried *in place* (with back-off) — the events
   after it in its partition wait — until it succeeds or is dead-lettered. The back-off
   pauses only that partition: the consumer serves its other partitions meanwhile and
   resumes the paused batch when its retry is due.
4. **Redeliveries come first, one at a time.** The backend never hands out a later
   event while an earlier one is pending (``read`` contract). After a crash, the new
   owner gets the uncommitted window back, oldest first, and takes it one event per
   read and one commit per event until it sees a fresh event again, so a poison event
   that kills its consumer is counted precisely and the events behind it are not.

At-least-once: an event is committed only after its handler returned. A crash between
the handler and the commit redelivers the events of the uncommitted window (at most one
batch) — make handlers idempotent: ``event.id`` is the producer's id, stable across
redeliveries and replays. A group declared ``idempotent`` runs its handler once per
event id across consumers and hosts (claim, run, record on an idempotency store on the
stream's own engine: ``idempotency``); :class:`Idempotency` records handled ids atomically
with your own writes to a SQLite file.

The package, one concept a module: ``event`` (what handlers get), ``options`` (how a
group consumes), ``runtime`` (:class:`StreamRuntime`), ``consumer`` (one member of a
group), ``consumers`` (the members one ``run`` started), ``idempotency``, ``unit`` (an
``@app.work`` unit decided as ``stream``) and ``_outage`` (riding out an engine outage).

An event delivered more than ``max_deliveries`` times without an acknowledgement (its
consumer crashed or overran the ack deadline each time), or whose handler raised on
``max_deliveries`` attempts, is written to the dead letters with the reason (and the
error) and the group moves on.
So is a stored entry that is not an event Foundry can read (a foreign producer's,
a corrupted row: ``Event.malformed`` says why), at once. A consumer whose threads die
(a bug, a handler calling ``sys.exit``) leaves the group, so its partitions go to the
other members, and says so in the log, the failures metric and ``Consumers.failures``.
"""

from foundry.deliver.stream.consumers import Consumers
from foundry.deliver.stream.event import Published, StreamEvent
from foundry.deliver.stream.idempotency import Idempotency
from foundry.deliver.stream.options import ConsumerOptions
from foundry.deliver.stream.runtime import StreamRuntime
from foundry.deliver.stream.unit import make_runner

__all__ = [
    "ConsumerOptions",
    "Consumers",
    "Idempotency",
    "Published",
    "StreamEvent",
    "StreamRuntime",
    "make_runner",
]
