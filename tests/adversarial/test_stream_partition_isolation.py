"""One failing event holds back only its own partition, on every engine.

Before the fix a consumer slept out a failing event's back-off inside its one loop over
all its partitions: with four partitions on one consumer, one event that kept raising
held 39 of 40 good events until it was dead-lettered. Now its partition pauses (the
events behind it wait, per-key order holds) while the consumer serves the others.
Counted, not timed: when the poison's last attempt runs, every good event of the other
partitions has been handled already.
"""

from __future__ import annotations

import threading

from foundry.deliver.stream import StreamEvent
from foundry.observe import names
from tests.adversarial._streams import (
    MakeApp,
    key_in,
    unique,
)


def test_a_poison_event_does_not_stall_the_other_partitions(
    make_stream_app: MakeApp, stream_url: str
) -> None:
    app = make_stream_app(stream_url)
    s = app.stream(unique("isolate"), key="k", partitions=4)
    poison_key = key_in(0, 4, "poison")  # partition 0: served first, before the fix it held all
    behind_key = key_in(0, 4, "behind")  # another key of the poison's partition
    good_keys = [key_in(p, 4, f"good{p}") for p in (1, 2, 3)]
    lock = threading.Lock()
    handled: list[tuple[str, int]] = []
    good_before_last_attempt: list[int] = []

    @s.consumer(group="g", max_deliveries=5, retry_backoff="500ms", ack_deadline="5s")
    def handle(event: StreamEvent) -> None:
        with lock:
            if event["k"] == poison_key:
                if event.deliveries == 5:
                    good_before_last_attempt.append(sum(1 for k, _ in handled if k in good_keys))
                raise ValueError("poison")
            handled.append((event["k"], event["n"]))

    s.runtime.ensure_group("g")
    s.publish({"k": poison_key, "n": 0})
    s.publish_many([{"k": behind_key, "n": n} for n in range(1, 6)])
    s.publish_many([{"k": good_keys[n % 3], "n": n} for n in range(6, 46)])
    s.drain(timeout=120)
    # The 40 good events of the other partitions did not wait for the poison's retries ...
    assert good_before_last_attempt == [40]
    # ... while in its own partition the events behind it did, in order.
    assert [n for k, n in handled if k == behind_key] == [1, 2, 3, 4, 5]
    assert sorted(n for _, n in handled) == list(range(1, 46))
    [dead] = s.dead_letters("g")
    assert (dead.partition, dead.offset, dead.deliveries) == (0, 1, 5)
    assert app.metrics.value(names.STREAM_DEAD, group="g") == 1
    assert all(p.lag == 0 and p.pending == 0 for p in s.lag("g"))


def test_a_paused_partition_keeps_its_events_pending_until_the_retry(
    make_stream_app: MakeApp, stream_url: str
) -> None:
    """The events of a paused batch stay the consumer's (their deadline is extended
    while it waits), and the retry that succeeds commits them: none is redelivered."""
    app = make_stream_app(stream_url)
    s = app.stream(unique("paused"), key="k", partitions=2)
    key = key_in(1, 2)
    seen: list[tuple[int, int]] = []

    @s.consumer(group="g", max_deliveries=3, retry_backoff="1500ms", ack_deadline="1s")
    def handle(event: StreamEvent) -> None:
        seen.append((event["n"], event.deliveries))
        if event["n"] == 1 and event.deliveries == 1:
            raise ValueError("once")

    s.publish_many([{"k": key, "n": n} for n in range(4)])
    s.drain(timeout=60)
    # Paused longer than the ack deadline, yet nothing came back from the backend twice.
    assert seen == [(0, 1), (1, 1), (1, 2), (2, 1), (3, 1)]
    assert app.metrics.value(names.STREAM_REDELIVERED, group="g") == 1
