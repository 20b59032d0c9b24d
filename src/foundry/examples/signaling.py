"""The seed's signaling example (seed 000 §2.2, "Relay"): connection requests, ICE
candidate exchanges and disconnects flow through an ordered stream keyed by session id,
and three services consume every event independently — logging, analytics and billing.

Per-key order is what makes billing right: a session is billed from its ``connect`` to
its ``disconnect``, so those must be seen in that order (they share the session's
partition). Billing is idempotent by construction: it records each handled event id in
the same SQLite transaction as its effect (:class:`~foundry.deliver.stream.Idempotency`),
so a redelivered event changes nothing, and a replay from the start (after
``BILLING.reset()``) gives the same totals::

    from foundry.examples.signaling import signaling, sessions, BILLING
    signaling.publish_many(sessions(20), ids=...)     # or signaling.publish(event, id=...)
    signaling.drain()                                 # run the three groups until caught up
    BILLING.totals()

    foundry streams list foundry.examples.signaling
    foundry streams consume foundry.examples.signaling --group billing
"""

from __future__ import annotations

import collections
import random
import threading
from pathlib import Path
from typing import Any

from foundry import Foundry
from foundry.deliver.stream import Idempotency, StreamEvent
from foundry.stream_decl import StreamDecl

__all__ = [
    "ANALYTICS",
    "BILLING",
    "LOG",
    "Analytics",
    "Billing",
    "app",
    "sessions",
    "signaling",
]

CENTS_PER_MINUTE = 2

app = Foundry("signaling")

signaling: StreamDecl = app.stream(
    "signaling",
    key="session_id",
    partitions=4,
    retention="7d",
    consumers=3,
    rate="2000/s",
    est="2ms",
    bound="io",
)
"""Connection requests, ICE candidates, disconnects: logged, analysed and billed."""


def sessions(count: int, *, seed: int = 7, start: float = 1_700_000_000.0) -> list[dict[str, Any]]:
    """``count`` signaling sessions as events in time order (sessions interleave): each is
    a connect, 2–6 ICE candidates, and a disconnect. Every event carries its own ``id``."""
    rng = random.Random(seed)
    timeline: list[tuple[float, int, dict[str, Any]]] = []
    for n in range(count):
        session, user = f"s-{n:04d}", f"user-{rng.randrange(1, 6)}"
        t = start + rng.uniform(0, 600)
        steps: list[dict[str, Any]] = [{"type": "connect", "peer": f"peer-{rng.randrange(100)}"}]
        for c in range(rng.randrange(2, 7)):
            steps.append({"type": "ice", "candidate": f"candidate:{c} udp {rng.randrange(1, 1 << 30)}"})
        steps.append({"type": "disconnect", "reason": rng.choice(["hangup", "timeout", "network"])})
        for i, step in enumerate(steps):
            t += rng.uniform(0.05, 2.0) if step["type"] == "ice" else rng.uniform(30, 900) * (i > 0)
            event = {"id": f"{session}-{i}", "session_id": session, "user": user, "at": round(t, 3), **step}
            timeline.append((t, len(timeline), event))
    return [event for _, _, event in sorted(timeline)]


# -- logging ---------------------------------------------------------------------

LOG: list[str] = []
_log_lock = threading.Lock()


@signaling.consumer(group="logging", batch=200)
def log_event(event: StreamEvent) -> None:
    """Audit log: one line per event (a list here; a file or a log service in real life)."""
    line = f"{event['at']:.3f} {event['session_id']} {event['type']}"
    with _log_lock:
        LOG.append(line)


# -- analytics -------------------------------------------------------------------


