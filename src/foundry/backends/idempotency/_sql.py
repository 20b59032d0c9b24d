"""What the SQL idempotency engines (SQLite, PostgreSQL) share: one table, the claim
written as an insert-if-absent then a compare-and-set update in one transaction, and the
purge that bounds the table by age and count. The engines hand in their transaction and
placeholder; nothing here imports a driver.

Table ``foundry_handled``: ``grp`` (the scope), ``id`` (the key), ``at``, ``state``,
``owner``, ``until`` — the first three are the columns of the older ``Idempotency``
helper's table, whose rows read as done records.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

from foundry.backends._urls import ShowsUrl
from foundry.backends.idempotency.base import (
    DEFAULT_MAX_AGE,
    DEFAULT_MAX_RECORDS,
    PURGE_EVERY,
    Claim,
    Record,
    check_claim_args,
    check_limits,
    check_scope_key,
    claim_step,
    live,
    record_from_fields,
)

COLUMNS = (
    ("state", "TEXT NOT NULL DEFAULT 'done'"),
    ("owner", "TEXT NOT NULL DEFAULT ''"),
    ("until", "REAL NOT NULL DEFAULT 0"),
)
_SELECT = "SELECT id, state, owner, until, at FROM foundry_handled WHERE grp=? AND id=?"
_INSERT = (
    "INSERT INTO foundry_handled (grp, id, at, state, owner, until) VALUES (?,?,?,'running',?,?) "
    "ON CONFLICT DO NOTHING"
)
_TAKE = "UPDATE foundry_handled SET at=?, state='running', owner=?, until=? WHERE grp=? AND id=?"
_COMPLETE = (
    "UPDATE foundry_handled SET at=?, state='done', owner='', until=0 "
    "WHERE grp=? AND id=? AND state='running' AND owner=?"
)
_RELEASE = "DELETE FROM foundry_handled WHERE grp=? AND id=? AND state='running' AND owner=?"
_EXPIRED = "DELETE FROM foundry_handled WHERE (state='done' AND at < ?) OR (state='running' AND until < ?)"
_OVER = (
    "DELETE FROM foundry_handled WHERE grp=? AND state='done' AND id IN (SELECT id FROM foundry_handled "
    "WHERE grp=? AND state='done' ORDER BY at DESC LIMIT ? OFFSET ?)"
)
_SCOPES = "SELECT grp FROM foundry_handled GROUP BY grp HAVING count(*) > ?"


class SqlIdempotencyStore(ShowsUrl):
    """The claim protocol on one SQL table; engines give :meth:`_tx` and ``placeholder``."""

    transactional: ClassVar[bool] = False
    placeholder: ClassVar[str] = "?"
    engine: ClassVar[str] = "SQL"

    def __init__(self, url: str, *, max_age: float, max_records: int) -> None:
        check_limits(f"{self.engine} store", max_age, max_records)
        self._url = url
        self.max_age = float(max_age)
        self.max_records = max_records
        self._claims = 0
        self._count_lock = threading.Lock()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[Any]:  # pragma: no cover - every engine overrides it
        """A cursor inside one write transaction (committed on exit, rolled back on error)."""
        raise NotImplementedError(f"{type(self).__name__} gives no transaction")

    def _q(self, sql: str) -> str:
        return sql if self.placeholder == "?" else sql.replace("?", self.placeholder)

    def _where(self, scope: str, key: str) -> str:
        return f"{scope!r}/{key!r} in the {self.engine} store {self.url}"

    def _record(self, cur: Any, scope: str, key: str, *, lock: bool = False) -> Record | None:
        cur.execute(self._q(_SELECT + (" FOR UPDATE" if lock else "")), (scope, key))
        row = cur.fetchone()
        if row is None:
            return None
        return record_from_fields(self._where(scope, key), key, *row)

    def claim(self, scope: str, key: str, owner: str, lease: float) -> Claim:
        check_claim_args(scope, key, owner, lease)
        now = time.time()
        with self._tx() as cur:
            cur.execute(self._q(_INSERT), (scope, key, now, owner, now + lease))
            if cur.rowcount == 1:
                answer = Claim("claimed")
            else:
                record = self._record(cur, scope, key, lock=self.placeholder != "?")
                answer, write = claim_step(record, key, owner, lease, now, self.max_age)
                if write is None:
                    return answer
                cur.execute(self._q(_TAKE), (write.at, owner, write.until, scope, key))
        self._maybe_purge()
        return answer

    def complete(self, scope: str, key: str, owner: str) -> bool:
        check_scope_key(scope, key)
        with self._tx() as cur:
            cur.execute(self._q(_COMPLETE), (time.time(), scope, key, owner))
            return bool(cur.rowcount == 1)

    def release(self, scope: str, key: str, owner: str) -> bool:
        check_scope_key(scope, key)
        with self._tx() as cur:
            cur.execute(self._q(_RELEASE), (scope, key, owner))
            return bool(cur.rowcount == 1)

    def lookup(self, scope: str, key: str) -> Record | None:
        check_scope_key(scope, key)
        with self._tx() as cur:
            record = self._record(cur, scope, key)
        return live(record, time.time(), self.max_age)

    def forget(self, scope: str) -> int:
        with self._tx() as cur:
            cur.execute(self._q("DELETE FROM foundry_handled WHERE grp=?"), (scope,))
            return int(cur.rowcount)

    def _maybe_purge(self) -> None:
        with self._count_lock:
            self._claims += 1
            due = self._claims % PURGE_EVERY == 0
        if due:
            self.purge()

    def purge(self) -> int:
        """Drop expired records and, per scope, the oldest done records over ``max_records``."""
        now = time.time()
        with self._tx() as cur:
            cur.execute(self._q(_EXPIRED), (now - self.max_age, now - self.max_age))
            dropped = int(cur.rowcount)
            cur.execute(self._q(_SCOPES), (self.max_records,))
            for (scope,) in cur.fetchall():
                cur.execute(self._q(_OVER), (scope, scope, 1 << 62, self.max_records))
                dropped += int(cur.rowcount)
        return dropped


__all__ = ["COLUMNS", "DEFAULT_MAX_AGE", "DEFAULT_MAX_RECORDS", "SqlIdempotencyStore"]
