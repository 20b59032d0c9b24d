"""Event-stream latency: publish → handler start, at a fixed rate well below capacity,
Foundry against the plain use of each engine's client in the same run.

    python bench/stream_latency.py                       # 400 events at 200/s, 5 rounds
    python bench/stream_latency.py --engines sqlite,redis --events 200 --rate 100
    python bench/stream_latency.py --quick               # a few seconds (the suite's smoke run)

One producer publishes one event at a time (each publish returns when the engine has it:
committed, acknowledged), ``1/rate`` apart; one consumer in the same process handles
them. An event carries the ``perf_counter`` reading taken just before its publish call,
and the handler notes how long ago that was when it starts: the figure is
*submit → start*, including the publish itself. The plain baselines do the same with
nothing but the client:

* **sqlite** — ``INSERT`` + ``COMMIT`` per event (WAL, ``synchronous=NORMAL``, Foundry's
  default) and a reader thread woken by a ``threading.Condition`` that reads the new
  rows (what one process writing and reading its own log would do);
* **redis** — ``XADD`` per event; a reader thread blocked in ``XREADGROUP BLOCK`` that
  ``XACK``s what it read;
* **nats** — ``await js.publish`` per event (acknowledged); a push consumer
  (``js.subscribe`` with a callback, manual ``ack``).

Rounds alternate which side goes first. Per round, each side's p50 and p99; the table
shows the median of each over the rounds and Foundry ÷ plain per round (median, range).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent / "src"))

from foundry import Foundry  # noqa: E402 (after the sys.path fix above)
from foundry.backends.stream import open_stream_backend  # noqa: E402

NATS_URL = os.environ.get("FOUNDRY_TEST_NATS", "nats://127.0.0.1:4222")
REDIS_URL = os.environ.get("FOUNDRY_TEST_REDIS", "redis://127.0.0.1:6379/0")
WAIT = 60.0  # seconds: the longest a run may take to see all its events

Run = Callable[[int, float], list[float]]  # (events, gap) -> submit→start seconds, one per event


class _Seen:
    """The consumer's notes: one latency per event, and a flag when all are in."""

    def __init__(self, expected: int) -> None:
        self.latencies: list[float] = []
        self.expected = expected
        self.done = threading.Event()

    def note(self, published_at: float) -> None:
        self.latencies.append(time.perf_counter() - published_at)
        if len(self.latencies) >= self.expected:
            self.done.set()

    def result(self, what: str) -> list[float]:
        if not self.done.wait(WAIT):
            raise RuntimeError(f"{what}: only {len(self.latencies)} of {self.expected} events seen")
        return self.latencies


def _paced(n: int, gap: float, publish: Callable[[int], None]) -> None:
    """Call ``publish(i)`` for i < n, starting each ``gap`` after the previous start."""
    due = time.perf_counter()
    for i in range(n):
        publish(i)
        due += gap
        pause = due - time.perf_counter()
        if pause > 0:
            time.sleep(pause)


# -- Foundry -------------------------------------------------------------------------------


def foundry(engine_url: str) -> Run:
    def run(n: int, gap: float) -> list[float]:
        with tempfile.TemporaryDirectory() as home:
            url = engine_url or f"sqlite:///{home}/stream.db"
            app = Foundry("latency", home=home, stream=url)
            name = f"lat-{uuid.uuid4().hex[:8]}"
            stream = app.stream(name, key="k", partitions=1)
            seen = _Seen(n)

            @stream.consumer(group="lat")
            def handle(ev: Any) -> None:
                seen.note(ev["t"])

            try:
                stream.runtime.backend  # connect and create the stream outside the timing  # noqa: B018
                with stream.run():
                    _paced(n, gap, lambda i: stream.publish({"k": "a", "i": i, "t": time.perf_counter()}))
                    return seen.result(f"foundry {url}")
            finally:
                app.close()
                backend = open_stream_backend(url)
                try:
                    backend.delete_stream(name)
                finally:
                    backend.close()

    return run


# -- the plain clients -----------------------------------------------------------------------


def raw_sqlite(n: int, gap: float) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "raw.db"
        writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute("PRAGMA synchronous=NORMAL")
        writer.execute("CREATE TABLE log (off INTEGER PRIMARY KEY, t REAL)")
        seen = _Seen(n)
        written = threading.Condition()
        last_written = [0]

        def read() -> None:
            reader = sqlite3.connect(path, isolation_level=None)
            last = [0]
            while not seen.done.is_set():
                with written:
                    written.wait_for(lambda: last_written[0] > last[0], timeout=1.0)
                for off, t in reader.execute("SELECT off, t FROM log WHERE off > ? ORDER BY off", (last[0],)):
                    seen.note(t)
                    last[0] = off
            reader.close()

        def publish(i: int) -> None:
            writer.execute("BEGIN")
            writer.execute("INSERT INTO log VALUES (?, ?)", (i + 1, time.perf_counter()))
            writer.execute("COMMIT")
            with written:
                last_written[0] = i + 1
                written.notify_all()

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        try:
            _paced(n, gap, publish)
            return seen.result("plain sqlite")
        finally:
            thread.join(timeout=WAIT)
            writer.close()


