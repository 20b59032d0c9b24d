"""The work pool over NATS: request-reply with queue groups, workers on many hosts.

URL: ``nats://host:4222`` (several servers: ``nats://a:4222,b:4222``; ``tls://`` for TLS;
``nats://user:password@host``), option ``prefix=`` (default ``foundry``). Workers are
started on each host by ``foundry pool serve app:app --url nats://…``
(:class:`NatsWorkerHost`): one host process per unit holds **one NATS connection** and
the embedded pool's exact dispatcher (:class:`~foundry.backends.pool._dispatch.LocalPool`)
over its worker processes. For a unit, with ``W = <prefix>.pool.<app>.<unit>``:

=================  ==========================================================================
``W``              the *free* subject: a host subscribes to it (queue group
                   ``<prefix>-pool-<app>-<unit>``) only while it has a free worker
``W.wait``         the *waiting line*: every host with a worker live or starting subscribes
                   to it, in a second queue group, always
``W.at.<host>``    one host's own line: it subscribes (no queue group) while it serves
``W.hb.<host>``    each host's heartbeat, every 0.25 s: its free workers, or ``bye`` from when
                   it starts to close
=================  ==========================================================================

* **The first free worker answers.** A client sends an attempt to ``W``: the server
  hands it to a host with a free worker, and that host's dispatcher to the free worker
  itself (exact, through a pipe). With every worker on every host busy, nobody is
  subscribed to ``W`` and the server answers "no responders" at once; the client then
  sends it to ``W.wait`` once, where one host takes it into its waiting line and gives it
  to *its* first worker to become free — no client polls, no worker is handed a request
  while it runs another. For 10 ms after such a "no responders" a client sends new
  attempts straight to ``W.wait`` (the pool was saturated a moment ago: the round trip
  to ``W`` would almost surely be refused again); a host that takes one with a worker
  free runs it at once.
* **No worker fails fast.** Nobody on ``W`` and nobody on ``W.wait`` (no host has a live
  or starting worker) is :data:`NO_WORKER` after two server round trips (milliseconds).
* **Deadlines.** The host answers :data:`DEADLINE` when no worker of its was free within
  the attempt's ``wait``, and kills a worker that runs past ``timeout`` (:data:`LOST`).
* **Loss.** A worker that dies mid-request is seen by its host at once (its pipe
  closes), which answers :data:`LOST`. A host that dies whole or is cut off cannot say
  anything: an attempt that started at once is answered ``LOST`` by the client after
  ``timeout`` + 0.25 s; an attempt that waits in a host's line longer than 0.1 s is
  announced by that host (``QUEUED``), and the client then watches the host's heartbeat:
  silent for 1 s, the attempt is ``LOST`` and an idempotent unit retries elsewhere.
* **A host cut off is steered around.** The server keeps a cut-off host's subscriptions
  until it notices the connection is dead, and it does not notice while it has messages
  to deliver to it (nats-server delays its PINGs while a connection has traffic): left
  alone, it would go on handing that host a share of the attempts on ``W`` for minutes,
  each one lost after ``timeout``. A client that has heard a host's heartbeat and then
  not for 1 s holds it *suspect*: while a suspect may still hold its subscriptions, the
  client sends every attempt to a live host's own line ``W.at.<host>`` — the one whose
  last heartbeat counted the most free workers — and probes each suspect's own subject
  once a second: "no responders" means the server dropped it, and ``W`` is safe again. A
  host that closes says ``bye`` on its heartbeat subject from then on, so a drain leaves
  no suspect, and what it still runs is watched by those heartbeats like any other.
* **Draining.** A host that closes stops taking requests (drops its subscriptions),
  sends back at once what waits in its line (``BOUNCE``: it never started, and the
  client sends it again, to another host) and finishes what runs within the grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

import nats
import nats.errors

from foundry.backends._nats import client_options
from foundry.backends.pool._common import (
    BOUNCE,
    QUEUED,
    attempt_from_frame,
    decode_reply,
    encode_reply,
    encode_request,
    host_name,
    refusal,
)
from foundry.backends.pool._dispatch import LocalFront, LocalPool
from foundry.backends.pool.base import (
    DEADLINE,
    ERROR,
    LOST,
    NO_WORKER,
    OK,
    OVERLOAD,
    Attempt,
    Done,
    EngineSpec,
    EngineStats,
    Reply,
    answer_once,
    check_subject_part,
)
from foundry.config import safe_url
from foundry.errors import BackendUnavailableError, ConfigError

__all__ = ["NatsPool", "NatsWorkerHost", "Subjects", "parse_url"]

log = logging.getLogger("foundry.pool")

T = TypeVar("T")

GRACE = 0.25  # beyond an attempt's timeout, for the host's own LOST to arrive
QUEUE_NOTICE = 0.1  # a host announces an attempt that waits in its line longer than this
HEARTBEAT = 0.25  # seconds between a host's heartbeats
HOST_SILENCE = 1.0  # a host not heard from this long has lost what waits there
PROBE_EVERY = 1.0  # seconds between probes of a suspect host's own subject
BYE = b"bye"  # a closing host's heartbeat
MAX_BOUNCES = 3  # hosts an attempt may be sent back from before the client gives up
MAX_WAITING = 10_000  # attempts one host keeps in its waiting line per unit
BUSY_HINT = 0.01  # after "no free worker", new attempts join a waiting line directly this long
_TICK = 0.05
_STATUS = "Status"
_NO_RESPONDERS = "503"


@dataclass(frozen=True, slots=True)
class Subjects:
    """Where one unit's requests go."""

    work: str  # the free subject
    queue: str  # its queue group
    wait: str  # the waiting line
    heartbeat: str  # ``<heartbeat>.<host>``
    direct: str  # ``<direct>.<host>``: one host's own line

    def at(self, host: str) -> str:
        return f"{self.direct}.{host}"


