"""Every event has a stable, unique id, even when its producer set none — and the
idempotency helper refuses an empty id instead of treating it as seen.

Before the fix a NATS message published without ``Nats-Msg-Id`` (and an entry with an
empty id on Redis or SQLite) got ``event.id == ""``: ``Idempotency.once`` applied the
first such event and silently skipped every other one as "already applied".
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from foundry.deliver.stream import Idempotency, StreamEvent
from foundry.errors import SubmitError
from tests.adversarial._streams import (
    MakeApp,
    engine_of,
    nats_publish,
    redis_xadd,
    sqlite_insert,
    unique,
)


def write_without_ids(url: str, stream: str, events: list[dict[str, Any]]) -> None:
    """Store ``events`` in partition 0 the way a producer that sets no id would."""
    engine = engine_of(url)
    if engine == "nats":
        nats_publish(url, stream, 0, [(json.dumps(e).encode(), None) for e in events])
    elif engine == "redis":
        # Foundry's fields, with an empty id: "<ts> <cum> 0 -", under the ids an automatic
        # XADD gives several entries in one millisecond (<ms>-0, <ms>-1, ...): they share an
        # offset, and must still not share an event id
        ms = int(time.time() * 1000)
        for seq, e in enumerate(events):
            redis_xadd(
                url, stream, 0, {"m": f"{time.time():.6f} 0 0 -", "d": json.dumps(e)}, id=f"{ms}-{seq}"
            )
    else:
        for e in events:
            sqlite_insert(url, stream, 0, {"id": "", "payload": json.dumps(e).encode()})


def test_events_without_a_producer_id_get_stable_unique_ids(
    make_stream_app: MakeApp, stream_url: str, tmp_path: Path
) -> None:
    app = make_stream_app(stream_url)
    s = app.stream(unique("noid"))
    done = Idempotency(tmp_path / "idem.db")
    applied: list[int] = []
    ids: list[str] = []

    @s.consumer(group="g")
    def apply(event: StreamEvent) -> None:
        ids.append(event.id)
        with done.once(event) as tx:
            if tx is not None:
                applied.append(event["n"])

    s.runtime.ensure_group("g")
    write_without_ids(stream_url, s.name, [{"n": n} for n in range(5)])
    s.publish({"n": 5})  # behind them (and on Redis numbered past them)
    s.drain(timeout=60)
    # Every event applied once: none was mistaken for another.
    assert applied == [0, 1, 2, 3, 4, 5]
    assert all(ids)
    assert len(set(ids)) == 6
    assert ids[0].startswith(f"{s.name}/0@")
    # The ids are stable: a replay sees the same ones, and applies nothing again.
    first = list(ids)
    ids.clear()
    s.replay("g", offset=1)
    s.drain(timeout=60)
    assert ids == first
    assert applied == [0, 1, 2, 3, 4, 5]
    done.close()


def test_the_idempotency_helper_refuses_an_empty_id(tmp_path: Path) -> None:
    done = Idempotency(tmp_path / "idem.db")
    nameless: Any = SimpleNamespace(group="g", id="")
    with pytest.raises(SubmitError, match="empty id"), done.once(nameless):
        pass
    with pytest.raises(SubmitError, match="empty id"):
        done.seen("g", "")
    # Nothing was recorded: a later event with a real id is applied.
    with done.once(SimpleNamespace(group="g", id="e1")) as tx:  # type: ignore[arg-type]
        assert tx is not None
    done.close()