def raw_redis(n: int, gap: float) -> list[float]:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    key = f"bench:lat:{uuid.uuid4().hex[:8]}"
    client.xgroup_create(key, "raw", id="$", mkstream=True)
    seen = _Seen(n)

    def read() -> None:
        reader = redis.Redis.from_url(REDIS_URL)
        while not seen.done.is_set():
            reply: Any = reader.xreadgroup("raw", "c1", {key: ">"}, count=100, block=1000)
            for _stream, entries in reply or []:
                for _entry_id, fields in entries:
                    seen.note(float(fields[b"t"]))
                if entries:
                    reader.xack(key, "raw", *[entry_id for entry_id, _ in entries])
        reader.close()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:

        def publish(i: int) -> None:
            client.xadd(key, {"i": i, "t": repr(time.perf_counter())})

        _paced(n, gap, publish)
        return seen.result("plain redis")
    finally:
        thread.join(timeout=WAIT)
        client.delete(key)
        client.close()


def raw_nats(n: int, gap: float) -> list[float]:
    import nats
    from nats.js import api

    async def main() -> list[float]:
        nc = await nats.connect(NATS_URL)
        js = nc.jetstream()
        name = f"LAT_RAW_{uuid.uuid4().hex[:8]}"
        subject = f"{name.lower()}.events"
        await js.add_stream(name=name, subjects=[subject], storage=api.StorageType.FILE)
        latencies: list[float] = []
        all_in = asyncio.Event()

        async def handle(msg: Any) -> None:
            latencies.append(time.perf_counter() - float(msg.data))
            await msg.ack()
            if len(latencies) >= n:
                all_in.set()

        sub = await js.subscribe(subject, durable="raw", cb=handle, manual_ack=True)
        try:
            due = time.perf_counter()
            for _ in range(n):
                await js.publish(subject, repr(time.perf_counter()).encode())
                due += gap
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
            await asyncio.wait_for(all_in.wait(), WAIT)
            return latencies
        finally:
            await sub.unsubscribe()
            await js.delete_stream(name)
            await nc.close()

    return asyncio.run(main())


ENGINES: dict[str, tuple[str, Run, str]] = {
    "sqlite": ("", raw_sqlite, "sqlite3 INSERT+COMMIT, a Condition-woken reader"),
    "redis": (REDIS_URL, raw_redis, "redis-py XADD / XREADGROUP BLOCK + XACK"),
    "nats": (NATS_URL, raw_nats, "nats-py js.publish / push subscribe + ack"),
}


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", default="sqlite,redis,nats")
    parser.add_argument("--events", type=int, default=400)
    parser.add_argument("--rate", type=float, default=200.0, help="events per second (default 200)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="40 events, 2 rounds")
    args = parser.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    events, rounds = (40, 2) if args.quick else (args.events, args.rounds)
    gap = 1.0 / args.rate
    python = sys.version.split()[0]
    print(f"stream latency: {events} events at {args.rate:g}/s, {rounds} rounds, Python {python}")
    ratios = "Foundry ÷ plain, p50 and p99: median (range)"
    print(f"{'engine':8} {'system':52} {'p50 ms':>8} {'p99 ms':>8}   {ratios}")
    for engine in engines:
        url, raw, label = ENGINES[engine]
        sides: dict[str, Run] = {"foundry": foundry(url), "plain": raw}
        p50: dict[str, list[float]] = {"foundry": [], "plain": []}
        p99: dict[str, list[float]] = {"foundry": [], "plain": []}
        for round_ in range(rounds):
            for side in ("foundry", "plain") if round_ % 2 == 0 else ("plain", "foundry"):
                latencies = sides[side](events, gap)
                p50[side].append(_quantile(latencies, 0.50))
                p99[side].append(_quantile(latencies, 0.99))
        ratio50 = sorted(f / p for f, p in zip(p50["foundry"], p50["plain"], strict=True))
        ratio99 = sorted(f / p for f, p in zip(p99["foundry"], p99["plain"], strict=True))
        for side, name in (("plain", label), ("foundry", f"Foundry stream ({engine})")):
            cell = ""
            if side == "foundry":
                cell = (
                    f"   p50 {statistics.median(ratio50):.2f}× ({ratio50[0]:.2f}–{ratio50[-1]:.2f}), "
                    f"p99 {statistics.median(ratio99):.2f}× ({ratio99[0]:.2f}–{ratio99[-1]:.2f})"
                )
            print(
                f"{engine:8} {name:52} {statistics.median(p50[side]) * 1e3:8.2f} "
                f"{statistics.median(p99[side]) * 1e3:8.2f}{cell}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