def parse_url(url: str) -> tuple[list[str], str]:
    """``(servers, prefix)`` from ``nats://a:4222,b:4222?prefix=…``."""
    parts = urlsplit(url)
    prefix = "foundry"
    for name, value in parse_qsl(parts.query):
        if name == "prefix":
            prefix = check_subject_part("prefix", value)
        else:
            raise ConfigError(
                f"pool URL {safe_url(url)!r}: unknown option {name!r}. Fix: the nats pool takes only prefix="
            )
    if not parts.netloc:
        raise ConfigError(f"pool URL {safe_url(url)!r} names no server. Fix: nats://127.0.0.1:4222")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    auth = f"{userinfo}@" if userinfo else ""
    servers = [f"{parts.scheme}://{auth}{host}" for host in hosts.split(",")]
    return servers, prefix


def subjects_for(prefix: str, app: str, unit: str) -> Subjects:
    app, unit = check_subject_part("app name", app), check_subject_part("unit name", unit)
    work = f"{prefix}.pool.{app}.{unit}"
    return Subjects(
        work=work,
        queue=f"{prefix}-pool-{app}-{unit}",
        wait=f"{work}.wait",
        heartbeat=f"{work}.hb",
        direct=f"{work}.at",
    )


class _LoopThread:
    """An asyncio loop on its own thread, and one NATS connection made on first use."""

    def __init__(self, servers: list[str], shown: str, name: str) -> None:
        self.servers = servers
        self.shown = shown
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()
        self.nc: Any = None
        self._connecting: asyncio.Lock | None = None

    async def connected(self) -> Any:
        if self.nc is not None and not self.nc.is_closed:
            return self.nc
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self.nc is None or self.nc.is_closed:
                self.nc = await connect(self.servers, self.shown)
        return self.nc

    def call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def on_loop(self) -> bool:
        return threading.current_thread() is self.thread

    def stop(self) -> None:
        async def close() -> None:
            if self.nc is not None and not self.nc.is_closed:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.nc.close(), 2.0)

        with contextlib.suppress(Exception):
            self.call(close(), 5.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5.0)
        if not self.loop.is_running():
            self.loop.close()


