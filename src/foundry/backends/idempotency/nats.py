"""NATS: the idempotency records in a JetStream key/value bucket, shared by every host
of the NATS cluster.

URL: ``nats://host:4222`` (several servers: ``nats://a:4222,b:4222``) with the options
``prefix=`` (default ``foundry``; the bucket is ``<PREFIX>_idempotency``) and
``storage=file|memory`` (default ``file``) — the options of a NATS stream URL, so a stream
keeps its records beside its events. The bucket's ``ttl`` is ``max_age`` (JetStream drops
older records by itself; an existing bucket keeps the ttl it was created with).

A record's KV key is ``<hash of the scope>.<hash of the event id>`` (KV keys allow few
characters; the record holds the id itself, checked on every read). A claim is
compare-and-set on the key's revision: ``create`` (only if absent, or deleted) or
``update(last=revision)``; a lost race reads again. So two hosts claiming the same key
cannot both win.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ClassVar, TypeVar
from urllib.parse import parse_qsl, urlsplit

import nats
import nats.errors
import nats.js.api
import nats.js.errors

from foundry.backends._nats import client_options
from foundry.backends._urls import ShowsUrl
from foundry.backends.idempotency.base import (
    DEFAULT_MAX_AGE,
    DEFAULT_MAX_RECORDS,
    Claim,
    Record,
    check_claim_args,
    check_limits,
    check_scope_key,
    claim_step,
    dump_record,
    finish_step,
    live,
    load_record,
)
from foundry.config import safe_url
from foundry.errors import BackendError, BackendUnavailableError, ConfigError

__all__ = ["NatsIdempotencyStore"]

T = TypeVar("T")
_GONE = (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError)
_RACE = nats.js.errors.KeyWrongLastSequenceError
_DOWN = (
    nats.errors.NoServersError,
    nats.errors.ConnectionClosedError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.StaleConnectionError,
    nats.errors.ConnectionReconnectingError,
    nats.js.errors.ServiceUnavailableError,
    asyncio.TimeoutError,
    OSError,
)


def _digest(text: str, size: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:size]


class NatsIdempotencyStore(ShowsUrl):
    """Idempotency records in a JetStream KV bucket (see the module docstring)."""

    transactional: ClassVar[bool] = False

    def __init__(
        self,
        url: str,
        *,
        max_age: float = DEFAULT_MAX_AGE,
        max_records: int = DEFAULT_MAX_RECORDS,
        timeout: float = 5.0,
    ) -> None:
        check_limits("NATS store", max_age, max_records)
        self._url = url
        self.max_age = float(max_age)
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        unknown = sorted(set(query) - {"prefix", "storage"})
        if unknown:
            raise ConfigError(
                f"idempotency URL {safe_url(url)!r}: unknown option(s) {', '.join(unknown)}. "
                "Fix: use only prefix and storage"
            )
        prefix = query.get("prefix", "foundry")
        storage = query.get("storage", "file")
        if storage not in ("file", "memory") or not prefix.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(
                f"idempotency URL {safe_url(url)!r}: prefix={prefix!r}, storage={storage!r}. "
                "Fix: a prefix of letters, digits, '_' or '-', and storage=file or memory"
            )
        self.bucket = f"{prefix.upper()}_idempotency"
        self._storage = nats.js.api.StorageType.FILE if storage == "file" else nats.js.api.StorageType.MEMORY
        netloc = parts.netloc.rsplit("@", 1)
        auth = f"{netloc[0]}@" if len(netloc) == 2 else ""
        self._servers = [f"{parts.scheme}://{auth}{host}" for host in netloc[-1].split(",")]
        self._timeout = timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="foundry-nats-idem", daemon=True)
        self._thread.start()
        self._nc: Any = None
        self._kv: Any = None
        self._closed = False

    # -- plumbing --------------------------------------------------------------

    def _call(self, make: Callable[[], Coroutine[Any, Any, T]], what: str) -> T:
        if self._closed:
            raise BackendError(f"idempotency store {self.url} is closed. Fix: open a new one")
        future = asyncio.run_coroutine_threadsafe(self._guard(make, what), self._loop)
        try:
            return future.result(self._timeout * 3)
        except TimeoutError as exc:
            future.cancel()
            raise BackendUnavailableError(f"NATS at {self.url}: {what} timed out. Fix: retry") from exc

    async def _guard(self, make: Callable[[], Awaitable[T]], what: str) -> T:
        try:
            if self._kv is None:
                await self._connect()
            return await make()
        except BackendError:
            raise
        except _DOWN as exc:
            raise BackendUnavailableError(
                f"NATS at {self.url}: {what} failed ({type(exc).__name__}: {exc}). Fix: check that "
                "nats-server runs with JetStream (-js); callers retry"
            ) from exc
        except nats.errors.Error as exc:
            raise BackendError(f"NATS at {self.url}: {what} failed: {exc}") from exc

    async def _connect(self) -> None:
        if self._nc is None or self._nc.is_closed:
            self._nc = await asyncio.wait_for(nats.connect(**client_options(self._servers)), self._timeout)
        js = self._nc.jetstream(timeout=self._timeout)
        try:
            self._kv = await js.key_value(self.bucket)
        except nats.js.errors.BucketNotFoundError:
            config = nats.js.api.KeyValueConfig(
                bucket=self.bucket, history=1, ttl=self.max_age, storage=self._storage
            )
            self._kv = await js.create_key_value(config)

    def _kvkey(self, scope: str, key: str) -> str:
        return f"{_digest(scope, 24)}.{_digest(key, 40)}"

    def _where(self, scope: str, key: str) -> str:
        return f"{scope!r}/{key!r} (KV {self.bucket} key {self._kvkey(scope, key)} at {self.url})"

    async def _get(self, scope: str, key: str) -> tuple[Record | None, int]:
        """The record and its revision (0 when absent or deleted)."""
        try:
            entry = await self._kv.get(self._kvkey(scope, key))
        except _GONE as exc:
            revision = getattr(getattr(exc, "entry", None), "revision", None) or 0
            return None, int(revision)
        if entry.value is None or entry.operation is not None:  # a delete or purge marker
            return None, int(entry.revision or 0)
        return load_record(self._where(scope, key), key, entry.value), int(entry.revision)

    async def _swap(self, scope: str, key: str, value: bytes | None, revision: int) -> bool:
        """Write (or delete, ``value=None``) the key if it is still at ``revision``."""
        name = self._kvkey(scope, key)
        try:
            if value is None:
                await self._kv.delete(name, last=revision)
            elif revision == 0:
                await self._kv.create(name, value)
            else:
                await self._kv.update(name, value, last=revision)
        except _RACE:
            return False
        return True

    # -- the contract ----------------------------------------------------------

    def claim(self, scope: str, key: str, owner: str, lease: float) -> Claim:
        check_claim_args(scope, key, owner, lease)

        async def run() -> Claim:
            while True:
                record, revision = await self._get(scope, key)
                answer, write = claim_step(record, key, owner, lease, time.time(), self.max_age)
                if write is None or await self._swap(scope, key, dump_record(write), revision):
                    return answer

        return self._call(run, "claim")

    def _finish(self, scope: str, key: str, owner: str, done: bool) -> bool:
        check_scope_key(scope, key)

        async def run() -> bool:
            while True:
                record, revision = await self._get(scope, key)
                held, write = finish_step(record, key, owner, done, time.time())
                value = None if write is None else dump_record(write)
                if not held or await self._swap(scope, key, value, revision):
                    return held

        return self._call(run, "complete" if done else "release")

    def complete(self, scope: str, key: str, owner: str) -> bool:
        return self._finish(scope, key, owner, True)

    def release(self, scope: str, key: str, owner: str) -> bool:
        return self._finish(scope, key, owner, False)

    def lookup(self, scope: str, key: str) -> Record | None:
        check_scope_key(scope, key)

        async def run() -> Record | None:
            return (await self._get(scope, key))[0]

        return live(self._call(run, "lookup"), time.time(), self.max_age)

    def forget(self, scope: str) -> int:
        prefix = f"{_digest(scope, 24)}."

        async def run() -> int:
            js = self._nc.jetstream(timeout=self._timeout)
            stream = f"KV_{self.bucket}"
            before = (await js.stream_info(stream)).state.messages
            await js.purge_stream(stream, subject=f"$KV.{self.bucket}.{prefix}>")
            return int(before - (await js.stream_info(stream)).state.messages)

        return self._call(run, "forget")

    def close(self) -> None:
        if self._closed:
            return

        async def shutdown() -> None:
            if self._nc is not None and not self._nc.is_closed:
                await self._nc.close()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(self._timeout)
        except Exception:  # closing: nothing more to do with a broken connection
            pass
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(self._timeout)
        if not self._loop.is_running():
            self._loop.close()
