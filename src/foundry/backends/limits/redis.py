"""The Redis limits engine: the queue's Redis (``redis://host:6379/0?prefix=p``), keys
``<prefix>:limits:…``: a hash per bucket (tokens, time), a sorted set of slot holders
by lease deadline per scope. Every call is one Lua script (``redis_lua/limits.lua``, beside this
module), atomic on the server and timed by Redis's ``TIME``; idle scopes' keys expire."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from foundry.backends._lua import lua_scripts
from foundry.backends._urls import REDIS_PASSED, REDIS_TLS, tls_options
from foundry.backends.limits.base import SLOT_POLL, Limit, Verdict, check_limit
from foundry.config import safe_url
from foundry.errors import BackendError, BackendUnavailableError, ConfigError

__all__ = ["RedisLimits"]

SCRIPT = lua_scripts("foundry.backends.limits", "redis_lua")["limits"]


class RedisLimits:
    def __init__(self, url: str) -> None:
        import redis

        self._redis = redis
        self._url = url
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        prefix = query.get("prefix", "foundry")
        if not prefix or any(c.isspace() for c in prefix) or len(prefix) > 100:
            raise ConfigError(f"limits URL {safe_url(url)!r}: prefix={prefix!r} must be 1-100 characters")
        self.prefix = f"{prefix}:limits:"
        passed = {k: v for k, v in query.items() if k in REDIS_PASSED} | tls_options(
            "queue", url, query, REDIS_TLS
        )
        passed.setdefault("socket_timeout", "10")
        passed.setdefault("socket_connect_timeout", passed["socket_timeout"])  # redis-py 8: 5 s otherwise
        try:
            self.client = redis.Redis.from_url(urlunsplit(parts._replace(query=urlencode(passed))))
        except ValueError as exc:
            raise ConfigError(f"limits URL {safe_url(url)!r}: {exc}. Fix: correct the URL") from exc
        self._script = self.client.register_script(SCRIPT)

    @property
    def url(self) -> str:
        return safe_url(self._url)

    def __repr__(self) -> str:
        return f"<RedisLimits {self.url}>"

    def _keys(self, unit: str, key: str) -> tuple[str, str]:
        base = f"{self.prefix}{len(unit)}:{unit}:{key}"
        return base + ":b", base + ":s"

    def _run(self, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return self._script(keys=list(keys), args=list(args))
        except (self._redis.ConnectionError, self._redis.TimeoutError) as exc:
            raise BackendUnavailableError(
                f"limits {self.url}: Redis is unreachable ({exc}). Fix: usually transient; callers retry"
            ) from exc
        except self._redis.RedisError as exc:
            raise BackendError(f"limits {self.url}: Redis failed ({exc})") from exc

    def acquire(self, limit: Limit, key: str, holder: str, *, lease: float) -> Verdict:
        check_limit(limit, key, holder, lease)
        reply = self._run(
            self._keys(limit.unit, key),
            [
                "acquire",
                repr(limit.rate or 0.0),
                str(limit.burst or 0),
                str(limit.slots or 0),
                holder,
                repr(float(lease)),
                repr(SLOT_POLL),
            ],
        )
        if int(reply[0]) == 1:
            return Verdict(True)
        return Verdict(
            False, float(reply[1]), reply[2].decode() if isinstance(reply[2], bytes) else str(reply[2])
        )

    def renew(self, held: Sequence[tuple[str, str, str]], *, lease: float) -> int:
        if not held:
            return 0
        keys = [self._keys(unit, key)[1] for unit, key, _ in held]
        return int(self._run(keys, ["renew", repr(float(lease)), *(h for _, _, h in held)]))

    def release(self, unit: str, key: str, holder: str) -> bool:
        return bool(int(self._run([self._keys(unit, key)[1]], ["release", holder])))

    def in_use(self, unit: str, key: str) -> int:
        return int(self._run([self._keys(unit, key)[1]], ["in_use"]))

    def tokens(self, unit: str, key: str, limit: Limit) -> float:
        if limit.rate is None:
            return float(limit.burst or 0)
        return float(
            self._run([self._keys(unit, key)[0]], ["tokens", repr(limit.rate), str(limit.burst or 0)])
        )

    def destroy(self) -> None:
        """Delete every key of this prefix (tests)."""
        for name in self.client.scan_iter(match=self.prefix + "*", count=500):
            self.client.delete(name)

    def close(self) -> None:
        self.client.close()