async def connect(servers: list[str], shown: str) -> Any:
    try:
        return await nats.connect(**client_options(servers))
    except (nats.errors.Error, OSError, TimeoutError) as exc:
        raise BackendUnavailableError(
            f"cannot reach NATS at {shown} ({type(exc).__name__}: {exc}). Fix: start nats-server, or point "
            "the pool URL at a running one"
        ) from exc


def _no_responders(msg: Any) -> bool:
    headers = msg.headers
    return bool(headers) and headers.get(_STATUS) == _NO_RESPONDERS and not msg.data


# -- the client: one engine per unit in the submitting process ---------------------------------------


@dataclass(eq=False, slots=True)
class _Call:
    """One attempt on its way (touched on the client's loop thread only)."""

    attempt: Attempt
    done: Done
    frame: bytes
    started: float
    wait_until: float
    stage: str = "free"  # "free": sent to W; "wait": sent to W.wait; "direct": to W.at.<host>
    host: str = ""  # the host that said it holds it in its line
    noticed: float = 0.0
    bounces: int = 0
    timer: asyncio.TimerHandle | None = None


class NatsPool:
    """Sends a unit's attempts to the first free worker on any host (module docstring)."""

    def __init__(self, url: str, spec: EngineSpec) -> None:
        self.url = url
        self.shown = safe_url(url)
        servers, prefix = parse_url(url)
        self.subjects = subjects_for(prefix, spec.app, spec.unit)
        self.unit = spec.unit
        self._io = _LoopThread(servers, self.shown, f"foundry-pool-nats-{spec.unit}")
        self._lock = threading.Lock()
        self._arrivals = 0
        self._served = 0
        self._service = 0.0
        self._open = 0
        self._closed = False
        # Attempts on their way to the loop (under the lock): one sender task takes them
        # all each time it wakes, and a submitting thread wakes it only when nothing waits
        # yet (one call_soon_threadsafe, one loop wake-up, for any number of attempts).
        self._outbox: deque[tuple[Attempt, Done]] = deque()
        self._kicked = False
        self._wanted = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        # on the loop thread only:
        self._calls: dict[str, _Call] = {}
        self._tokens = itertools.count(1)
        self._inbox = ""
        self._heard: dict[str, float] = {}  # host -> when it was last heard from
        self._free: dict[str, int] = {}  # host -> free workers, as its last heartbeat counted them
        self._suspects: dict[str, float] = {}  # silent host -> when it was last probed
        self._closing: set[str] = set()  # hosts that said bye: no subscription, still finishing
        self._busy_until = 0.0  # until then, new attempts go straight to the waiting line
        self._watching: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<NatsPool {self.unit} {self.shown}>"

    def send(self, attempt: Attempt, done: Done) -> None:
        done = answer_once(done, attempt)
        with self._lock:
            self._arrivals += 1
            closed = self._closed
            kick = False
            if not closed:
                self._open += 1
                self._outbox.append((attempt, done))
                kick, self._kicked = not self._kicked, True
        if closed:
            done(Reply(NO_WORKER, detail="the pool client is closed"))
        elif kick:
            self._io.loop.call_soon_threadsafe(self._wake_sender)

    def cancel(self, request: str) -> bool:
        """An attempt handed to NATS cannot be recalled: a host may already run it."""
        return False

    def _wake_sender(self) -> None:
        if self._sender is None:
            self._sender = self._io.loop.create_task(self._send_all())
        self._wanted.set()

    async def _send_all(self) -> None:
        """The one task that sends attempts: everything in the outbox, each time it wakes."""
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            with self._lock:
                batch = list(self._outbox)
                self._outbox.clear()
                self._kicked = False
            for attempt, done in batch:
                try:
                    await self._carry(attempt, done)
                except Exception as exc:  # never let one attempt stop the sender
                    log.exception("unit %r: sending an attempt failed", self.unit)
                    self._finish(
                        _Call(attempt, done, b"", 0.0, 0.0),
                        "",
                        Reply(LOST, detail=f"sending it failed ({type(exc).__name__}: {exc})"),
                    )

    async def _carry(self, attempt: Attempt, done: Done) -> None:
        now = time.monotonic()
        call = _Call(attempt, done, encode_request(attempt), now, now + attempt.wait)
        try:
            nc = await self._io.connected()
            if not self._inbox:
                await self._listen(nc)
        except BackendUnavailableError as exc:
            self._finish(call, "", Reply(NO_WORKER, detail=str(exc)))
            return
        except Exception as exc:
            self._finish(
                call, "", Reply(NO_WORKER, detail=f"the NATS client failed ({type(exc).__name__}: {exc})")
            )
            return
        token = str(next(self._tokens))
        self._calls[token] = call
        self._arm(token, call, attempt.timeout + GRACE)
        host = self._steer() if self._suspects else ""
        if host:  # a host may be cut off but still subscribed: around it, to a live one
            call.stage, call.host, call.noticed = "direct", host, now
            await self._publish(nc, token, call, self.subjects.at(host))
        elif now < self._busy_until:  # every worker was busy a moment ago: join a line at once
            call.stage = "wait"
            await self._publish(nc, token, call, self.subjects.wait)
        else:
            await self._publish(nc, token, call, self.subjects.work)

    def _steer(self) -> str:
        """The live host with the most free workers by its last heartbeat ("" if none is
        live); counts the attempt against it until its next heartbeat."""
        now = time.monotonic()
        live = [
            h
            for h, at in self._heard.items()
            if h not in self._suspects and h not in self._closing and now - at <= HOST_SILENCE
        ]
        if not live:
            return ""
        host = max(live, key=lambda h: self._free.get(h, 0))
        self._free[host] = self._free.get(host, 0) - 1
        return host

    async def _listen(self, nc: Any) -> None:
        inbox = nc.new_inbox()
        await nc.subscribe(f"{inbox}.*", cb=self._on_reply)
        await nc.subscribe(f"{self.subjects.heartbeat}.*", cb=self._on_heartbeat)
        self._inbox = inbox
        self._watching = asyncio.get_running_loop().create_task(self._watch())

    async def _publish(self, nc: Any, token: str, call: _Call, subject: str) -> None:
        try:
            await nc.publish(subject, call.frame, reply=f"{self._inbox}.{token}")
        except Exception as exc:
            self._finish(
                call,
                token,
                Reply(LOST, detail=f"sending it to NATS at {self.shown} failed ({type(exc).__name__})"),
            )

    def _arm(self, token: str, call: _Call, seconds: float) -> None:
        if call.timer is not None:
            call.timer.cancel()
        call.timer = self._io.loop.call_later(max(0.0, seconds), self._expired, token)

    def _expired(self, token: str) -> None:
        call = self._calls.get(token)
        if call is None:
            return
        where = f"host {call.host}" if call.host else "the worker that took it"
        self._finish(
            call,
            token,
            Reply(
                LOST,
                detail=f"no answer within {time.monotonic() - call.started:.3g}s from {where} (its process "
                "or host may be gone or cut off from NATS)",
            ),
        )

    async def _on_reply(self, msg: Any) -> None:
        token = msg.subject[len(self._inbox) + 1 :]
        if token.startswith("p_"):  # a suspect's probe: "no responders" = the server dropped it
            if _no_responders(msg):
                host = token[2:]
                if self._suspects.pop(host, None) is not None:
                    self._heard.pop(host, None)
                    self._free.pop(host, None)
            return
        call = self._calls.get(token)
        if call is None:
            return
        if _no_responders(msg):
            if call.stage == "direct":  # that host is gone: the usual way, to the first free one
                call.stage, call.host = "free", ""
                await self._publish(self._io.nc, token, call, self.subjects.work)
                return
            if call.stage == "free":  # every worker on every host is busy: join a waiting line
                call.stage = "wait"
                self._busy_until = time.monotonic() + BUSY_HINT
                await self._publish(self._io.nc, token, call, self.subjects.wait)
                return
            self._finish(
                call,
                token,
                Reply(NO_WORKER, detail=f"no worker subscribes to {self.subjects.work} on {self.shown}"),
            )
            return
        reply = decode_reply(msg.data)
        if msg.data[:1] == b"q":  # QUEUED: it waits in that host's line
            call.host = reply.body.decode(errors="replace")
            call.noticed = time.monotonic()
            self._heard.setdefault(call.host, call.noticed)
            self._arm(token, call, call.wait_until - call.noticed + call.attempt.timeout + GRACE)
            return
        if msg.data[:1] == b"b":  # BOUNCE: that host did not run it; send it again
            call.bounces += 1
            original = decode_reply(reply.body)
            if call.bounces > MAX_BOUNCES or time.monotonic() >= call.wait_until:
                kind = original.kind if original.kind in (NO_WORKER, OVERLOAD, DEADLINE) else OVERLOAD
                self._finish(
                    call,
                    token,
                    Reply(
                        kind,
                        detail=f"{call.bounces} hosts sent it back, the last because "
                        + original.body.decode(errors="replace"),
                    ),
                )
                return
            call.stage, call.host = "free", ""
            await self._publish(self._io.nc, token, call, self.subjects.work)
            return
        if reply.kind == LOST:
            reply = Reply(LOST, detail=reply.body.decode(errors="replace"))
        elif reply.kind not in (OK, ERROR):
            reply = Reply(reply.kind, detail=reply.body.decode(errors="replace"))
        elif call.stage == "wait" or call.host:
            queued = time.monotonic() - call.started - reply.seconds
            reply = Reply(reply.kind, reply.body, reply.worker, "", reply.seconds, max(0.0, queued))
        self._finish(call, token, reply)

    async def _on_heartbeat(self, msg: Any) -> None:
        host = msg.subject.rsplit(".", 1)[-1]
        self._heard[host] = time.monotonic()  # alive: what it holds is not lost
        self._suspects.pop(host, None)
        if msg.data == BYE or host in self._closing:
            # It is closing: it holds no subscription (no suspect, no host to steer to) and
            # goes on beating "bye" while it finishes what it runs, then falls silent.
            self._closing.add(host)
            self._free.pop(host, None)
            return
        try:
            self._free[host] = int(msg.data or b"0")
        except ValueError:  # another version's heartbeat: alive, free workers unknown
            self._free[host] = 0

    async def _watch(self) -> None:
        """Attempts that wait in a host's line are lost when that host falls silent; a
        silent host is suspect until its own subject has no responders (module docstring)."""
        while True:
            await asyncio.sleep(HEARTBEAT)
            now = time.monotonic()
            for host, at in list(self._heard.items()):
                if now - at <= HOST_SILENCE or host in self._suspects:
                    continue
                if host not in self._closing:
                    self._suspects[host] = 0.0
                elif not any(call.host == host for call in self._calls.values()):
                    self._closing.discard(host)  # it closed and left: forget it
                    del self._heard[host]
            for host, probed in list(self._suspects.items()):
                if now - probed >= PROBE_EVERY:
                    self._suspects[host] = now
                    with contextlib.suppress(Exception):
                        await self._io.nc.publish(
                            self.subjects.at(host), b"", reply=f"{self._inbox}.p_{host}"
                        )
            for token, call in list(self._calls.items()):
                if call.host and now - max(call.noticed, self._heard.get(call.host, 0.0)) > HOST_SILENCE:
                    self._finish(
                        call,
                        token,
                        Reply(
                            LOST,
                            detail=f"host {call.host} held it and went silent (no heartbeat for "
                            f"{HOST_SILENCE:g}s: it died or is cut off from NATS)",
                        ),
                    )

    def _finish(self, call: _Call, token: str, reply: Reply) -> None:
        if token:
            self._calls.pop(token, None)
        if call.timer is not None:
            call.timer.cancel()
        with self._lock:
            self._open -= 1
            if reply.kind in (OK, ERROR):
                self._served += 1
                self._service += reply.seconds
        call.done(reply)

    def stats(self) -> EngineStats:
        with self._lock:
            return EngineStats(-1, -1, -1, 0, self._arrivals, self._served, self._service)

    def close(self, timeout: float = 10.0) -> None:
        end = time.monotonic() + timeout
        with self._lock:
            self._closed = True
        while time.monotonic() < end:
            with self._lock:
                if self._open == 0:
                    break
            time.sleep(0.02)

        async def abandon() -> None:
            for task in (self._watching, self._sender):
                if task is not None:
                    task.cancel()
            with self._lock:
                unsent = list(self._outbox)
                self._outbox.clear()
            for attempt, done in unsent:  # never handed to NATS: nothing ran
                self._finish(
                    _Call(attempt, done, b"", 0.0, 0.0),
                    "",
                    Reply(NO_WORKER, detail="the pool client closed before it was sent"),
                )
            for token, call in list(self._calls.items()):
                self._finish(call, token, Reply(LOST, detail="the pool client closed before the answer came"))

        with contextlib.suppress(Exception):
            self._io.call(abandon(), 5.0)
        self._io.stop()


