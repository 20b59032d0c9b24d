"""The RabbitMQ queue: the broker delivers, a state store remembers.

URL: ``amqp://user:password@host:5672/vhost``, or ``amqps://…`` for TLS, with query options

* ``state=`` — where job state lives (see below). Default: a SQLite file
  ``<home>/queue-amqp-<prefix>.db`` in the app's state directory (``Foundry(home=...)``,
  ``FOUNDRY_HOME``, the project's ``.foundry``: ``foundry.config.resolve_home``), so
  one machine only; for several machines use
  ``state=postgresql://…`` or ``state=redis://…`` (percent-encode a URL that has its own
  ``?``/``&``). The store's tables or keys are named after ``prefix`` unless its URL
  says otherwise.
* ``prefix=foundry`` — RabbitMQ queues are ``<prefix>.<queue>``;
* ``max_priority=10`` — the queues' ``x-max-priority``: priorities 0…max order the
  broker's delivery; lower ones count as 0 and higher ones as max *in the broker* (a
  claimed batch is still sorted by the exact priority);
* ``reconnect=15`` — seconds a call waits for a lost broker before raising
  :class:`~foundry.errors.BackendUnavailableError`;
* ``linger=1`` — seconds a worker keeps prefetched, unclaimed messages before giving
  them back to the queue for other workers;
* ``orphan_after=30`` — seconds after its eta that a queued job with no message is
  published again (see "crash windows");
* ``heartbeat=60`` — the AMQP heartbeat, passed to the client;
* with ``amqps://`` only: ``cafile=<CA file>``, ``certfile=``/``keyfile=`` (a client
  certificate), ``no_verify_ssl=0|1`` — passed to aiormq, checked first
  (``foundry.backends._urls``). A refused broker certificate is a
  :class:`~foundry.errors.ConfigError`. The state store is a URL of its own:
  ``state=rediss://…?ssl_ca_certs=…`` (percent-encoded) for Redis over TLS.

**Who keeps what.** RabbitMQ has no key/value store, so the job's record — payload,
idempotency key, lease and token, attempts, the single completion record, the result,
the dead-letter reason — is written to a *state store*, one of Foundry's own queue
stores (the same tables as the SQLite/PostgreSQL engines, or the Redis engine's keys).
RabbitMQ carries small persistent messages (lines of ``<job id> <priority> <eta>``; a
burst of due jobs of one queue and priority shares a message, at most 16) on a durable
priority queue, and pushes them to a consumer with ``basic.qos(prefetch)`` — workers
wake on delivery, they do not poll.

**A claim**: the worker takes up to ``limit`` pushed messages, leases *those* jobs in the
state store in one transaction (a job already leased, finished or cancelled is
skipped), then acknowledges the messages. From then on the lease in the store, not the
broker, is the truth: a worker that dies or hangs is recovered when *its job's lease*
lapses — any claimer of the queue checks the earliest lease deadline (at most every
second), puts the lapsed jobs back (or dead-letters a poison job) and publishes them
again. Messages are never held unacknowledged while a job runs, so RabbitMQ's
``consumer_timeout`` never kills a long job's channel.

**Delays live in the broker**: a delayed job or a scheduled retry is published to a
TTL queue ``<prefix>.<queue>.delay.<ms>`` (a power of two of milliseconds, at most the
remaining delay) whose expired messages dead-letter into the main queue; a message
that arrives before its eta is sent to the next smaller delay queue, so a delay of
``d`` ms takes at most ``log2(d)`` hops and none of it is held in a worker's memory.
Delay queues delete themselves when unused.

**Messages Foundry did not write** (not UTF-8, not lines of ``<job id> <priority> <eta
or ->``, more than 16 jobs) are copied with the reason (header ``x-foundry-reason``) to
``<prefix>.<queue>.rejected`` and acknowledged: they never pin a prefetch slot. A queue
RabbitMQ refuses to declare holds back only its own messages, retried on a back-off of
their own (``_amqp_client``).

**Crash windows** (stated honestly): a job is accepted when the state store committed
it; its message is published right after and confirmed asynchronously (unconfirmed
messages are re-sent after a reconnect). If the *submitting process* dies between the
two, the job exists without a message: a claimer that finds its queue empty in the
broker publishes the queued jobs older than ``orphan_after`` again, so such a job
runs late, not never. Duplicated messages are harmless: a job is leased only while it
is queued, and its completion is recorded once.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlencode, urlsplit, urlunsplit

from foundry.backends._urls import (
    AMQP_TLS,
    ShowsUrl,
    refused_certificate,
    safe_url,
    seconds_option,
    tls_options,
    url_options,
)
from foundry.backends.queue._amqp_client import AmqpClient, Consumer, Delivery
from foundry.backends.queue._amqp_state import StateStore, open_state
from foundry.backends.queue.base import (
    CancelResult,
    Capabilities,
    Claimed,
    Enqueued,
    JobProgress,
    JobState,
    JobStatus,
    NewJob,
    QueueStats,
    check_claim,
    check_fail,
)
from foundry.config import resolve_home
from foundry.errors import BackendUnavailableError, ConfigError

__all__ = ["AmqpQueue"]

_OWN = ("state", "prefix", "max_priority", "reconnect", "linger", "orphan_after")
_PASSED = ("heartbeat",)
_REAP_EVERY = 1.0  # longest a claimer goes without looking for lapsed leases
_SWEEP_EVERY = 10.0  # longest a claimer goes without looking for jobs that lost their message
_MAX_BUCKET = 31  # longest single delay hop: 2**31 ms (~24.8 days)


class _Signals:
    """``bump_all`` (a worker stopping) wakes this backend's waiting claimers and waiters."""

    def __init__(self, queue: AmqpQueue) -> None:
        self._queue = queue

    def bump_all(self) -> None:
        q = self._queue
        q.client.kick_consumers()
        bump = getattr(getattr(q.state, "signals", None), "bump_all", None)
        if callable(bump):
            bump()