class Analytics:
    """Events per type, ICE candidates per session, and sessions still open."""

    def __init__(self) -> None:
        self.by_type: collections.Counter[str] = collections.Counter()
        self.candidates: collections.Counter[str] = collections.Counter()
        self.open: set[str] = set()
        self.seen: set[str] = set()
        self._lock = threading.Lock()

    def handle(self, event: StreamEvent) -> None:
        with self._lock:
            if event.id in self.seen:  # a redelivery: counted already
                return
            self.seen.add(event.id)
            kind, session = event["type"], event["session_id"]
            self.by_type[kind] += 1
            if kind == "connect":
                self.open.add(session)
            elif kind == "ice":
                self.candidates[session] += 1
            elif kind == "disconnect":
                self.open.discard(session)

    def reset(self) -> None:
        with self._lock:
            self.__init__()  # type: ignore[misc]


ANALYTICS = Analytics()


@signaling.consumer(group="analytics", batch=200)
def analyse(event: StreamEvent) -> None:
    ANALYTICS.handle(event)


# -- billing ---------------------------------------------------------------------


class Billing:
    """Connected time per user, billed per started minute, kept in SQLite.

    Each event is applied in one transaction together with the record of its id, so a
    duplicate delivery is a no-op and a crash leaves either both or neither."""

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._idem: Idempotency | None = None
        self._lock = threading.Lock()

    @property
    def idem(self) -> Idempotency:
        with self._lock:
            if self._idem is None:
                path = self._path or app.settings.home / "signaling-billing.db"
                self._idem = Idempotency(path)
                with self._idem.transaction() as tx:
                    tx.execute(
                        "CREATE TABLE IF NOT EXISTS open_sessions (session_id TEXT PRIMARY KEY, "
                        "user TEXT NOT NULL, since REAL NOT NULL)"
                    )
                    tx.execute(
                        "CREATE TABLE IF NOT EXISTS billed (user TEXT PRIMARY KEY, "
                        "sessions INTEGER NOT NULL, seconds REAL NOT NULL, cents INTEGER NOT NULL)"
                    )
            return self._idem

    def handle(self, event: StreamEvent) -> None:
        with self.idem.once(event) as tx:
            if tx is None:
                return  # already applied (redelivery)
            if event["type"] == "connect":
                tx.execute(
                    "INSERT OR REPLACE INTO open_sessions VALUES (?,?,?)",
                    (event["session_id"], event["user"], event["at"]),
                )
            elif event["type"] == "disconnect":
                row = tx.execute(
                    "DELETE FROM open_sessions WHERE session_id=? RETURNING user, since",
                    (event["session_id"],),
                ).fetchone()
                if row is None:
                    # Only possible if order were broken: a disconnect before its connect.
                    raise RuntimeError(f"disconnect of {event['session_id']} before its connect")
                seconds = max(0.0, float(event["at"]) - float(row[1]))
                cents = -(-int(seconds) // 60) * CENTS_PER_MINUTE
                tx.execute(
                    "INSERT INTO billed VALUES (?,1,?,?) ON CONFLICT(user) DO UPDATE SET "
                    "sessions=sessions+1, seconds=seconds+excluded.seconds, cents=cents+excluded.cents",
                    (row[0], seconds, cents),
                )

    def totals(self) -> dict[str, tuple[int, float, int]]:
        """user -> (sessions, seconds, cents)."""
        with self.idem.transaction() as tx:
            rows = tx.execute("SELECT user, sessions, seconds, cents FROM billed ORDER BY user").fetchall()
        return {r[0]: (int(r[1]), round(float(r[2]), 3), int(r[3])) for r in rows}

    def reset(self) -> None:
        """Forget everything billed (before a replay from the start)."""
        with self.idem.transaction() as tx:
            tx.execute("DELETE FROM open_sessions")
            tx.execute("DELETE FROM billed")
        self.idem.forget("billing")

    def close(self) -> None:
        with self._lock:
            if self._idem is not None:
                self._idem.close()
                self._idem = None


BILLING = Billing()


@signaling.consumer(group="billing", batch=100, max_deliveries=5)
def bill(event: StreamEvent) -> None:
    BILLING.handle(event)
