"""A consumer whose thread dies, for any reason, lets go of its partitions and says so.

Before the fix the worker thread could end (an exception it did not expect, a handler
calling ``sys.exit``) while the heartbeat thread went on renewing the consumer's
membership and leases: no other member ever took its partitions over, and nothing but
one log line told. Now the dead consumer leaves the group, its failure is logged,
counted and kept in ``Consumers.failures``, and ``foundry streams consume`` exits 1.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from foundry import Foundry
from foundry.deliver.stream import StreamEvent
from foundry.errors import BackendError
from foundry.observe import names
from tests.adversarial._streams import (
    MakeApp,
    unique,
    wait_until,
)


def test_a_dead_consumer_lets_another_take_its_partitions_over(
    make_stream_app: MakeApp, stream_url: str
) -> None:
    name = unique("death")
    options = {"group": "g", "ack_deadline": "1s", "session": "2s"}
    first, second = make_stream_app(stream_url), make_stream_app(stream_url)
    a, b = first.stream(name, key="k", partitions=2), second.stream(name, key="k", partitions=2)
    by_a: list[int] = []
    by_b: list[int] = []

    @a.consumer(**options)
    def dies_at_five(event: StreamEvent) -> None:
        if event["n"] == 5:
            sys.exit(3)  # ends the worker thread: not an Exception, never retried
        by_a.append(event["n"])

    b.consumer(**options)(lambda e: by_b.append(e["n"]))
    a.publish_many([{"k": f"k{n % 3}", "n": n} for n in range(20)])
    with a.run() as dying:
        wait_until("the first consumer's worker to end", lambda: not dying.alive)
        # A member that joins now gets every partition: the dead one let its leases go.
        b.drain(timeout=60)
        [(_, error)] = dying.failures
        assert isinstance(error, SystemExit)
        assert first.metrics.value(names.STREAM_CONSUMER_FAILURES, group="g") == 1
    # What the dead one handled was committed on its way out: each event once, 5 by b.
    assert sorted(by_a + by_b) == list(range(20))
    assert 5 in by_b
    assert all(p.lag == 0 and p.pending == 0 for p in b.lag("g"))


def test_drain_raises_when_every_consumer_died(make_stream_app: MakeApp, stream_url: str) -> None:
    app = make_stream_app(stream_url)
    s = app.stream(unique("drain"), key="k")

    @s.consumer(group="g")
    def fatal(event: StreamEvent) -> None:
        raise SystemExit(2)

    s.publish({"k": "a"})
    with pytest.raises(BackendError, match="every consumer died"):
        s.drain(timeout=60)


APP = """
import sys
from foundry import Foundry

app = Foundry("consume-death", home={home!r}, stream={url!r})
s = app.stream({stream!r}, key="k")

@s.consumer(group="g")
def handle(event):
    if event["n"] == 2:
        sys.exit(9)
    print("handled", event["n"], flush=True)
"""


def test_consume_exits_non_zero_when_a_consumer_dies(stream_url: str, tmp_path: Path) -> None:
    stream = unique("cli")
    source = tmp_path / "deathapp.py"
    source.write_text(textwrap.dedent(APP.format(home=str(tmp_path / "home"), url=stream_url, stream=stream)))
    producer = Foundry(unique("producer"), home=tmp_path / "home", stream=stream_url)
    producer.stream(stream, key="k").publish_many([{"k": "a", "n": n} for n in range(5)])
    producer.close()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "foundry.cli", "streams", "consume", str(source)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert done.returncode == 1, done.stdout + done.stderr
        assert "handled 0" in done.stdout
        assert "handled 1" in done.stdout
        assert "died" in done.stdout + done.stderr
        assert "SystemExit" in done.stdout + done.stderr
    finally:
        from foundry.backends.stream import open_stream_backend

        backend = open_stream_backend(stream_url)
        try:
            backend.delete_stream(stream)
        finally:
            backend.close()