# -- the worker host: ``foundry pool serve`` ---------------------------------------------------------


@dataclass(eq=False, slots=True)
class _Held:
    reply_to: str
    since: float
    noticed: bool = False


@dataclass(eq=False)
class _Outbox:
    """Answers on their way from the dispatcher's threads to the NATS loop."""

    items: deque[tuple[tuple[str, int], str, bytes]] = field(default_factory=deque)
    kicked: bool = False
    wanted: asyncio.Event = field(default_factory=asyncio.Event)  # set: flush now


class NatsWorkerHost(LocalFront):
    """This host's workers for one unit (``foundry pool serve``): the embedded pool's
    exact dispatcher behind one NATS connection (module docstring). Sizable by the
    elastic controller; drained on close."""

    def __init__(self, url: str, spec: EngineSpec) -> None:
        self.url = url
        self.shown = safe_url(url)
        self._servers, prefix = parse_url(url)
        self.subjects = subjects_for(prefix, spec.app, spec.unit)
        self.spec = spec
        self.unit = spec.unit
        self.where = f" on {self.shown}"
        self.ready_fix = "check that the unit's module imports on this host and that NATS is reachable"
        self.name = "".join(c if c.isalnum() or c in "-_" else "_" for c in f"{host_name()}-{os.getpid()}")
        self._held: dict[tuple[str, int], _Held] = {}  # loop thread only
        self._out = _Outbox()
        self._closing = False
        self._free_sub: Any = None
        self._wait_sub: Any = None
        self._own_sub: Any = None
        self._ticker: asyncio.Task[None] | None = None
        self._sender: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._reconciling: asyncio.Lock | None = None
        self._io = _LoopThread(self._servers, self.shown, f"foundry-pool-host-{spec.unit}")
        self.local = LocalPool(
            "local://", spec, max_waiting=MAX_WAITING, on_change=self._poke, loop=self._io.loop
        )
        try:
            self._io.call(self._start(), 10.0)
        except BaseException:
            self.local.close(0.0)
            self._io.stop()
            raise

    def __repr__(self) -> str:
        return f"<NatsWorkerHost {self.unit} {self.name} {self.shown}>"

    @property
    def _beat_subject(self) -> str:
        return f"{self.subjects.heartbeat}.{self.name}"

    async def _start(self) -> None:
        await self._io.connected()
        self._ticker = asyncio.get_running_loop().create_task(self._tick())
        self._sender = asyncio.get_running_loop().create_task(self._send())
        await self._reconcile()

    def ready(self) -> None:
        self._poke()  # subscribe now that workers are ready

    # -- taking requests ------------------------------------------------------------------

    async def _on_request(self, msg: Any) -> None:
        reply_to = msg.reply
        if not reply_to:
            log.warning(
                "unit %r: a request on %s without a reply subject was dropped", self.unit, msg.subject
            )
            return
        nc = self._io.nc
        if not msg.data:  # a client's probe of this host's own subject: it is here
            await nc.publish(reply_to, b"")
            return
        try:
            attempt = attempt_from_frame(msg.data, self.unit, self.spec.codec)
        except ValueError as exc:
            await nc.publish(reply_to, refusal(self.unit, str(exc)))
            return
        if self._closing:
            await nc.publish(reply_to, _bounce(DEADLINE, f"host {self.name} is closing"))
            return
        token = (attempt.request, attempt.number)
        self._held[token] = _Held(reply_to, time.monotonic())
        self.local.send(attempt, lambda reply: self._answer(token, reply_to, reply), frame=msg.data)

    def _answer(self, token: tuple[str, int], reply_to: str, reply: Reply) -> None:
        """The dispatcher's answer (from its thread or ours): on its way to the client."""
        if reply.kind in (NO_WORKER, OVERLOAD) or reply.kind == BOUNCE:
            frame = _bounce(
                DEADLINE if reply.kind == BOUNCE else reply.kind, f"host {self.name}: {reply.detail}"
            )
        elif reply.kind in (OK, ERROR):
            frame = encode_reply(reply.kind, reply.body, reply.seconds)
        else:
            frame = encode_reply(reply.kind, f"{reply.detail} (host {self.name})".encode())
        self._out.items.append((token, reply_to, frame))
        self._poke()

    def _poke(self) -> None:
        """Something changed (an answer, a free worker): flush and re-subscribe on the loop
        (the sender task runs on the loop's next turn; pokes until then are one flush)."""
        if self._out.kicked:
            return
        self._out.kicked = True
        if self._io.on_loop():
            self._out.wanted.set()
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to flush to
                self._io.loop.call_soon_threadsafe(self._out.wanted.set)

    async def _send(self) -> None:
        """The one task that sends the answers and follows the free workers."""
        wanted = self._out.wanted
        while True:
            await wanted.wait()
            wanted.clear()
            await self._flush()

    def _later(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as a task on the loop, keeping a reference until it ends."""
        task = self._io.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(self) -> None:
        self._out.kicked = False
        nc = self._io.nc
        items = self._out.items
        while items:
            token, reply_to, frame = items.popleft()
            self._held.pop(token, None)
            try:
                await nc.publish(reply_to, frame)
            except Exception as exc:  # the client sees no answer: its own timer says LOST
                log.warning("unit %r: could not send an answer to %s (%s)", self.unit, reply_to, exc)
        await self._reconcile()

    async def _reconcile(self) -> None:
        """Subscribe to the free subject while a worker is free and nothing waits here; to
        the waiting line while a worker is live or coming."""
        if self._reconciling is None:
            self._reconciling = asyncio.Lock()
        async with self._reconciling:  # one at a time: two would both subscribe
            await self._reconcile_now()

    async def _reconcile_now(self) -> None:
        free, waiting, serving = self.local.offer()
        serving = serving and not self._closing
        want_free = serving and free > waiting
        if (want_free, serving, serving) == (
            self._free_sub is not None,
            self._wait_sub is not None,
            self._own_sub is not None,
        ):
            return  # as it should be (the common case: nothing to send)
        nc = await self._io.connected()
        try:
            if want_free and self._free_sub is None:
                self._free_sub = await nc.subscribe(
                    self.subjects.work, queue=self.subjects.queue, cb=self._on_request
                )
            elif not want_free and self._free_sub is not None:
                sub, self._free_sub = self._free_sub, None
                self._later(_drain(sub))  # what is on its way still lands
            if serving and self._wait_sub is None:
                self._wait_sub = await nc.subscribe(
                    self.subjects.wait, queue=f"{self.subjects.queue}-wait", cb=self._on_request
                )
            elif not serving and self._wait_sub is not None:
                sub, self._wait_sub = self._wait_sub, None
                self._later(_drain(sub))
            if serving and self._own_sub is None:
                self._own_sub = await nc.subscribe(self.subjects.at(self.name), cb=self._on_request)
            elif not serving and self._own_sub is not None:
                sub, self._own_sub = self._own_sub, None
                self._later(_drain(sub))
        except nats.errors.Error as exc:  # reconnecting: the subscriptions are replayed, try again soon
            log.debug("unit %r: subscribing failed (%s)", self.unit, exc)

    async def _tick(self) -> None:
        """Heartbeats, and the notice for attempts that wait in this host's line."""
        beat = 0.0
        while True:
            await asyncio.sleep(_TICK)
            nc = self._io.nc
            now = time.monotonic()
            try:
                if now - beat >= HEARTBEAT:
                    beat = now
                    free, waiting = self.local.free()
                    free_now = str(max(0, free - waiting)).encode()
                    await nc.publish(self._beat_subject, BYE if self._closing else free_now)
                    await self._reconcile()
                notice = encode_reply(QUEUED, self.name.encode())
                for held in list(self._held.values()):
                    if not held.noticed and now - held.since > QUEUE_NOTICE:
                        held.noticed = True
                        await nc.publish(held.reply_to, notice)
            except Exception as exc:
                log.debug("unit %r: heartbeat failed (%s)", self.unit, exc)

    # -- closing ----------------------------------------------------------------------------

    def close(self, timeout: float = 10.0) -> None:
        """Stop taking requests; what runs here finishes within ``timeout`` (the rest is
        killed and answered ``LOST``); what never started is sent back to be sent elsewhere."""
        self._closing = True

        async def unsubscribe() -> None:
            for sub in (self._free_sub, self._wait_sub, self._own_sub):
                if sub is not None:  # what still lands meanwhile is sent back (BOUNCE)
                    self._later(_drain(sub))
            self._free_sub = self._wait_sub = self._own_sub = None
            await self._io.nc.publish(self._beat_subject, BYE)  # no client holds it suspect

        with contextlib.suppress(Exception):
            self._io.call(unsubscribe(), 5.0)
        unsubscribed = time.monotonic()
        self.local.close(timeout, leftover=BOUNCE)
        time.sleep(max(0.0, unsubscribed + LATE - time.monotonic()))  # late deliveries land and bounce

        async def last() -> None:
            await self._flush()
            lingering = [t for t in (self._ticker, self._sender, *self._tasks) if t is not None]
            for task in lingering:  # (dropped subscriptions are forgotten as their drains end)
                task.cancel()
            await asyncio.gather(*lingering, return_exceptions=True)
            with contextlib.suppress(Exception):
                await self._io.nc.flush(2)

        with contextlib.suppress(Exception):
            self._io.call(last(), 5.0)
        self._io.stop()


def _bounce(kind: str, detail: str) -> bytes:
    """A ``BOUNCE`` whose body is the reply the client gives if no host takes it."""
    return encode_reply(BOUNCE, encode_reply(kind, detail.encode()))


LINGER = 5.0  # seconds a subscription keeps its callback after UNSUB
LATE = 0.2  # what a closing host waits after its UNSUB for deliveries already on their way


async def _drain(sub: Any) -> None:
    """Take back a subscription's interest without losing what is already on its way.

    The server may deliver a message it routed just before it processed the UNSUB even
    after answering a PING sent behind it (its routing and our connection's writes are
    concurrent), and nats-py drops messages for a subscription it has forgotten — a
    request silently lost. So the subscription keeps its callback for :data:`LINGER`
    seconds after the UNSUB, and only then is forgotten."""
    conn = sub._conn
    try:
        await conn._send_unsubscribe(sub._id)
        await asyncio.sleep(LINGER)
    except Exception:  # closed or reconnecting: nothing more will come
        pass
    finally:
        conn._remove_sub(sub._id)
        sub._stop_processing()