class AmqpQueue(ShowsUrl):
    """The RabbitMQ queue backend (see the module docstring)."""

    capabilities: ClassVar[Capabilities] = Capabilities(
        notify=True,
        priority=True,
        cross_process_results=True,
        extras=("push", "publisher-confirms", "broker-delays", "state-store"),
    )

    uses_home: ClassVar[bool] = True  # the default state store is a file in the app's home

    def __init__(self, url: str, *, home: str | os.PathLike[str] | None = None) -> None:
        self._url = url  # to connect with; everything shown uses ``url`` (masked)
        shown = safe_url(url)
        parts = urlsplit(url)
        query = url_options("queue", url, _OWN, _PASSED, AMQP_TLS)
        tls = tls_options("queue", url, query, AMQP_TLS)
        self.prefix = query.get("prefix", "foundry")
        if not self.prefix or len(self.prefix) > 100 or any(c.isspace() or c == "." for c in self.prefix):
            raise ConfigError(
                f"queue URL {shown!r}: prefix={self.prefix!r} must be 1-100 characters without spaces or "
                "dots. Fix: e.g. ?prefix=myapp"
            )
        self.max_priority = int(seconds_option("queue", shown, query, "max_priority", 10))
        if not 1 <= self.max_priority <= 255:
            raise ConfigError(f"queue URL {shown!r}: max_priority must be 1..255. Fix: e.g. max_priority=10")
        reconnect = seconds_option("queue", shown, query, "reconnect", 15.0)
        linger = seconds_option("queue", shown, query, "linger", 1.0)
        self.orphan_after = seconds_option("queue", shown, query, "orphan_after", 30.0)
        state_url = query.get("state")
        self._own_state: Path | None = None
        if not state_url:
            folder = Path(home) if home else resolve_home()  # the app's, else the resolved one
            self._own_state = folder / f"queue-amqp-{self.prefix}.db"
            state_url = f"sqlite:///{self._own_state}"
        passed = {k: v for k, v in query.items() if k in _PASSED} | tls
        broker = urlunsplit(parts._replace(query=urlencode(passed)))
        self.state: StateStore = open_state(state_url, self.prefix)
        try:
            self.client = AmqpClient(broker, shown=shown, reconnect=reconnect, linger=linger)
        except BackendUnavailableError as exc:
            self.state.close()
            refused = refused_certificate(exc, "queue", url, "cafile")
            if refused is not None:
                raise refused from exc
            raise
        except BaseException:
            self.state.close()
            raise
        self.signals = _Signals(self)
        self._closed = False
        self._destroyed = False
        self._lock = threading.Lock()
        self._reap_at: dict[str, float] = {}
        self._sweep_at: dict[str, float] = {}

    # -- names and messages ----------------------------------------------------------

    def _main(self, queue: str) -> str:
        name = f"{self.prefix}.{queue}"
        self.client.define(name, {"x-max-priority": self.max_priority})
        return name

    def _bucket(self, queue: str, ms: int) -> str:
        name = f"{self.prefix}.{queue}.delay.{ms}"
        self.client.define(
            name,
            {
                "x-message-ttl": ms,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": self._main(queue),
                "x-expires": 2 * ms + 60_000,
            },
        )
        return name

    def _announce(self, queue: str, job_id: str, priority: int, eta: float | None = None) -> None:
        """Publish the message that delivers ``job_id`` (to a delay queue while ``eta``
        is ahead). The body is ``<job id> <priority> <eta or ->``; the properties only
        say "persistent" and the broker priority."""
        target = self._main(queue)
        due = "-"
        if eta is not None:
            ms = int((eta - time.time()) * 1000)
            if ms >= 1:
                due = repr(float(eta))
                target = self._bucket(queue, 1 << min(ms.bit_length() - 1, _MAX_BUCKET))
        level = min(max(priority, 0), self.max_priority)
        self.client.publish(target, f"{job_id} {priority} {due}".encode(), level)

    def _announce_state(self, job_id: str, eta: float | None = None) -> None:
        state = self.state.get(job_id)
        if state is not None and state.status is JobStatus.QUEUED:
            self._announce(state.queue, job_id, state.priority, state.eta if eta is None else eta)

    # -- enqueue -----------------------------------------------------------------------

    # The state store's enqueue runs ``check_new_job`` before it writes anything, and
    # nothing is published before it returns: bad input never reaches the broker.
    def enqueue(self, job: NewJob) -> Enqueued:
        done = self.state.enqueue(job)
        if done.created:
            self._announce(job.queue, job.id, job.priority, job.eta)
        return done

    def enqueue_many(self, jobs: list[NewJob]) -> list[Enqueued]:
        done = self.state.enqueue_many(jobs)
        for job, result in zip(jobs, done, strict=True):
            if result.created:
                self._announce(job.queue, job.id, job.priority, job.eta)
        return done

    # -- claim -------------------------------------------------------------------------

    def claim(self, queue: str, worker: str, *, lease: float, limit: int, timeout: float) -> list[Claimed]:
        check_claim(queue, lease, limit)
        deadline = time.monotonic() + max(0.0, timeout)
        consumer = self.client.consumer(self._main(queue))
        kicks = consumer.kicks
        with consumer.using():
            while True:
                self._housekeep(queue, consumer)
                self.client.ensure_consuming(consumer, limit)
                now = time.monotonic()
                wait = max(0.0, min(deadline - now, self._reap_at[queue] - now))
                got = consumer.take(limit, wait, kicks)
                if got:
                    claimed = self._claim_deliveries(queue, worker, lease, got)
                    if claimed:
                        return claimed
                    continue
                if time.monotonic() >= deadline or self._closed or consumer.kicks != kicks:
                    return []

    def _claim_deliveries(self, queue: str, worker: str, lease: float, got: list[Delivery]) -> list[Claimed]:
        now = time.time()
        due: list[Delivery] = []
        later: list[Delivery] = []
        seen: set[str] = set()
        for d in got:
            if d.eta is not None and d.eta > now:
                later.append(d)
            elif d.job_id not in seen:
                seen.add(d.job_id)
                due.append(d)
        try:
            claimed, others = (
                self.state.claim_ids(queue, [d.job_id for d in due], worker, lease) if due else ([], [])
            )
        except BaseException:
            self.client.settle(got, ack=False)
            raise
        for d in later:
            self._announce(queue, d.job_id, d.priority, d.eta)
        priority = {d.job_id: d.priority for d in due}
        for job_id, status, eta, _priority in others:
            if status == JobStatus.QUEUED and eta is not None and eta > now:
                self._announce(queue, job_id, priority.get(job_id, 0), eta)  # early: delay again
        self.client.settle(got, ack=True)
        return claimed

    def _housekeep(self, queue: str, consumer: Consumer) -> None:
        """Put lapsed leases back (at their deadline, at most ``_REAP_EVERY`` apart) and,
        when the broker's queue is empty, republish jobs that lost their message."""
        now = time.monotonic()
        if now >= self._reap_at.get(queue, 0.0):
            nxt = self.state.next_deadline(queue)
            if nxt is not None and nxt <= time.time():
                for job_id, priority in self.state.reap(queue):
                    self._announce(queue, job_id, priority)
                nxt = self.state.next_deadline(queue)
            ahead = _REAP_EVERY if nxt is None else min(max(nxt - time.time(), 0.005), _REAP_EVERY)
            self._reap_at[queue] = time.monotonic() + ahead
        if now >= self._sweep_at.get(queue, 0.0):
            self._sweep_at[queue] = now + _SWEEP_EVERY
            if not consumer.buf and self.client.message_count(self._main(queue)) == 0:
                for job_id, priority in self.state.orphans(queue, time.time() - self.orphan_after, 1000):
                    self._announce(queue, job_id, priority)

    # -- a delivery's outcome ----------------------------------------------------------

    def heartbeat(self, job_id: str, token: str, *, lease: float) -> bool:
        return self.state.heartbeat(job_id, token, lease=lease)

    def progress(self, job_id: str, token: str, progress: JobProgress) -> bool:
        return self.state.progress(job_id, token, progress)

    def mark_alone(self, job_id: str, token: str) -> bool:
        ok = self.state.mark_alone(job_id, token)
        if ok:  # the messages of the jobs just given back reach the broker before this one
            self.client.flush(self.client.reconnect)  # starts: it may kill this process
        return ok

    @property
    def failure(self) -> BaseException | None:
        """Why this backend can no longer work (its RabbitMQ client's publisher or
        supervisor died), or ``None``; a worker that sees it stops."""
        return self.client.failure

    def complete(self, job_id: str, token: str, result: bytes) -> bool:
        return self.state.complete(job_id, token, result)

    def complete_many(self, items: Sequence[tuple[str, str, bytes]]) -> list[bool]:
        many = getattr(self.state, "complete_many", None)
        if callable(many):
            return list(many(items))
        return [self.state.complete(*item) for item in items]

    def fail(
        self,
        job_id: str,
        token: str,
        error: bytes,
        *,
        retry_at: float | None = None,
        dead_reason: str | None = None,
    ) -> bool:
        check_fail(job_id, retry_at, dead_reason)
        ok = self.state.fail(job_id, token, error, retry_at=retry_at, dead_reason=dead_reason)
        if ok and retry_at is not None:
            self._announce_state(job_id, retry_at)
        return ok

    def release(self, job_id: str, token: str) -> bool:
        ok = self.state.release(job_id, token)
        if ok:
            self._announce_state(job_id)
        return ok

    def cancel(self, job_id: str, *, running: bool = True) -> CancelResult:
        # A queued job's message stays in the broker: its claim finds it cancelled and skips it.
        return self.state.cancel(job_id, running=running)

    def cancel_requests(self, job_ids: Sequence[str], *, timeout: float) -> list[str]:
        return self.state.cancel_requests(job_ids, timeout=timeout)

    def requeue(self, job_id: str) -> bool:
        ok = self.state.requeue(job_id)
        if ok:
            self._announce_state(job_id)
        return ok

    # -- reading -----------------------------------------------------------------------

    def get(self, job_id: str) -> JobState | None:
        return self.state.get(job_id)

    def find(self, key: str) -> JobState | None:
        return self.state.find(key)

    def wait(self, job_id: str, timeout: float) -> JobState | None:
        return self.state.wait(job_id, timeout)

    def dead_letters(self, queue: str | None = None, limit: int = 100) -> list[JobState]:
        return self.state.dead_letters(queue, limit)

    def stats(self, queue: str) -> QueueStats:
        return self.state.stats(queue)

    def purge(self, now: float | None = None) -> int:
        return self.state.purge(now)

    def ids_starting(self, prefix: str, limit: int = 10) -> list[str]:
        ids = getattr(self.state, "ids_starting", None)
        return list(ids(prefix, limit)) if callable(ids) else []

    def jobs(self, queue: str | None = None, status: str | None = None, limit: int = 100) -> list[JobState]:
        jobs = getattr(self.state, "jobs", None)
        return list(jobs(queue, status, limit)) if callable(jobs) else []

    # -- lifecycle ---------------------------------------------------------------------

    def destroy(self) -> None:
        """Delete this prefix's RabbitMQ queues (main and delay) and its state."""
        names: list[str] = []
        for queue in self.state.queues():
            names.append(self._main(queue))
            names += [self._bucket(queue, 1 << b) for b in range(_MAX_BUCKET + 1)]
        names += [name for name in self.client.defined() if name not in names]  # e.g. claimed, never used
        self.client.flush(5.0)
        self.client.delete(names)
        self.state.destroy()
        self._destroyed = True

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.signals.bump_all()
        try:
            self.client.close()
        finally:
            self.state.close()
            if self._destroyed and self._own_state is not None:
                for suffix in ("", "-wal", "-shm"):
                    try:
                        os.unlink(f"{self._own_state}{suffix}")
                    except FileNotFoundError:
                        pass
