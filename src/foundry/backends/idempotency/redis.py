"""Redis: one string key per record, ``{<prefix>:idem:<scope>}:<key>``, holding the
record's JSON, with a TTL of ``max_age`` (Redis forgets old records by itself).

URL: ``redis://host:6379/0`` (``rediss://`` for TLS, the options of
``foundry.backends._urls``) with ``prefix=`` (default ``foundry``; a stream's own URL
keeps the stream's prefix). A claim is an optimistic transaction (``WATCH`` the key,
read it, decide, ``MULTI``/``SET``/``EXEC``; retried when another client changed the key
in between), so two hosts claiming the same key cannot both win. The scope is the hash
tag: one scope's records stay on one Redis Cluster slot.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
import redis.exceptions

from foundry.backends._urls import REDIS_PASSED, REDIS_TLS, ShowsUrl, refused_certificate, tls_options
from foundry.backends.idempotency.base import (
    DEFAULT_MAX_AGE,
    DEFAULT_MAX_RECORDS,
    Claim,
    HostileRecordError,
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

__all__ = ["RedisIdempotencyStore"]

T = TypeVar("T")


def _glob(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


class RedisIdempotencyStore(ShowsUrl):
    """Idempotency records in Redis (see the module docstring)."""

    transactional: ClassVar[bool] = False

    def __init__(
        self, url: str, *, max_age: float = DEFAULT_MAX_AGE, max_records: int = DEFAULT_MAX_RECORDS
    ) -> None:
        check_limits("Redis store", max_age, max_records)
        self._url = url
        self.max_age = float(max_age)
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        unknown = sorted(k for k in query if k not in ("prefix", *REDIS_PASSED, *REDIS_TLS))
        if unknown:
            raise ConfigError(
                f"idempotency URL {safe_url(url)!r}: unknown option(s) {', '.join(unknown)}. "
                f"Fix: use only {', '.join(('prefix', *REDIS_PASSED, *REDIS_TLS))}"
            )
        tls_options("idempotency", url, query, REDIS_TLS)
        self.prefix = query.pop("prefix", "foundry")
        if not self.prefix or "{" in self.prefix or "}" in self.prefix:
            raise ConfigError(
                f"idempotency URL {safe_url(url)!r}: prefix={self.prefix!r}. Fix: a non-empty prefix "
                "without braces"
            )
        try:
            self._r = redis.Redis.from_url(
                urlunsplit(parts._replace(query=urlencode(query))),
                socket_connect_timeout=5,
                socket_timeout=30,
            )
        except ValueError as exc:
            raise ConfigError(f"idempotency URL {safe_url(url)!r} is not a Redis URL ({exc})") from exc

    def _key(self, scope: str, key: str) -> str:
        return f"{{{self.prefix}:idem:{scope}}}:{key}"

    def _where(self, scope: str, key: str) -> str:
        return f"{scope!r}/{key!r} (Redis key {self._key(scope, key)!r} at {self.url})"

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            refused = refused_certificate(exc, "idempotency", self._url, "ssl_ca_certs")
            if refused is not None:
                raise refused from exc
            raise BackendUnavailableError(f"Redis at {self.url}: {what} failed: {exc}. Fix: retry") from exc
        except redis.exceptions.RedisError as exc:
            raise BackendError(f"Redis at {self.url}: {what} failed: {exc}") from exc

    def _read(self, pipe: Any, scope: str, key: str) -> Record | None:
        try:
            raw = pipe.get(self._key(scope, key))
        except redis.exceptions.ResponseError as exc:  # WRONGTYPE: a hash, a list… someone else's
            raise HostileRecordError(
                f"idempotency record {self._where(scope, key)} was not written by Foundry: {exc}. It is "
                "neither trusted nor overwritten. Fix: delete the key (or the tool writing into it)"
            ) from exc
        return None if raw is None else load_record(self._where(scope, key), key, raw)

    def _cas(self, scope: str, key: str, what: str, step: Callable[[Any, Record | None], T]) -> T:
        """Run ``step(pipe, record)`` under ``WATCH`` of the key until no one changed it."""
        name = self._key(scope, key)
        with self._errors(what), self._r.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(name)  # type: ignore[no-untyped-call]
                    return step(pipe, self._read(pipe, scope, key))
                except redis.exceptions.WatchError:
                    continue
                finally:
                    pipe.reset()

    def _put(self, pipe: Any, scope: str, record: Record, ttl: float) -> None:
        pipe.multi()
        pipe.set(self._key(scope, record.key), dump_record(record), px=max(1, int(ttl * 1000)))
        pipe.execute()

    def claim(self, scope: str, key: str, owner: str, lease: float) -> Claim:
        check_claim_args(scope, key, owner, lease)

        def step(pipe: Any, record: Record | None) -> Claim:
            answer, write = claim_step(record, key, owner, lease, time.time(), self.max_age)
            if write is not None:
                self._put(pipe, scope, write, max(lease, self.max_age))
            return answer

        return self._cas(scope, key, "claim", step)

    def _finish(self, scope: str, key: str, owner: str, done: bool) -> bool:
        check_scope_key(scope, key)

        def step(pipe: Any, record: Record | None) -> bool:
            held, write = finish_step(record, key, owner, done, time.time())
            if held and write is not None:
                self._put(pipe, scope, write, self.max_age)
            elif held:
                pipe.multi()
                pipe.delete(self._key(scope, key))
                pipe.execute()
            return held

        return self._cas(scope, key, "complete" if done else "release", step)

    def complete(self, scope: str, key: str, owner: str) -> bool:
        return self._finish(scope, key, owner, True)

    def release(self, scope: str, key: str, owner: str) -> bool:
        return self._finish(scope, key, owner, False)

    def lookup(self, scope: str, key: str) -> Record | None:
        check_scope_key(scope, key)
        with self._errors("lookup"):
            return live(self._read(self._r, scope, key), time.time(), self.max_age)

    def forget(self, scope: str) -> int:
        pattern = _glob(self._key(scope, "")) + "*"
        dropped = 0
        with self._errors("forget"):
            batch: list[Any] = []
            for name in self._r.scan_iter(match=pattern, count=500):
                batch.append(name)
                if len(batch) >= 500:
                    dropped += int(self._r.delete(*batch))
                    batch.clear()
            if batch:
                dropped += int(self._r.delete(*batch))
        return dropped

    def close(self) -> None:
        with contextlib.suppress(redis.exceptions.RedisError):
            self._r.close()
