"""What the SQL engines of the limits family share: the two tables and the acquire,
renew and release logic, written once over portable SQL (qmark placeholders, rewritten
for psycopg). Each engine supplies :meth:`SqlLimits._transaction`: one transaction that
serialises every caller of a scope, and the engine's clock."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

from foundry.backends.limits.base import SLOT_POLL, Limit, Verdict, check_limit
from foundry.config import safe_url
from foundry.errors import ConfigError

T = TypeVar("T")

DDL = (
    "CREATE TABLE IF NOT EXISTS {buckets} (unit TEXT NOT NULL, key TEXT NOT NULL, "
    "tokens DOUBLE PRECISION NOT NULL, at DOUBLE PRECISION NOT NULL, PRIMARY KEY (unit, key))",
    "CREATE TABLE IF NOT EXISTS {slots} (unit TEXT NOT NULL, key TEXT NOT NULL, holder TEXT NOT NULL, "
    "until DOUBLE PRECISION NOT NULL, PRIMARY KEY (unit, key, holder))",
)


def table_prefix(url: str, query: dict[str, str]) -> str:
    """The tables' prefix: the queue URL's ``prefix=`` (default ``foundry_``) + ``limit_``."""
    prefix = query.get("prefix", "foundry_")
    if not prefix.replace("_", "").isalnum() or not (prefix[0].isalpha() or prefix[0] == "_"):
        raise ConfigError(
            f"limits URL {safe_url(url)!r}: prefix={prefix!r} must be letters, digits and _. "
            "Fix: ?prefix=myapp_"
        )
    return prefix + "limit_"


class SqlLimits:
    """Acquire, renew and release over ``{buckets}`` and ``{slots}`` (see ``base``)."""

    placeholder: ClassVar[str] = "?"
    lock_row: ClassVar[str] = ""  # " FOR UPDATE" where rows are locked for the transaction

    def __init__(self, url: str, prefix: str) -> None:
        self._url = url
        self._names = {"{buckets}": prefix + "buckets", "{slots}": prefix + "slots"}

    @property
    def url(self) -> str:
        return safe_url(self._url)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"

    def _sql(self, sql: str) -> str:
        for name, value in self._names.items():
            sql = sql.replace(name, value)
        return sql.replace("?", self.placeholder) if self.placeholder != "?" else sql

    def _transaction(self, body: Callable[[Any, float], T]) -> T:
        """Run ``body(cursor, now)`` in one transaction that no other caller of the same
        scope interleaves with; ``now`` is the engine's clock (unix seconds)."""
        raise NotImplementedError

    def _exec(self, cur: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        cur.execute(self._sql(sql), tuple(params))
        return cur

    def acquire(self, limit: Limit, key: str, holder: str, *, lease: float) -> Verdict:
        check_limit(limit, key, holder, lease)
        scope = (limit.unit, key)

        def body(cur: Any, now: float) -> Verdict:
            # The bucket row is the scope's lock (PostgreSQL: FOR UPDATE), bucket or not.
            self._exec(
                cur,
                "INSERT INTO {buckets} (unit, key, tokens, at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (unit, key) DO NOTHING",
                (*scope, float(limit.burst or 0), now),
            )
            row = self._exec(
                cur, "SELECT tokens, at FROM {buckets} WHERE unit = ? AND key = ?" + self.lock_row, scope
            ).fetchone()
            if limit.slots is not None:
                self._exec(
                    cur, "DELETE FROM {slots} WHERE unit = ? AND key = ? AND until <= ?", (*scope, now)
                )
                if self._exec(
                    cur,
                    "UPDATE {slots} SET until = ? WHERE unit = ? AND key = ? AND holder = ?",
                    (now + lease, *scope, holder),
                ).rowcount:
                    return Verdict(True)  # it holds the slot already: renewed, no token taken
                held = self._exec(
                    cur, "SELECT count(*) FROM {slots} WHERE unit = ? AND key = ?", scope
                ).fetchone()[0]
                if int(held) >= limit.slots:
                    return Verdict(False, SLOT_POLL, "max_concurrency")
            if limit.rate is not None and limit.burst is not None:
                tokens = min(float(limit.burst), float(row[0]) + max(0.0, now - float(row[1])) * limit.rate)
                if tokens < 1.0:
                    return Verdict(False, (1.0 - tokens) / limit.rate, "rate_limit")
                self._exec(
                    cur,
                    "UPDATE {buckets} SET tokens = ?, at = ? WHERE unit = ? AND key = ?",
                    (tokens - 1.0, now, *scope),
                )
            if limit.slots is not None:
                self._exec(
                    cur,
                    "INSERT INTO {slots} (unit, key, holder, until) VALUES (?, ?, ?, ?)",
                    (*scope, holder, now + lease),
                )
            return Verdict(True)

        return self._transaction(body)

    def renew(self, held: Sequence[tuple[str, str, str]], *, lease: float) -> int:
        if not held:
            return 0

        def body(cur: Any, now: float) -> int:
            return sum(
                self._exec(
                    cur,
                    "UPDATE {slots} SET until = ? WHERE unit = ? AND key = ? AND holder = ? AND until > ?",
                    (now + lease, unit, key, holder, now),
                ).rowcount
                for unit, key, holder in held
            )

        return self._transaction(body)

    def release(self, unit: str, key: str, holder: str) -> bool:
        def body(cur: Any, now: float) -> bool:
            return bool(
                self._exec(
                    cur,
                    "DELETE FROM {slots} WHERE unit = ? AND key = ? AND holder = ? AND until > ?",
                    (unit, key, holder, now),
                ).rowcount
            )

        return self._transaction(body)

    def in_use(self, unit: str, key: str) -> int:
        def body(cur: Any, now: float) -> int:
            row = self._exec(
                cur, "SELECT count(*) FROM {slots} WHERE unit = ? AND key = ? AND until > ?", (unit, key, now)
            ).fetchone()
            return int(row[0])

        return self._transaction(body)

    def tokens(self, unit: str, key: str, limit: Limit) -> float:
        def body(cur: Any, now: float) -> float:
            row = self._exec(
                cur, "SELECT tokens, at FROM {buckets} WHERE unit = ? AND key = ?", (unit, key)
            ).fetchone()
            burst = float(limit.burst or 0)
            if row is None or limit.rate is None:
                return burst
            return min(burst, float(row[0]) + max(0.0, now - float(row[1])) * limit.rate)

        return self._transaction(body)
