"""Redis Streams: one Redis stream per partition, one Redis consumer group per group.

URL: ``redis://host:6379/0`` (``rediss://`` for TLS) with the option ``prefix=`` (default
``foundry:stream``) that keeps apps sharing a server apart. Every key of a stream shares
one hash tag, ``{<prefix>:<stream>}``, so the scripts (``redis_lua/*.lua``, beside this
file) stay valid on Redis Cluster.
``socket_timeout``, ``socket_connect_timeout``, ``health_check_interval`` and
``client_name`` are passed to redis-py; so are, with ``rediss://`` only,
``ssl_ca_certs=<CA file>``, ``ssl_certfile=``/``ssl_keyfile=``,
``ssl_cert_reqs=none|optional|required`` and ``ssl_check_hostname=true|false``, each
checked first (``foundry.backends._urls``); a refused server certificate is a
:class:`~foundry.errors.ConfigError`. Any other option is a ``ConfigError``.

How the contract maps onto Redis:

* **Dense offsets.** An append script assigns offset ``n`` and stores the entry under the
  explicit id ``n-0`` (``XADD key n-0 …``), so an offset *is* a stream id, lag is a
  subtraction and ``XTRIM MINID`` trims by offset. The append timestamp is a field and is
  kept non-decreasing per partition, so time seeks binary-search ids.
* **Publish dedup**: event ids are fields of hashes per time bucket of one dedup window
  (``{…}:ids:<bucket>``, expiring after two windows); the append script looks a batch's
  ids up in the current and the previous bucket (two ``HMGET``) and records the new ones
  (one ``HSET``) in the same atomic call as the ``XADD`` s — an id is remembered for at
  least one window and at most two.
* **Read** is a script: the group's pending entries list (``XPENDING``) is looked at first;
  a prefix of expired entries is taken with ``XAUTOCLAIM`` (which also drops entries that
  retention trimmed); while an unexpired entry is pending nothing is handed out; only an
  empty PEL lets ``XREADGROUP … >`` deliver new entries. One script call is atomic, so
  competing readers of a partition cannot interleave. A reader that found nothing waits
  in ``XREAD BLOCK`` from the group's last delivered id.
* **Commit** acknowledges (``XACK``) every pending id up to the offset; ``extend`` resets
  the idle time of a consumer's entries (``XCLAIM … JUSTID``). The ack deadline is
  measured as idle time since the last delivery, with the reader's ``ack_deadline``.
* **Retention**: ``max_events`` by ``XADD MAXLEN`` (exact), ``max_age`` and ``max_bytes``
  by ``XTRIM MINID`` in :meth:`enforce_retention` (run at most once a second by
  appends). Dead letters are a capped stream ``{…}:dead``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar
from urllib.parse import urlencode, urlsplit, urlunsplit

import redis
import redis.exceptions

from foundry.backends._lua import lua_scripts
from foundry.backends._urls import (
    REDIS_PASSED,
    REDIS_TLS,
    ShowsUrl,
    refused_certificate,
    safe_url,
    tls_options,
    url_options,
)
from foundry.backends.stream._common import (
    AppendInThread,
    CheckedRead,
    dead_from_record,
    dead_record,
    event_letter,
    gap_letter,
)
from foundry.backends.stream.base import (
    Appended,
    Capabilities,
    DeadLetter,
    Event,
    MalformedEntryError,
    NewEvent,
    PartitionLag,
    Start,
    StreamConfig,
    StreamInfo,
    check_name,
    check_partition,
    derived_id,
    malformed_event,
    partition_for,
    partitions_changed,
    resolve_start,
    unknown_group,
    unknown_stream,
)
from foundry.errors import BackendError, BackendUnavailableError, ConfigError
from foundry.tracecontext import parse_trace

__all__ = ["RedisStreamBackend", "decode_fields", "unpack_entry"]

_DEAD_MAXLEN = 100_000
_HEAD = struct.Struct(">HI")  # partition, length of the blob that follows
_LEN = struct.Struct(">I")

_PASSED = REDIS_PASSED


def _parse(url: str) -> tuple[str, str]:
    """The redis-py URL (the options it takes, TLS ones checked) and the key prefix."""
    shown = safe_url(url)
    parts = urlsplit(url)
    query = url_options("stream", url, ("prefix",), _PASSED, REDIS_TLS)
    tls_options("stream", url, query, REDIS_TLS)
    prefix = query.pop("prefix", "foundry:stream")
    if not prefix or "{" in prefix or "}" in prefix:
        raise ConfigError(f"stream URL {shown!r}: prefix={prefix!r}. Fix: a non-empty prefix without braces")
    return urlunsplit(parts._replace(query=urlencode(query))), prefix


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _constant(value: int, _when: float) -> int:
    return value


def _offset(entry_id: Any) -> int:
    return int(_s(entry_id).split("-", 1)[0])


def _seq(entry_id: bytes) -> int:
    """The sequence part of a stream id (``b"12-3"`` → 3)."""
    _, _, seq = entry_id.partition(b"-")
    return int(seq) if seq else 0


def _entry_id(item: Any) -> bytes:
    """The stream id of one entry as the read script packs it (see :func:`unpack_entry`)."""
    if isinstance(item, list):
        return bytes(item[0])
    return bytes(item.split(b" ", 2)[1])


def decode_fields(
    stream: str, partition: int, offset: int, m: bytes, d: bytes, deliveries: int, *, seq: int = 0
) -> Event:
    """An entry's fields ``m`` (``"<ts> <cumulative bytes> <#id> <k|->" + id + key``) and
    ``d`` (the payload) as the event Foundry stored, or :class:`MalformedEntryError` naming
    what Foundry could not have written (anyone can ``XADD`` to the partition's key).
    Nothing else is raised.

    ``seq`` is the sequence part of the entry's stream id: 0 for every entry Foundry
    appends (``<offset>-0``), more for the second and later entries another producer added
    with an automatic id in one millisecond. Those share an offset, so an event among them
    stored without an id is named ``<stream>/<partition>@<offset>-<seq>``: still stable,
    and not taken for its neighbour."""
    if type(m) is not bytes or type(d) is not bytes:
        raise MalformedEntryError("its fields m and d are not byte strings")
    parts = m.split(b" ", 3)
    if len(parts) != 4:
        raise MalformedEntryError(f"its field m {m[:80]!r} does not have four parts")
    ts_text, cum_text, size_text, tail = parts
    try:
        ts = float(ts_text)
        int(cum_text)
        size = int(size_text)
    except ValueError:
        raise MalformedEntryError(
            f"its field m {m[:80]!r} does not start with two numbers and a length"
        ) from None
    if not math.isfinite(ts) or not 0 <= size < len(tail) or tail[:1] not in (b"k", b"-"):
        raise MalformedEntryError(f"its field m {m[:80]!r} has a bad time, id length or key mark")
    end = 1 + size
    if tail[:1] == b"-" and len(tail) != end:
        raise MalformedEntryError(f"its field m {m[:80]!r} has bytes after an id without a key")
    try:
        ident = tail[1:end].decode()
        key = tail[end:].decode() if tail[:1] == b"k" else None
    except UnicodeDecodeError as exc:
        raise MalformedEntryError(f"its id or key is not UTF-8 ({exc})") from None
    if not ident:
        ident = derived_id(stream, partition, offset) + (f"-{seq}" if seq else "")
    return Event(stream, partition, offset, ident, key, d, ts, deliveries)


def unpack_entry(stream: str, partition: int, item: Any, deliveries: int) -> Event:
    """One entry as the read script returns it: ``b"<#m> <id> " + m + d`` for an entry with
    Foundry's fields, ``[id, [field, value, ...]]`` for any other. The latter, and a
    ``m`` :func:`decode_fields` refuses, come out as a stand-in marked ``malformed`` at
    the entry's offset (the millisecond part of its id), for the group to dead-letter."""
    if isinstance(item, list):
        entry_id, flat = bytes(item[0]), list(item[1])
        names = [bytes(n) for n in flat[0::2]]
        values = [bytes(v) for v in flat[1::2]]
        offset = _offset(entry_id)
        fields = ", ".join(n.decode(errors="replace") for n in names) or "none"
        data = values[names.index(b"d")] if b"d" in names else _fields_json(names, values)
        return malformed_event(
            stream,
            partition,
            offset,
            f"entry {entry_id.decode()} of partition {partition} has no Foundry fields m and d "
            f"(fields: {fields}): someone else wrote it to the partition",
            deliveries=deliveries,
            payload=data,
        )
    sizes, entry_id, rest = bytes(item).split(b" ", 2)
    offset = _offset(entry_id)
    size, _, traced = sizes.partition(b",")
    m, data = rest[: int(size)], rest[int(size) :]
    trace = None
    if traced:  # a trace context t sits between m and d
        trace, data = data[: int(traced)], data[int(traced) :]
    try:
        event = decode_fields(stream, partition, offset, m, data, deliveries, seq=_seq(entry_id))
    except MalformedEntryError as exc:
        return malformed_event(
            stream,
            partition,
            offset,
            f"entry {entry_id.decode()} of partition {partition} is not a Foundry event: {exc}",
            deliveries=deliveries,
            payload=data,
        )
    # the trace context is advisory: one that does not parse is ignored
    return event if trace is None else dataclasses.replace(event, trace=parse_trace(trace))


def _fields_json(names: list[bytes], values: list[bytes]) -> bytes:
    """A foreign entry's fields as the bytes kept in its dead letter."""
    return json.dumps(
        {
            n.decode(errors="backslashreplace"): v.decode(errors="backslashreplace")
            for n, v in zip(names, values, strict=False)
        }
    ).encode()


class RedisStreamBackend(ShowsUrl, AppendInThread, CheckedRead):
    """Redis Streams (see the module docstring)."""

    capabilities: ClassVar[Capabilities] = Capabilities(atomic_read=True, dense_offsets=True)

    def __init__(self, url: str) -> None:
        self._url = url  # to connect with
        self._shown = safe_url(url)  # for messages: the password masked
        redis_url, self.prefix = _parse(url)
        try:
            self._r = redis.Redis.from_url(redis_url, socket_connect_timeout=5, socket_timeout=60)
        except ValueError as exc:
            raise ConfigError(
                f"stream URL {self._shown!r} is not a Redis URL ({exc}). Fix: redis://host:6379/0"
            ) from exc
        self._scripts = {
            name: self._r.register_script(text)
            for name, text in lua_scripts(__package__ or "foundry.backends.stream", "redis_lua").items()
        }
        self._configs: dict[str, StreamConfig] = {}
        self._last_trim: dict[str, float] = {}
        self._lock = threading.Lock()

    # -- plumbing --------------------------------------------------------------

    def _tag(self, stream: str) -> str:
        return f"{{{self.prefix}:{stream}}}"

    def _pkey(self, stream: str, partition: int) -> str:
        return f"{self._tag(stream)}:p:{partition}"

    @contextlib.contextmanager
    def _errors(self, what: str, stream: str = "", group: str = "") -> Iterator[None]:
        try:
            yield
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            refused = refused_certificate(exc, "stream", self._url, "ssl_ca_certs")
            if refused is not None:
                raise refused from exc
            raise BackendUnavailableError(
                f"Redis at {self._shown}: {what} failed: {exc}. Fix: start redis-server, or point the "
                "stream URL at a running one (a transient error: callers retry; a server that "
                "requires TLS drops redis:// connections: use rediss://)"
            ) from exc
        except redis.exceptions.ResponseError as exc:
            if "NOGROUP" in str(exc) and stream:
                raise unknown_group(stream, group, self._group_names(stream)) from exc
            raise BackendError(f"Redis at {self._shown}: {what} failed: {exc}") from exc
        except redis.exceptions.RedisError as exc:
            raise BackendError(f"Redis at {self._shown}: {what} failed: {exc}") from exc

    def _run(
        self,
        name: str,
        keys: Sequence[str],
        args: Sequence[Any],
        what: str,
        stream: str = "",
        group: str = "",
    ) -> Any:
        with self._errors(what, stream, group):
            return self._scripts[name](keys=list(keys), args=list(args))

    def _config(self, stream: str) -> StreamConfig:
        config = self._configs.get(stream)
        if config is not None:
            return config
        with self._errors("load stream"):
            raw = self._r.hgetall(f"{self._tag(stream)}:cfg")
        if not raw:
            raise unknown_stream(stream, self.streams())
        values = {_s(k): json.loads(v) for k, v in raw.items()}
        config = StreamConfig(
            stream,
            int(values["partitions"]),
            values.get("max_age"),
            values.get("max_events"),
            values.get("max_bytes"),
            float(values["dedup_window"]),
        )
        self._configs[stream] = config
        return config

    # -- streams ---------------------------------------------------------------

    def ensure_stream(self, config: StreamConfig) -> StreamConfig:
        key = f"{self._tag(config.name)}:cfg"
        with self._errors("create stream"):
            self._r.hsetnx(key, "partitions", json.dumps(config.partitions))
            existing = int(json.loads(self._r.hget(key, "partitions") or b"0"))
            if existing != config.partitions:
                raise partitions_changed(config, existing)
            self._r.hset(
                key,
                mapping={
                    "max_age": json.dumps(config.max_age),
                    "max_events": json.dumps(config.max_events),
                    "max_bytes": json.dumps(config.max_bytes),
                    "dedup_window": json.dumps(config.dedup_window),
                },
            )
            self._r.sadd(f"{self.prefix}:streams", config.name)
        self._configs[config.name] = config
        return config

    def streams(self) -> list[str]:
        with self._errors("list streams"):
            return sorted(_s(n) for n in self._r.smembers(f"{self.prefix}:streams"))

    def _locate(
        self, stream: str, partition: int, group: str = "", when: float | None = None
    ) -> list[int | float]:
        raw = self._run(
            "locate",
            [f"{self._tag(stream)}:meta", self._pkey(stream, partition)],
            [partition, group, "" if when is None else repr(when)],
            "locate",
            stream,
            group,
        )
        first, last, first_ts, target, committed, pending, floor = (_s(v) for v in raw)
        return [
            int(first),
            int(last),
            float(first_ts),
            int(target),
            int(committed),
            int(pending),
            int(floor),
        ]

    def info(self, stream: str) -> StreamInfo:
        config = self._config(stream)
        located = [self._locate(stream, p) for p in range(config.partitions)]
        return StreamInfo(
            config=config,
            first=tuple(int(x[0]) for x in located),
            last=tuple(int(x[1]) for x in located),
            groups=tuple(self._group_names(stream)),
        )

    def delete_stream(self, stream: str) -> bool:
        with self._errors("delete stream"):
            found = bool(self._r.srem(f"{self.prefix}:streams", stream))
            keys = list(self._r.scan_iter(match=f"{self._tag(stream)}*", count=1000))
            for i in range(0, len(keys), 500):
                self._r.delete(*keys[i : i + 500])
        self._configs.pop(stream, None)
        return found or bool(keys)

    # -- producing -------------------------------------------------------------

    def append(self, stream: str, events: Sequence[NewEvent]) -> list[Appended]:
        if not events:
            return []
        config = self._config(stream)
        args: list[Any] = [
            self._tag(stream),
            repr(time.time()),
            int(config.dedup_window * 1000),
            config.max_events or 0,
        ]
        parts: list[int] = []
        chunks: list[bytes] = []
        for event in events:
            p = partition_for(event.key, event.id, config.partitions)
            ident = event.id.encode()
            if event.key is None:
                blob = b"%d -%s" % (len(ident), ident)
            else:
                blob = b"%d k%s%s" % (len(ident), ident, event.key.encode())
            trace = (event.trace or "").encode()
            chunks += (
                _HEAD.pack(p, len(blob)),
                blob,
                _LEN.pack(len(event.payload)),
                event.payload,
                _LEN.pack(len(trace)),
                trace,
            )
            parts.append(p)
        args.append(b"".join(chunks))
        firsts, dups, skips = self._run("append", [f"{self._tag(stream)}:meta"], args, "append")
        following = {int(firsts[i]): int(firsts[i + 1]) for i in range(0, len(firsts), 2)}
        duplicates = {int(dups[i]): _s(dups[i + 1]) for i in range(0, len(dups), 2)}
        jumped = {int(skips[i]): int(skips[i + 1]) for i in range(0, len(skips), 2)}
        out = []
        for index, p in enumerate(parts):
            original = duplicates.get(index)
            if original is None:
                following[p] = jumped.get(index, following[p])
                out.append(Appended(p, following[p]))
                following[p] += 1
            else:
                part, off = original.split(":")
                out.append(Appended(int(part), int(off) or None, duplicate=True))
        if (config.max_age or config.max_bytes) and time.monotonic() - self._last_trim.get(
            stream, 0.0
        ) >= 1.0:
            self.enforce_retention(stream)
        return out

    def enforce_retention(self, stream: str) -> int:
        config = self._config(stream)
        self._last_trim[stream] = time.monotonic()
        if not (config.max_age or config.max_bytes):
            return 0
        cutoff = "" if config.max_age is None else repr(time.time() - config.max_age)
        size = "" if config.max_bytes is None else str(config.max_bytes)
        removed = 0
        for p in range(config.partitions):
            removed += int(
                self._run(
                    "trim", [f"{self._tag(stream)}:meta", self._pkey(stream, p)], [p, cutoff, size], "trim"
                )
            )
        return removed

    # -- groups ----------------------------------------------------------------

    def _group_names(self, stream: str) -> list[str]:
        try:
            return sorted(_s(g) for g in self._r.smembers(f"{self._tag(stream)}:groups"))
        except redis.exceptions.RedisError:
            return []

    def groups(self, stream: str) -> list[str]:
        self._config(stream)
        return self._group_names(stream)

    def _targets(
        self, config: StreamConfig, group: str, start: Start, partitions: Sequence[int]
    ) -> dict[int, int]:
        targets: dict[int, int] = {}
        for p in partitions:
            first, last, first_ts, at_time, _, _, floor = self._locate(config.name, p, when=start.time)
            target = resolve_start(
                config,
                group,
                start,
                p,
                int(first),
                int(last),
                functools.partial(float, first_ts),
                functools.partial(_constant, int(at_time)),
                int(floor),
            )
            if target is not None:
                targets[p] = target
        return targets

    def create_group(self, stream: str, group: str, start: Start) -> bool:
        check_name("group", group)
        config = self._config(stream)
        if group in self._group_names(stream):
            return False
        targets = self._targets(config, group, start, range(config.partitions))
        keys = [f"{self._tag(stream)}:meta", f"{self._tag(stream)}:groups"]
        keys += [self._pkey(stream, p) for p in range(config.partitions)]
        ids = [f"{max(targets.get(p, 1) - 1, 0)}-0" for p in range(config.partitions)]
        return bool(self._run("create_group", keys, [group, *ids], "create group"))

    def delete_group(self, stream: str, group: str) -> bool:
        config = self._config(stream)
        with self._errors("delete group"):
            found = bool(self._r.srem(f"{self._tag(stream)}:groups", group))
            for p in range(config.partitions):
                with contextlib.suppress(redis.exceptions.ResponseError):
                    self._r.xgroup_destroy(self._pkey(stream, p), group)
                self._r.delete(f"{self._tag(stream)}:lease:{group}:{p}")
            self._r.delete(f"{self._tag(stream)}:members:{group}")
        return found

    def seek(self, stream: str, group: str, start: Start, partitions: Sequence[int] | None = None) -> None:
        config = self._config(stream)
        if group not in self._group_names(stream):
            raise unknown_group(stream, group, self._group_names(stream))
        chosen = list(range(config.partitions)) if partitions is None else list(partitions)
        for p in chosen:
            check_partition(config, p)
        for p, target in self._targets(config, group, start, chosen).items():
            self._run(
                "seek", [self._pkey(stream, p)], [group, f"{max(target - 1, 0)}-0"], "seek", stream, group
            )

    # -- consuming -------------------------------------------------------------

    def _read(
        self, stream: str, group: str, partition: int, consumer: str, limit: int, ack: float, timeout: float
    ) -> list[Event]:
        config = self._config(stream)
        check_partition(config, partition)
        key = self._pkey(stream, partition)
        ack_ms = int(ack * 1000)
        until = time.monotonic() + (timeout if timeout > 0 else 0.0)
        while True:
            raw = self._run("read", [key], [group, consumer, limit, ack_ms], "read", stream, group)
            kind = _s(raw[0])
            if kind == "claimed":
                events = self._claimed(stream, group, partition, raw)
                if events:
                    return events
                continue  # only trimmed entries were pending: look again
            if kind == "new" and raw[1]:
                return self._fresh(stream, group, partition, raw[1], _offset(raw[2]))
            remaining = until - time.monotonic()
            if remaining <= 0:
                return []
            if kind == "new":
                with self._errors("wait", stream, group):
                    self._r.xread({key: _s(raw[2])}, count=1, block=int(min(remaining, 5.0) * 1000) + 1)
            else:
                time.sleep(min(remaining, 0.02))

    def _claimed(self, stream: str, group: str, partition: int, raw: Sequence[Any]) -> list[Event]:
        entries, deleted, ids, counts = raw[1], raw[2], raw[3], raw[4]
        deliveries = {_offset(i): int(c) + 1 for i, c in zip(ids, counts, strict=True)}
        if deleted:
            offsets = sorted(_offset(d) for d in deleted)
            self._record_gap(stream, group, partition, offsets[0], offsets[-1])
        return [unpack_entry(stream, partition, e, deliveries.get(_offset(_entry_id(e)), 2)) for e in entries]

    def _fresh(
        self, stream: str, group: str, partition: int, entries: Sequence[Any], delivered: int
    ) -> list[Event]:
        events = [unpack_entry(stream, partition, e, 1) for e in entries]
        if events[0].offset > delivered + 1:
            hi = self._lost_below(stream, group, partition, events[0].offset)
            if hi > delivered:
                self._record_gap(stream, group, partition, delivered + 1, hi)
        return events

    def _lost_below(self, stream: str, group: str, partition: int, offset: int) -> int:
        """The last offset below ``offset`` that held an entry now deleted. Offsets skip
        when retention trimmed them (the partition then starts at ``offset``), when an
        entry was ``XDEL``-ed (Redis 7 counts it in ``max-deleted-entry-id``), or when an
        append was placed past a foreign entry's id: those were never used, nothing is lost.
        """
        key = self._pkey(stream, partition)
        with self._errors("read", stream, group):
            info = self._r.xinfo_stream(key)
            if info.get("entries-added") is not None and info["entries-added"] == info.get("length"):
                return 0  # nothing was ever removed (Redis 7 counts what was added)
            head = self._r.xrange(key, "-", "+", count=1)
        if not head or _offset(head[0][0]) >= offset:
            return offset - 1
        deleted = info.get("max-deleted-entry-id")
        return 0 if deleted is None else min(offset - 1, _offset(deleted))

    def _record_gap(self, stream: str, group: str, partition: int, lo: int, hi: int) -> None:
        record: dict[Any, Any] = dead_record(
            gap_letter(self._config(stream), group, partition, lo, hi, time.time())
        )
        with self._errors("record gap"):
            self._r.xadd(f"{self._tag(stream)}:dead", record, maxlen=_DEAD_MAXLEN, approximate=True)

    def commit(self, stream: str, group: str, partition: int, offset: int) -> None:
        check_partition(self._config(stream), partition)
        self._run("commit", [self._pkey(stream, partition)], [group, offset], "commit", stream, group)

    def extend(self, stream: str, group: str, partition: int, consumer: str, ack_deadline: float) -> None:
        self._run("extend", [self._pkey(stream, partition)], [group, consumer], "extend", stream, group)

    def dead_letter(
        self, stream: str, group: str, event: Event, reason: str, error: str | None = None
    ) -> None:
        record = dead_record(event_letter(stream, group, event, reason, error, time.time()))
        fields = [item for pair in record.items() for item in pair]
        keys = [self._pkey(stream, event.partition), f"{self._tag(stream)}:dead"]
        self._run("dead", keys, [group, event.offset, *fields], "dead letter", stream, group)

    def dead_letters(self, stream: str, group: str | None = None, limit: int = 100) -> list[DeadLetter]:
        self._config(stream)
        out: list[DeadLetter] = []
        start = "-"
        with self._errors("dead letters"):
            while len(out) < limit:
                dead_key = f"{self._tag(stream)}:dead"
                chunk: list[Any] = self._r.xrange(dead_key, min=start, max="+", count=500) or []
                for _, raw in chunk:
                    letter = dead_from_record(stream, {_s(k): v for k, v in raw.items()})
                    if group is not None and letter.group != group:
                        continue
                    out.append(letter)
                    if len(out) >= limit:
                        break
                if len(chunk) < 500:
                    break
                start = "(" + _s(chunk[-1][0])
        return out

    def lag(self, stream: str, group: str) -> list[PartitionLag]:
        config = self._config(stream)
        if group not in self._group_names(stream):
            raise unknown_group(stream, group, self._group_names(stream))
        out = []
        for p in range(config.partitions):
            first, last, _, _, committed, pending, _ = self._locate(stream, p, group)
            out.append(PartitionLag(p, int(committed), int(last), int(first), int(pending)))
        return out

    # -- coordination ----------------------------------------------------------

    def join(self, stream: str, group: str, consumer: str, ttl: float) -> list[str]:
        key = f"{self._tag(stream)}:members:{group}"
        now = time.time()
        with self._errors("join"):
            pipe = self._r.pipeline(transaction=True)
            pipe.zremrangebyscore(key, "-inf", now)
            pipe.zadd(key, {consumer: now + ttl})
            pipe.zrange(key, 0, -1)
            pipe.pexpire(key, int(max(ttl, 1.0) * 10_000))
            members = pipe.execute()[2]
        return sorted(_s(m) for m in members)

    def leave(self, stream: str, group: str, consumer: str) -> None:
        config = self._config(stream)
        with self._errors("leave"):
            self._r.zrem(f"{self._tag(stream)}:members:{group}", consumer)
        for p in range(config.partitions):
            self.release(stream, group, p, consumer)

    def acquire(self, stream: str, group: str, partition: int, consumer: str, ttl: float) -> bool:
        key = f"{self._tag(stream)}:lease:{group}:{partition}"
        return bool(self._run("acquire", [key], [consumer, max(1, int(ttl * 1000))], "acquire"))

    def release(self, stream: str, group: str, partition: int, consumer: str) -> None:
        self._run("release", [f"{self._tag(stream)}:lease:{group}:{partition}"], [consumer], "release")

    def close(self) -> None:
        with contextlib.suppress(redis.exceptions.RedisError):
            self._r.close()
        with contextlib.suppress(Exception):
            self._r.connection_pool.disconnect()
