"""Streams: groups, partitions, their owners and lag, dead letters; replay a group
from an offset, a time, the beginning or the end (``StreamBackend.seek``, as
``foundry streams replay`` does).

Owners come from the fleet: a consumer process's heartbeat lists the partitions it
owns (the stream engines keep leases but offer no call to list them). A partition
whose owner stopped reporting shows that owner as down until another consumer takes
the lease over.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from foundry.observe.dashboard.jobs import ActionRefused, error_record

__all__ = ["dead_letters", "list_streams", "replay"]

MAX_STREAMS = 50


def owners_from_fleet(members: Sequence[dict[str, Any]]) -> dict[tuple[str, str, int], list[dict[str, Any]]]:
    """(stream, group, partition) -> the consumers that claim it, with their liveness."""
    out: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for m in members:
        for held in m.get("details", {}).get("streams", []) or []:
            if not isinstance(held, dict):
                continue
            for p in held.get("owned", []) or []:
                if isinstance(p, int) and not isinstance(p, bool):
                    key = (str(held.get("stream")), str(held.get("group")), p)
                    out.setdefault(key, []).append(
                        {
                            "consumer": str(held.get("consumer", "?")),
                            "member": m["id"],
                            "host": m["host"],
                            "pid": m["pid"],
                            "state": m["state"],
                        }
                    )
    return out


def list_streams(backend: Any, members: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    owners = owners_from_fleet(members)
    streams = []
    for name in backend.streams()[:MAX_STREAMS]:
        info = backend.info(name)
        groups = []
        for group in info.groups:
            parts = []
            for p in backend.lag(name, group):
                parts.append(
                    {
                        "partition": p.partition,
                        "committed": p.committed,
                        "end": p.end,
                        "first": p.first,
                        "pending": p.pending,
                        "lag": p.lag,
                        "behind_retention": p.committed < p.first - 1,
                        "owners": owners.get((name, group, p.partition), []),
                    }
                )
            groups.append({"group": group, "lag": sum(p["lag"] for p in parts), "partitions": parts})
        c = info.config
        streams.append(
            {
                "stream": name,
                "partitions": c.partitions,
                "events": info.events,
                "first": list(info.first),
                "last": list(info.last),
                "retention": {"max_age": c.max_age, "max_events": c.max_events, "max_bytes": c.max_bytes},
                "groups": groups,
            }
        )
    return {"streams": streams}


def dead_letters(backend: Any, stream: str, group: str | None, limit: int = 50) -> dict[str, Any]:
    letters = backend.dead_letters(stream, group, max(1, min(int(limit), 200)))
    out = []
    for d in letters:
        payload = None if d.payload is None else d.payload[:4000].decode("utf-8", errors="replace")
        out.append(
            {
                "group": d.group,
                "partition": d.partition,
                "offset": d.offset,
                "last_offset": d.last_offset,
                "id": d.id,
                "key": d.key,
                "reason": d.reason,
                "deliveries": d.deliveries,
                "dead_at": d.dead_at,
                "payload": payload,
                "error": error_record(d.error),
            }
        )
    return {"dead": out}


def replay(backend: Any, stream: str, group: str, body: dict[str, Any]) -> dict[str, Any]:
    """Move ``group`` to ``{"offset": N}``, ``{"time": unix}``, ``{"ago": seconds}``,
    ``{"beginning": true}`` or ``{"end": true}``, optionally ``{"partitions": [..]}``."""
    from foundry.backends.stream import Start
    from foundry.errors import NotFoundError

    partitions = body.get("partitions")
    if partitions is not None and (
        not isinstance(partitions, list)
        or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions)
    ):
        raise ActionRefused("partitions must be a list of partition numbers (0, 1, ...), or absent for all")
    if "offset" in body:
        offset = body["offset"]
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ActionRefused(
                f"offset={offset!r} is not an offset. Fix: an integer >= 0 (1 is the first event)"
            )
        start = Start.at(offset)
    elif "time" in body or "ago" in body:
        when = body.get("time")
        if "ago" in body:
            ago = body["ago"]
            if isinstance(ago, bool) or not isinstance(ago, int | float) or ago < 0:
                raise ActionRefused(f"ago={ago!r} is not a number of seconds")
            when = time.time() - float(ago)
        if isinstance(when, bool) or not isinstance(when, int | float):
            raise ActionRefused(f"time={when!r} is not a unix time in seconds")
        start = Start.since(float(when))
    elif body.get("beginning"):
        start = Start.beginning()
    elif body.get("end"):
        start = Start.end()
    else:
        raise ActionRefused("say where to replay from: offset, time, ago, beginning or end")
    try:
        before = {p.partition: p.committed for p in backend.lag(stream, group)}
        backend.seek(stream, group, start, partitions)
        after = backend.lag(stream, group)
    except NotFoundError as exc:
        raise ActionRefused(str(exc)) from exc
    moved = [p for p in after if partitions is None or p.partition in partitions]
    lines = [
        f"p{p.partition}: {before.get(p.partition, '?')} → {p.committed} ({p.lag} to deliver)" for p in moved
    ]
    return {
        "ok": True,
        "message": f"{stream}/{group} moved to {start.describe()}: " + "; ".join(lines),
        "partitions": [{"partition": p.partition, "committed": p.committed, "lag": p.lag} for p in moved],
    }
