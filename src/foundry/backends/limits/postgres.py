"""The PostgreSQL limits engine: the queue's database and schema
(``postgresql://…?schema=s&prefix=p_``), tables ``<prefix>limit_buckets`` and
``<prefix>limit_slots``. A call is one transaction that locks the scope's bucket row
(``FOR UPDATE``), so callers on every host take turns per scope and never block other
scopes; the bucket runs on the server's clock (``clock_timestamp()``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar
from urllib.parse import parse_qsl, urlsplit

from foundry.backends._sql_common import SESSION_SETTINGS, Postgres
from foundry.backends.limits._sql import DDL, SqlLimits, table_prefix
from foundry.config import safe_url
from foundry.errors import BackendError, ConfigError

__all__ = ["PostgresLimits"]

T = TypeVar("T")
_OWN = ("schema", "prefix", "pool")


class PostgresLimits(SqlLimits):
    placeholder: ClassVar[str] = "%s"
    lock_row: ClassVar[str] = " FOR UPDATE"

    def __init__(self, url: str) -> None:
        try:
            import psycopg
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ConfigError(
                f'limits URL {safe_url(url)!r} needs psycopg 3. Fix: pip install "foundry-exec[postgres]"'
            ) from exc
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        super().__init__(url, table_prefix(url, query))
        schema = query.get("schema", "public")
        if not schema.replace("_", "").isalnum():
            raise ConfigError(
                f"limits URL {safe_url(url)!r}: schema={schema!r} must be letters, digits and _"
            )
        rest = {k: v for k, v in query.items() if k not in _OWN}
        self._pg = Postgres(psycopg, f"limits {safe_url(url)}", parts, rest, schema, SESSION_SETTINGS)
        self._pool = self._pg.pool(4)
        self._schema = schema

        def create(cur: Any, now: float) -> None:
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"foundry-limits-{schema}",))
            cur.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            for statement in DDL:
                cur.execute(self._sql(statement))

        self._transaction(create)

    def _transaction(self, body: Callable[[Any, float], T]) -> T:
        try:
            with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
                cur.execute("SELECT extract(epoch from clock_timestamp())::float8")
                now = float(cur.fetchone()[0])
                return body(cur, now)
        except BackendError:
            raise
        except Exception as exc:
            mapped = self._pg.translate(exc)
            if mapped is None:
                raise
            raise mapped from exc

    def close(self) -> None:
        self._pool.close()
