"""The Redis queue (redis-py): every state change of a job is one Lua script.

URL: ``redis://[user:password@]host:6379/0``, or ``rediss://…`` for TLS, with query options

* ``prefix=foundry`` — every key lives under ``<prefix>:`` (a namespace per app or per
  test; in a Redis Cluster use a hash-tagged prefix such as ``{foundry}``);
* ``reconnect=15`` — seconds a call keeps retrying (with back-off) while Redis cannot be
  reached, before it raises :class:`~foundry.errors.BackendUnavailableError`;
* ``socket_timeout=10``, ``socket_connect_timeout=5``, ``health_check_interval``,
  ``client_name`` — passed to redis-py;
* with ``rediss://`` only: ``ssl_ca_certs=<CA file>``, ``ssl_certfile=``/``ssl_keyfile=``
  (a client certificate), ``ssl_cert_reqs=none|optional|required`` and
  ``ssl_check_hostname=true|false`` — passed to redis-py, checked first
  (``foundry.backends._urls``). A refused server certificate is a
  :class:`~foundry.errors.ConfigError` at once, not a retry.

**What it keeps and how** (the key layout is in ``redis_lua/_prelude.lua``, beside one
``.lua`` file per script): a job is a hash; the
claimable jobs of a queue are a sorted set ordered by priority, then eta, then enqueue
order; delayed jobs and scheduled retries wait in a second sorted set scored by eta;
leases are a third, scored by deadline. ``claim`` is one script that puts lapsed
leases back (or dead-letters a job whose deliveries without an outcome reached
``max_deliveries``), promotes the due delayed jobs, and moves the best ``limit`` jobs
to the lease set with a fresh token — a reliable move, never a plain pop: a job is in
exactly one of the sets at every instant, so a client that dies mid-claim loses
nothing. Completion is written by a script that checks the job has no outcome yet (the
single completion record); idempotency keys are a string set only when absent. A
finished job's hash and key expire ``result_ttl`` after it finished (Redis deletes
them; ``purge`` also deletes them on demand).

**Waking.** Enqueue pushes a token onto the queue's ``wake`` list (at most 64
waiting); an idle claimer blocks in ``BLPOP`` on it, with a timeout no longer than the
next delayed job's eta or lease deadline, so it neither polls nor oversleeps a delayed
job. A job that finishes is ``PUBLISH``-ed; ``wait`` listens (one subscriber thread per
process, only while someone waits) and re-reads the job at least every second. Cancel
requests have a channel and a subscriber of their own, so a worker watching for them
is not sent every finished job's id.

**Durability** is Redis's own: with ``appendonly yes`` + ``appendfsync everysec`` an
accepted job survives a Redis crash except for the last second of writes; with
``always``, none; without persistence, a Redis restart loses the queue. Foundry does
not change that — choose the Redis configuration for the guarantee you need.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from foundry.backends._lua import lua_scripts
from foundry.backends._urls import (
    REDIS_PASSED,
    REDIS_TLS,
    ShowsUrl,
    refused_certificate,
    safe_url,
    seconds_option,
    tls_options,
    url_options,
)
from foundry.backends.queue._common import (
    CANCELS,
    RECHECK,
    Signals,
    finite,
    job_topic,
    watch_cancels,
)
from foundry.backends.queue._records import (
    STATE_FIELDS,
    dead_reason_for,
    decode_claimed,
    decode_state,
    encode_progress,
)
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
    check_new_job,
)
from foundry.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigError,
    MalformedRecordError,
)

__all__ = ["RedisQueue", "claimed_from_reply", "state_from_hash"]

log = logging.getLogger("foundry.queue.redis")

T = TypeVar("T")

_OWN = ("prefix", "reconnect")
_PASSED = REDIS_PASSED
_STATE_FIELDS = STATE_FIELDS  # HMGET order of a job's state
_WAIT_FIELDS = _STATE_FIELDS[:-1]  # what ``wait`` reads: all but the payload (the last field)
_BIG_ARG = 64 * 1024  # an argument at least this large is sent as itself, not copied into the command
_BLOCK_MAX = 5.0  # longest single BLPOP; the socket timeout of blocking calls is above it
_DEFAULT_TTL = 7 * 86400.0  # the scripts' result_ttl when a record has none (``finish``)
_FINISHED = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.DEAD, JobStatus.CANCELLED})


def _text(value: Any, errors: str = "strict") -> str:
    return value.decode(errors=errors) if isinstance(value, bytes) else str(value)


def _opt_raw(value: Any) -> Any:
    return None if value in (None, b"", "") else value


def _int_or(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _opt(value: Any) -> str | None:
    if value is None:
        return None
    text = _text(value)
    return text or None


def _float(value: Any) -> float | None:
    text = _opt(value)
    return None if text is None else float(text)


def _num(value: float) -> str:
    return repr(float(value))


def _enqueued(job_id: str, reply: Any) -> Enqueued:
    """The enqueue script's reply: ``1`` when it created the job (the common case: one
    integer to parse), else ``{0, the id of the job that exists}``."""
    if reply == 1:
        return Enqueued(job_id, True)
    if isinstance(reply, list | tuple) and len(reply) == 2:
        return Enqueued(_text(reply[1]), bool(reply[0]))
    raise MalformedRecordError(job_id, "reply", repr(reply)[:40], "is not an enqueue script's reply")


def claimed_from_reply(row: Sequence[Any], queue: str, token: str, until: float) -> Claimed:
    """A ``Claimed`` from a script's reply row (see ``lease_job`` in the scripts and
    ``_records.decode_claimed``)."""
    if not isinstance(row, list | tuple) or len(row) < 10:
        raise MalformedRecordError(repr(row)[:40], "reply", row, "is not a leased job's fields")
    unit, payload, codec, deliveries, attempts, max_retries, max_deliveries, timeout, enqueued_at = row[1:10]
    return decode_claimed(
        {
            "id": row[0],
            "queue": queue,
            "unit": unit,
            "payload": payload,
            "codec": codec,
            "token": token,
            "lease_until": until,
            "deliveries": deliveries,
            "attempts": attempts,
            "max_retries": max_retries,
            "max_deliveries": max_deliveries,
            "timeout": timeout,
            "enqueued_at": enqueued_at,
            "trace": row[11] if len(row) > 11 else None,  # a job from before traces has ''
        }
    )


def _lease_row(row: Any) -> Any:
    """A claim script's reply for one job, ``[id, b"<len>:<bytes><len>:<bytes>..."]`` (see
    ``lease_job`` in the scripts), as the row :func:`claimed_from_reply` reads; a reply
    that does not unpack is returned as it is (and is refused there)."""
    if not isinstance(row, list | tuple) or len(row) != 2 or not isinstance(row[1], bytes):
        return row
    data: bytes = row[1]
    out: list[Any] = [row[0]]
    at, end = 0, len(data)
    while at < end:
        colon = data.find(b":", at, at + 12)
        if colon < 0 or not data[at:colon].isdigit():
            return row
        stop = colon + 1 + int(data[at:colon])
        if stop > end:
            return row
        out.append(data[colon + 1 : stop])
        at = stop
    return out


def state_from_hash(
    job_id: str, values: Sequence[Any], fields: Sequence[str] = _STATE_FIELDS
) -> JobState | None:
    """A ``JobState`` from the ``HMGET`` of ``fields`` (``_STATE_FIELDS``, or ``_WAIT_FIELDS``
    for a state without its payload; ``None``: no such job; see ``_records.decode_state``)."""
    if len(values) != len(fields):
        raise MalformedRecordError(job_id, "fields", len(values), "is not the fields of a job")
    v = dict(zip(fields, values, strict=True))
    if v["status"] is None:
        return None
    v["id"] = job_id
    return decode_state(v)


class _Signals(Signals):
    """Job wake-ups inside this process, plus ``bump_all`` also kicking this process's
    claimers out of ``BLPOP`` (a worker stopping must not wait for the timeout)."""

    def __init__(self, kick: Callable[[], None]) -> None:
        super().__init__()
        self._kick = kick

    def bump_all(self) -> None:
        super().bump_all()
        self._kick()


class _Listener:
    """One subscriber thread per channel of a backend, running only while somebody
    waits on it: finished job ids arrive on ``<prefix>:done`` and wake the local waiters
    of that job (``wait``); cancel requests arrive on ``<prefix>:cancel`` and wake
    ``cancel_requests``. Two listeners, not one on both channels: a worker watching for
    cancels would otherwise receive (and parse) every finished job's id, one message
    per job, and Redis would write each one to it."""

    def __init__(self, queue: RedisQueue, channel: str, on_message: Callable[[bytes], None]) -> None:
        self._queue = queue
        self._channel = (queue.prefix + channel).encode()
        self._on_message = on_message
        self._lock = threading.Lock()
        self._waiting = 0
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop = threading.Event()

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        with self._lock:
            self._waiting += 1
            if self._thread is None and not self._stop.is_set():
                self._ready.clear()
                name = f"foundry-redis-{self._channel.decode(errors='replace').rsplit(':', 1)[-1]}"
                self._thread = threading.Thread(target=self._run, name=name, daemon=True)
                self._thread.start()
        self._ready.wait(1.0)  # subscribed before the caller reads the job: no lost wake-up
        try:
            yield
        finally:
            with self._lock:
                self._waiting -= 1

    def _run(self) -> None:
        q = self._queue
        channel = self._channel
        idle_since = time.monotonic()
        pause = 0.05
        pubsub = q.client.pubsub()  # type: ignore[no-untyped-call,unused-ignore]
        try:
            while not self._stop.is_set():
                with self._lock:
                    if self._waiting:
                        idle_since = time.monotonic()
                    elif time.monotonic() - idle_since > 2.0:
                        self._thread = None
                        return
                try:
                    if not pubsub.subscribed:
                        pubsub.subscribe(channel)
                    msg = pubsub.get_message(timeout=0.5)
                except (redis.ConnectionError, redis.TimeoutError):
                    self._ready.clear()
                    q.signals.bump_all()  # everyone looks again after a reconnect
                    self._stop.wait(pause)
                    pause = min(pause * 2, 1.0)
                    with contextlib.suppress(Exception):
                        pubsub.reset()
                    pubsub = q.client.pubsub()  # type: ignore[no-untyped-call,unused-ignore]
                    continue
                pause = 0.05
                if msg is None:
                    continue
                if msg["type"] == "subscribe":
                    if msg["channel"] == channel:
                        self._ready.set()
                        q.signals.bump_all()
                elif msg["type"] == "message":
                    self._on_message(msg["data"])
        finally:
            with contextlib.suppress(Exception):
                pubsub.reset()
            self._ready.set()

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(5.0)


class RedisQueue(ShowsUrl):
    """The Redis queue backend (see the module docstring)."""

    capabilities: ClassVar[Capabilities] = Capabilities(
        notify=True, priority=True, cross_process_results=True, extras=("lua", "blocking-pop", "result-ttl")
    )

    def __init__(self, url: str) -> None:
        self._url = url  # to connect with; everything shown uses ``url`` (masked)
        parts = urlsplit(url)
        query = url_options("queue", url, _OWN, _PASSED, REDIS_TLS)
        tls = tls_options("queue", url, query, REDIS_TLS)
        self._tls_hint = (
            " (a server that requires TLS drops redis:// connections: use rediss://)"
            if parts.scheme.lower() == "redis"
            else " (a port without TLS never completes the handshake of rediss://: use redis://)"
        )
        prefix = query.get("prefix", "foundry")
        if not prefix or any(c.isspace() for c in prefix) or len(prefix) > 100:
            raise ConfigError(
                f"queue URL {safe_url(url)!r}: prefix={prefix!r} must be 1-100 characters without spaces. "
                "Fix: e.g. ?prefix=myapp"
            )
        self.prefix = prefix + ":"
        self._reconnect = seconds_option("queue", safe_url(url), query, "reconnect", 15.0)
        timeout = seconds_option("queue", safe_url(url), query, "socket_timeout", 10.0)
        passed = {k: v for k, v in query.items() if k in _PASSED and k != "socket_timeout"} | tls
        base = urlunsplit(parts._replace(query=urlencode(passed)))
        # socket_connect_timeout: redis-py 8 no longer defaults it to socket_timeout (it waits
        # 5 s for a connect or a TLS handshake); a ?socket_connect_timeout= in the URL wins
        kwargs: dict[str, Any] = {
            "retry": Retry(NoBackoff(), 0),
            "socket_keepalive": True,
            "socket_connect_timeout": timeout,
        }
        try:
            self.client = redis.Redis.from_url(base, socket_timeout=timeout, **kwargs)
            self._blocking = redis.Redis.from_url(base, socket_timeout=_BLOCK_MAX + timeout, **kwargs)
        except ValueError as exc:
            raise ConfigError(f"queue URL {safe_url(url)!r}: {exc}. Fix: correct the URL") from exc
        scripts = lua_scripts(__package__ or "foundry.backends.queue", "redis_lua")
        self._scripts = {name: self.client.register_script(src) for name, src in scripts.items()}
        self._closed = False
        self._free: list[Any] = []  # idle direct connections (see _direct)
        self._conns: list[Any] = []  # every direct connection, closed by close()
        self._blocked: dict[str, int] = {}
        self._kicks = 0  # bumped by signals.bump_all(): blocked claimers return at once
        self._blocked_lock = threading.Lock()
        self.signals = _Signals(self._kick)
        self._done = _Listener(self, "done", lambda data: self.signals.bump(job_topic(_text(data))))
        self._cancels = _Listener(self, "cancel", lambda _: self.signals.bump(CANCELS))
        try:
            self.call("connect", self.client.ping, within=min(self._reconnect, 3.0))
        except BaseException:
            self.close()
            raise

    # -- plumbing --------------------------------------------------------------------

    def call(self, what: str, fn: Callable[..., T], *args: Any, within: float | None = None) -> T:
        """Run one Redis call; retry with back-off while Redis is unreachable, for at
        most ``reconnect`` seconds, then raise :class:`BackendUnavailableError`."""
        deadline: float | None = None
        pause = 0.05
        while True:
            if self._closed:
                raise BackendError(f"queue {self.url} is closed. Fix: do not use it after close()")
            try:
                return fn(*args)
            except redis.AuthenticationError as exc:
                raise ConfigError(
                    f"queue URL {self.url!r}: Redis refused the credentials ({exc}). "
                    "Fix: correct the user/password in the URL"
                ) from exc
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                refused = refused_certificate(exc, "queue", self._url, "ssl_ca_certs")
                if refused is not None:
                    raise refused from exc
                now = time.monotonic()
                if deadline is None:
                    deadline = now + (self._reconnect if within is None else within)
                if now >= deadline:
                    raise BackendUnavailableError(
                        f"queue {self.url}: Redis unreachable during {what} "
                        f"({type(exc).__name__}: {exc}). Fix: start Redis or correct the URL"
                        f"{self._tls_hint}; accepted jobs are safe in Redis, retry the call"
                    ) from exc
                time.sleep(min(pause, max(0.0, deadline - now)))
                pause = min(pause * 2, 1.0)
            except redis.RedisError as exc:
                raise BackendError(
                    f"queue {self.url}: Redis failed during {what} ({type(exc).__name__}: {exc})"
                ) from exc

    def _script(self, name: str, args: Sequence[Any]) -> Any:
        script = self._scripts[name]
        return self.call(
            name, functools.partial(self._direct, script=script), "EVALSHA", script.sha, 0, self.prefix, *args
        )

    def _direct(self, *command: Any, script: Any = None) -> Any:
        """Send one command on a connection of our own (no pool bookkeeping per call:
        about twice as fast as the client's command layer); load ``script`` on NOSCRIPT."""
        try:
            conn = self._free.pop()
        except IndexError:
            pool = self.client.connection_pool
            conn = pool.connection_class(**pool.connection_kwargs)
            with self._blocked_lock:
                self._conns.append(conn)
        healthy = False
        packed = _pack(command)
        try:
            conn.send_packed_command(packed)
            try:
                reply = conn.read_response()
            except redis.exceptions.NoScriptError:
                if script is None:
                    raise
                conn.send_command("SCRIPT", "LOAD", script.script)
                conn.read_response()
                conn.send_packed_command(packed)
                reply = conn.read_response()
            healthy = True
            return reply
        except redis.ResponseError:
            healthy = True  # the command failed, the connection is fine
            raise
        finally:
            if not healthy:
                conn.disconnect()  # reconnects on its next use
            self._free.append(conn)

    def _key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def _kick(self) -> None:
        """Wake this process's claimers blocked in ``BLPOP`` (used when a worker stops)."""
        with self._blocked_lock:
            self._kicks += 1
            queues = [q for q, n in self._blocked.items() if n > 0]
        for q in queues:
            with contextlib.suppress(redis.RedisError):
                self.client.rpush(self._key("q", q, "wake"), "1")

    # -- enqueue ---------------------------------------------------------------------

    @staticmethod
    def _enqueue_args(job: NewJob, now: float) -> list[Any]:
        return [
            _num(now),
            job.id,
            job.queue,
            job.unit,
            bytes(job.payload),
            job.codec,
            job.key or "",
            str(job.priority),
            _num(now if job.eta is None else job.eta),
            str(job.max_retries),
            str(job.max_deliveries),
            "" if job.timeout is None else _num(job.timeout),
            "" if job.result_ttl == _DEFAULT_TTL else _num(job.result_ttl),  # the script's default
            job.trace or "",
        ]

    def enqueue(self, job: NewJob) -> Enqueued:
        check_new_job(job)
        return _enqueued(job.id, self._script("enqueue", self._enqueue_args(job, time.time())))

    def enqueue_many(self, jobs: list[NewJob]) -> list[Enqueued]:
        for job in jobs:
            check_new_job(job)
        if not jobs:
            return []
        now = time.time()
        script = self._scripts["enqueue"]

        def run() -> list[Any]:
            pipe = self.client.pipeline(transaction=True)  # one MULTI/EXEC: all or nothing
            for job in jobs:
                script(keys=[], args=[self.prefix, *self._enqueue_args(job, now)], client=pipe)
            return list(pipe.execute())

        replies = self.call("enqueue_many", run)
        return [_enqueued(job.id, reply) for job, reply in zip(jobs, replies, strict=True)]

    # -- claim -----------------------------------------------------------------------

    def claim(self, queue: str, worker: str, *, lease: float, limit: int, timeout: float) -> list[Claimed]:
        check_claim(queue, lease, limit)
        deadline = time.monotonic() + max(0.0, timeout)
        wake = self._key("q", queue, "wake")
        kicks = self._kicks
        while True:
            now = time.time()
            token = uuid.uuid4().hex
            until = now + lease
            rows, next_eta, next_lease = self._script(
                "claim", [_num(now), queue, worker, token, _num(until), str(limit)]
            )
            if rows:
                got = self._decode_leased(rows, queue, token, until)
                if got:
                    return got
                continue
            left = deadline - time.monotonic()
            if left <= 0 or self._closed or self._kicks != kicks:
                return []
            due = min(_float(next_eta) or math.inf, _float(next_lease) or math.inf) - time.time()
            block = min(left, _BLOCK_MAX, max(due, 0.0) + 0.001)
            if due <= 0:
                continue  # more lapsed or due jobs than one script handles: go again now
            with self._blocking_on(queue):
                self.call("claim", self._blocking.blpop, [wake], block)

    def _decode_leased(self, rows: Sequence[Any], queue: str, token: str, until: float) -> list[Claimed]:
        """The leased rows as jobs; one the scripts let through but Python cannot decode
        is dead-lettered (with its lease's token) instead of handed out."""
        out: list[Claimed] = []
        for row in map(_lease_row, rows):
            try:
                out.append(claimed_from_reply(row, queue, token, until))
            except MalformedRecordError as exc:
                log.warning("queue %s: %s; dead-lettered", self.url, exc)
                raw_id = row[0] if isinstance(row, list | tuple) and row else b""
                args = [_num(time.time()), raw_id, token, b"", "dead", _num(0.0), dead_reason_for(exc)]
                self._script("fail", args)
        return out

    @contextlib.contextmanager
    def _blocking_on(self, queue: str) -> Iterator[None]:
        with self._blocked_lock:
            self._blocked[queue] = self._blocked.get(queue, 0) + 1
        try:
            yield
        finally:
            with self._blocked_lock:
                self._blocked[queue] -= 1

    # -- a delivery's outcome ----------------------------------------------------------

    def heartbeat(self, job_id: str, token: str, *, lease: float) -> bool:
        return bool(self._script("heartbeat", [job_id, token, _num(time.time() + lease)]))

    def progress(self, job_id: str, token: str, progress: JobProgress) -> bool:
        return bool(self._script("progress", [job_id, token, encode_progress(progress)]))

    def mark_alone(self, job_id: str, token: str) -> bool:
        return bool(self._script("mark_alone", [job_id, token]))

    def complete(self, job_id: str, token: str, result: bytes) -> bool:
        return self.complete_many([(job_id, token, result)])[0]

    def complete_many(self, items: Sequence[tuple[str, str, bytes]]) -> list[bool]:
        """Several completions in one script (a worker's batched acks)."""
        if not items:
            return []
        args: list[Any] = [_num(time.time())]
        for job_id, token, result in items:
            args += [job_id, token, bytes(result)]
        done = self._script("complete", args)  # b"1"/b"0" per job, in order
        if not isinstance(done, bytes) or len(done) != len(items):
            raise MalformedRecordError(
                items[0][0], "reply", repr(done)[:40], "is not a completion script's reply"
            )
        return [c == 49 for c in done]

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
        mode = "retry" if retry_at is not None else "dead" if dead_reason is not None else "failed"
        args = [
            _num(time.time()),
            job_id,
            token,
            bytes(error),
            mode,
            _num(retry_at or 0.0),
            dead_reason or "",
        ]
        return bool(self._script("fail", args))

    def release(self, job_id: str, token: str) -> bool:
        return bool(self._script("release", [job_id, token, _num(time.time())]))

    def cancel(self, job_id: str, *, running: bool = True) -> CancelResult:
        done = self._script("cancel", [_num(time.time()), job_id, "1" if running else "0"])
        return CancelResult(_text(done))

    def cancel_requests(self, job_ids: Sequence[str], *, timeout: float) -> list[str]:
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return []

        def read() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for job_id in ids:
                pipe.hmget(self._key("j", job_id), ("status", "cancel_at"))
            return list(pipe.execute())

        def look() -> list[str]:
            rows = self.call("cancel_requests", read)
            return [
                job_id
                for job_id, (status, at) in zip(ids, rows, strict=True)
                if status == b"running" and at not in (None, b"")
            ]

        with self._cancels.watching():
            return watch_cancels(self.signals, look, timeout, lambda: self._closed)

    # -- reading -----------------------------------------------------------------------

    def _get_many(self, ids: Sequence[str]) -> list[JobState]:
        if not ids:
            return []

        def run() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for job_id in ids:
                pipe.hmget(self._key("j", job_id), _STATE_FIELDS)
            return list(pipe.execute())

        out: list[JobState] = []
        for job_id, values in zip(ids, self.call("get", run), strict=True):
            try:
                state = state_from_hash(job_id, values)
            except MalformedRecordError as exc:  # one bad record must not hide every other job
                log.warning("queue %s: %s; left out", self.url, exc)
                continue
            if state is not None:
                out.append(state)
        return out

    def get(self, job_id: str) -> JobState | None:
        values = self.call("get", self._direct, "HMGET", self._key("j", job_id), *_STATE_FIELDS)
        return state_from_hash(job_id, values)

    def find(self, key: str) -> JobState | None:
        job_id = self.call("find", self.client.get, self._key("k", key))
        return None if job_id is None else self.get(_text(job_id))

    def wait(self, job_id: str, timeout: float) -> JobState | None:
        deadline = time.monotonic() + max(0.0, timeout)
        topic = job_topic(job_id)
        with self._done.watching():
            while True:
                since = self.signals.gen(topic)
                values = self.call("wait", self._direct, "HMGET", self._key("j", job_id), *_WAIT_FIELDS)
                state = state_from_hash(job_id, values, _WAIT_FIELDS)
                left = deadline - time.monotonic()
                if state is None or state.status in _FINISHED or left <= 0 or self._closed:
                    return state
                self.signals.wait(topic, since, min(left, RECHECK))

    def dead_letters(self, queue: str | None = None, limit: int = 100) -> list[JobState]:
        key = self._key("dead") if queue is None else self._key("q", queue, "dead")
        ids = [_text(i) for i in self.call("dead_letters", self.client.zrevrange, key, 0, max(0, limit - 1))]
        return self._get_many(ids)

    def requeue(self, job_id: str) -> bool:
        return self._script("requeue", [_num(time.time()), job_id]) is not None

    def stats(self, queue: str) -> QueueStats:
        now = time.time()
        depth, scheduled, running, dead, oldest = self._script("stats", [_num(now), queue])
        first = _float(oldest)
        return QueueStats(
            depth=int(depth),
            scheduled=int(scheduled),
            running=int(running),
            dead=int(dead),
            oldest_age=0.0 if first is None or not depth else max(0.0, now - first),
        )

    def purge(self, now: float | None = None) -> int:
        at = _num(time.time() if now is None else now)
        total = 0
        while True:
            purged, looked = self._script("purge", [at, "500"])
            total += int(purged)
            if int(looked) < 500:
                return total

    def ids_starting(self, prefix: str, limit: int = 10) -> list[str]:
        """Up to ``limit`` ids of jobs that begin with ``prefix`` (``foundry jobs show`` of a
        short id), in id order: ``SCAN MATCH`` over this prefix's job hashes, 500 keys a
        round trip, stopping once ``limit`` are found: telling a unique prefix from an
        ambiguous one walks the whole keyspace once (a round trip per 500 keys), without
        blocking the server (``SCAN``, never ``KEYS``)."""
        if not prefix:
            return []
        found: set[str] = set()
        cursor = 0
        head = len(self.prefix) + 2
        pattern = _glob_escape(self.prefix) + "j:" + _glob_escape(prefix) + "*"
        while len(found) < limit:
            cursor, keys = self.call("ids_starting", self.client.scan, cursor, pattern, 500)
            found.update(_text(k, "replace")[head:] for k in keys)
            if cursor == 0:
                break
        return sorted(found)[:limit]

    def jobs(self, queue: str | None = None, status: str | None = None, limit: int = 100) -> list[JobState]:
        """Some jobs (``foundry jobs list``): a bounded ``SCAN``, so not ordered by age."""
        out: list[JobState] = []
        cursor = 0
        pattern = _glob_escape(self.prefix) + "j:*"
        while len(out) < limit:
            cursor, keys = self.call("jobs", self.client.scan, cursor, pattern, 500)
            ids = [_text(k)[len(self.prefix) + 2 :] for k in keys]
            for state in self._get_many(ids):
                if (queue is None or state.queue == queue) and (status is None or state.status == status):
                    out.append(state)
            if cursor == 0:
                break
        out.sort(key=lambda s: s.enqueued_at, reverse=True)
        return out[:limit]

    # -- the AMQP engine's state store (see amqp.py) -------------------------------------

    def claim_ids(
        self, queue: str, ids: Sequence[str], worker: str, lease: float
    ) -> tuple[list[Claimed], list[tuple[str, str, float | None, int]]]:
        """Lease the given jobs if they are still queued and due. Returns the claimed
        jobs (best priority first) and ``(id, status, eta, priority)`` of the others."""
        now = time.time()
        token = uuid.uuid4().hex
        until = now + lease
        rows, others = self._script("claim_ids", [queue, _num(now), worker, token, _num(until), *ids])
        rows = [_lease_row(r) for r in rows]
        rows = sorted(rows, key=lambda r: -_int_or(r[10] if len(r) > 10 else 0, 0))  # checked by the script
        rest = [
            (_text(i, "replace"), _text(s, "replace"), finite(_opt_raw(e), None), 0) for i, s, e in others
        ]
        return self._decode_leased(rows, queue, token, until), rest

    def reap(self, queue: str) -> list[tuple[str, int]]:
        """Put lapsed leases back (or dead-letter them); ``(id, priority)`` of those put back."""
        return [(_text(i), int(p)) for i, p in self._script("reap", [queue, _num(time.time())])]

    def next_deadline(self, queue: str) -> float | None:
        """The earliest lease deadline in ``queue`` (``None`` when nothing is leased)."""
        first = self.call(
            "next_deadline", self.client.zrange, self._key("q", queue, "lease"), 0, 0, True, True
        )
        return float(first[0][1]) if first else None

    def orphans(self, queue: str, before: float, limit: int) -> list[tuple[str, int]]:
        """Queued jobs due before ``before``: ``(id, priority)``, best first."""
        ready = self.call("orphans", self.client.zrange, self._key("q", queue, "ready"), 0, limit - 1)
        states = self._get_many([_text(m, "replace")[29:] for m in ready])
        return [(s.id, s.priority) for s in states if s.status is JobStatus.QUEUED and (s.eta or 0) <= before]

    def queues(self) -> list[str]:
        return sorted(_text(q) for q in self.call("queues", self.client.smembers, self._key("queues")))

    # -- lifecycle ---------------------------------------------------------------------

    def destroy(self) -> None:
        """Delete every key under this backend's prefix (tests, ``foundry`` teardown)."""
        pattern = _glob_escape(self.prefix) + "*"

        def run() -> None:
            for batch in _batched(self.client.scan_iter(match=pattern, count=1000), 500):
                self.client.unlink(*batch)

        self.call("destroy", run)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._done.close()
        self._cancels.close()
        Signals.bump_all(self.signals)
        with self._blocked_lock:
            conns, self._conns, self._free = self._conns, [], []
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.disconnect()
        for client in (self.client, self._blocking):
            with contextlib.suppress(Exception):
                client.connection_pool.disconnect()
            with contextlib.suppress(Exception):
                client.close()


def _pack(command: Sequence[Any]) -> list[bytes | bytearray | memoryview]:
    """One command in the Redis protocol (RESP), args as bytes, str or int: the pieces to
    send in order. A large argument (a payload, a result) is sent as itself, not copied
    into the command. (Every call of the engine goes through here: the common types are
    tested first and each small argument is joined once, not formatted into a copy.)"""
    out: list[bytes | bytearray | memoryview] = []
    parts: list[Any] = [b"*%d\r\n" % len(command)]
    for arg in command:
        if type(arg) is str:
            data: Any = arg.encode()
        elif isinstance(arg, bytes | bytearray | memoryview):
            data = arg
        else:
            data = str(arg).encode()
        size = len(data)
        if size >= _BIG_ARG:
            parts.append(b"$%d\r\n" % size)
            out.append(b"".join(parts))
            out.append(data)
            parts = [b"\r\n"]
        else:
            parts += (b"$%d\r\n" % size, data, b"\r\n")
    out.append(b"".join(parts))
    return out


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _batched(items: Any, size: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch
