"""Event-stream throughput: Foundry against the raw clients on the same servers.

    python bench/stream.py                      # 20 000 events of 100 bytes, 5 paired rounds
    python bench/stream.py --events 5000 --engines sqlite,redis
    python bench/stream.py --quick              # a few seconds (the test suite's smoke run)

For each engine, one partition (one subject / one Redis stream), 100-byte events, and the
fastest plain use of each client as the raw side:

* publish (batched): raw nats-py ``publish_async`` for every message, then one
  ``publish_async_completed()`` / raw redis-py pipelined ``XADD`` in batches of 1000 / raw
  sqlite3 ``executemany`` of 1000 rows per transaction (WAL, ``synchronous=NORMAL`` like
  Foundry's log) — against ``stream.publish_many`` (validation, JSON, ids with dedup,
  partitioning).
* publish1 (one at a time, each acknowledged before the next; ``--events / 10`` of them):
  raw ``await js.publish`` / ``XADD`` / one INSERT + COMMIT — against ``stream.publish``.
  For NATS also "publish1 hop": the same ``js.publish`` called synchronously from another
  thread (``run_coroutine_threadsafe(...).result()``), which is what a synchronous
  ``publish()`` over an asyncio client costs at least.
* publish hdrs (NATS): the raw batched loop with the headers JetStream's dedup needs (a
  ``Nats-Msg-Id`` per message, and a ``Foundry-Key``): the floor of a deduplicating
  producer, against ``apublish_many``.
* publish async / publish1 async: the same raw sides against ``await stream.apublish_many``
  / ``await stream.apublish`` inside ``asyncio.run`` (the raw loop's ``await js.publish`` is
  on its own loop too): on NATS a connection of the caller's loop, no thread hop; on
  SQLite and Redis the append in a worker thread.
* For SQLite also "publish sql": only the SQL of Foundry's append on its own schema (the
  event rows — and on format 1 the dedup rows — made beforehand, 1000 per transaction: ``foundry_sql``),
  the floor for ``publish_many`` on this log; and "consume loop": the bare page read plus
  what any consumer does — each event decoded (``json.loads``) and handed to a no-op
  handler, the page's last offset committed in its own transaction (``consume_loop``).
* consume: raw ``fetch(batch=500)`` + ``ack`` per message / raw ``XREADGROUP COUNT 500`` +
  ``XACK`` / a range read of 1000-row pages — against a Foundry consumer group (a no-op
  handler, batches of 500, 1000 on SQLite; reads that keep order under redelivery,
  decoding, commits, leases, metrics).

Rounds alternate which side runs first. Prints events/second and the Foundry/raw ratio
two ways: best ÷ best over the rounds, and the median of the ratios paired within each
round (with their range); then this process's CPU time per event on each side (every
thread's, medians) and raw ÷ Foundry of it paired per round, a rate ratio that load from
other processes moves much less (it leaves out the server's own CPU). On a shared machine
whose speed drifts by tens of percent within seconds, the paired medians are the ones to
read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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

# `python bench/stream.py` puts bench/ first on sys.path: keep it off, so no script here can
# shadow a library module, and import Foundry from the repository's source.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent / "src"))

from foundry import Foundry  # noqa: E402 (after the sys.path fix above)
from foundry.backends.stream import open_stream_backend  # noqa: E402
from foundry.backends.stream.sqlite import _DDL  # noqa: E402 (the log's schema, for its SQL floor)

NATS_URL = os.environ.get("FOUNDRY_TEST_NATS", "nats://127.0.0.1:4222")
REDIS_URL = os.environ.get("FOUNDRY_TEST_REDIS", "redis://127.0.0.1:6379/0")
SIZE = 100
FETCH = 500  # events per read (NATS, Redis)
PAGE = 1000  # rows per SQLite transaction and per page read
# (row, the raw side's measurement, Foundry's): "publish1 hop" is the raw client called
# synchronously from another thread than its event loop's, as Foundry's publish() is;
# "publish sql" (SQLite) only the SQL of Foundry's own append; "consume loop" (SQLite) the
# bare page read plus what any consumer does with each row.
ROWS = (
    ("publish", "publish", "publish"),
    ("publish1", "publish1", "publish1"),
    ("publish1 hop", "publish1 hop", "publish1"),
    ("publish async", "publish", "publish async"),
    ("publish hdrs", "publish hdrs", "publish async"),
    ("publish1 async", "publish1", "publish1 async"),
    ("publish sql", "publish sql", "publish"),
    ("consume", "consume", "consume"),
    ("consume loop", "consume loop", "consume"),
)


def payload() -> bytes:
    return b"x" * SIZE


def event(i: int) -> dict[str, Any]:
    """A JSON event that encodes to 100 bytes."""
    base = {"k": f"key-{i % 64}", "n": i, "pad": ""}
    pad = SIZE - len(json.dumps(base, separators=(",", ":")))
    base["pad"] = "p" * max(0, pad)
    return base


class Rate(float):
    """Events per second, with ``cpu_us`` beside it: this process's CPU time per event, in
    microseconds (every thread's: the client's loop thread included). CPU time moves far
    less than wall time when other processes share the cores."""

    cpu_us: float


def clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def rate(n: int, started: tuple[float, float]) -> Rate:
    wall, cpu = time.perf_counter() - started[0], time.process_time() - started[1]
    out = Rate(n / wall if wall > 0 else float("inf"))
    out.cpu_us = cpu / n * 1e6
    return out


Rates = dict[str, Rate]  # events per second (and CPU per event) by op


# -- raw clients ------------------------------------------------------------------


def raw_nats(n: int, ones: int) -> Rates:
    import nats
    from nats.js import api

    async def main() -> Rates:
        nc = await nats.connect(NATS_URL)
        js = nc.jetstream()
        name = f"BENCH_RAW_{uuid.uuid4().hex[:8]}"
        subject, single, headed = f"bench.raw.{name}", f"bench.raw1.{name}", f"bench.rawh.{name}"
        await js.add_stream(name=name, subjects=[subject, single, headed], storage=api.StorageType.FILE)
        try:
            data = payload()
            await js.publish_async(single, data)  # warm up: the client subscribes to its ack inbox
            await js.publish_async_completed()
            t0 = clock()
            for _ in range(n):  # the client bounds what is in flight (publish_async_max_pending)
                await js.publish_async(subject, data)
            await js.publish_async_completed()
            published = rate(n, t0)
            t0 = clock()
            for i in range(n):  # what JetStream's dedup asks of any producer: an id per message
                await js.publish_async(headed, data, headers={"Nats-Msg-Id": f"h{i}", "Foundry-Key": "k"})
            await js.publish_async_completed()
            with_headers = rate(n, t0)
            t0 = clock()
            for _ in range(ones):
                await js.publish(single, data)
            one = rate(ones, t0)
            loop = asyncio.get_running_loop()

            def from_a_thread() -> Rate:  # what any synchronous caller of the client pays
                t0 = clock()
                for _ in range(ones):
                    asyncio.run_coroutine_threadsafe(js.publish(single, data), loop).result()
                return rate(ones, t0)

            hop = await asyncio.to_thread(from_a_thread)
            sub = await js.pull_subscribe(subject, durable="raw", stream=name)
            got = 0
            t0 = clock()
            while got < n:
                msgs = await sub.fetch(FETCH, timeout=5)
                for msg in msgs:
                    await msg.ack()
                got += len(msgs)
            consumed = rate(n, t0)
            await sub.unsubscribe()
            return {
                "publish": published,
                "publish hdrs": with_headers,
                "publish1": one,
                "publish1 hop": hop,
                "consume": consumed,
            }
        finally:
            await js.delete_stream(name)
            await nc.close()

    return asyncio.run(main())


def raw_redis(n: int, ones: int) -> Rates:
    import redis

    r = redis.Redis.from_url(REDIS_URL)
    key = f"bench:raw:{uuid.uuid4().hex[:8]}"
    try:
        data = payload()
        t0 = clock()
        for start in range(0, n, 1000):
            pipe = r.pipeline(transaction=False)
            for _ in range(min(1000, n - start)):
                pipe.xadd(key, {"d": data})
            pipe.execute()
        published = rate(n, t0)
        t0 = clock()
        for _ in range(ones):
            r.xadd(f"{key}:1", {"d": data})
        one = rate(ones, t0)
        r.xgroup_create(key, "raw", id="0")
        got = 0
        t0 = clock()
        while got < n:
            reply = r.xreadgroup("raw", "c1", {key: ">"}, count=FETCH, block=5000)
            entries = reply[0][1] if reply else []
            if entries:
                r.xack(key, "raw", *[entry_id for entry_id, _ in entries])
            got += len(entries)
        consumed = rate(n, t0)
        return {"publish": published, "publish1": one, "consume": consumed}
    finally:
        r.delete(key, f"{key}:1")
        r.close()


def raw_sqlite(n: int, ones: int) -> Rates:
    with tempfile.TemporaryDirectory() as tmp:
        conn = sqlite3.connect(Path(tmp) / "raw.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # Foundry's log's default
        conn.execute(
            "CREATE TABLE log (part INTEGER, off INTEGER, payload BLOB, "
            "PRIMARY KEY (part, off)) WITHOUT ROWID"
        )
        data = payload()
        encoded = [json.dumps(event(i), separators=(",", ":")).encode() for i in range(n)]  # 100 bytes
        t0 = clock()
        for start in range(0, n, PAGE):
            conn.execute("BEGIN")
            conn.executemany(
                "INSERT INTO log VALUES (0, ?, ?)",
                ((i, encoded[i]) for i in range(start, min(n, start + PAGE))),
            )
            conn.execute("COMMIT")
        published = rate(n, t0)
        t0 = clock()
        for i in range(1, ones + 1):
            conn.execute("BEGIN")
            conn.execute("INSERT INTO log VALUES (1, ?, ?)", (i, data))
            conn.execute("COMMIT")
        one = rate(ones, t0)
        got, last = 0, -1
        t0 = clock()
        while got < n:
            rows = conn.execute(
                "SELECT off, payload FROM log WHERE part=0 AND off>? ORDER BY off LIMIT ?", (last, PAGE)
            ).fetchall()
            last = rows[-1][0]
            got += len(rows)
        consumed = rate(n, t0)
        loop = consume_loop(conn, n)
        schema = foundry_sql(conn, encoded)
        conn.close()
        return {
            "publish": published,
            "publish1": one,
            "publish sql": schema,
            "consume": consumed,
            "consume loop": loop,
        }


def foundry_sql(conn: sqlite3.Connection, encoded: list[bytes]) -> float:
    """Only the SQL of Foundry's append on its own schema, rows made beforehand, 1000 per
    transaction — the floor for ``publish_many`` on this log, whatever the Python around it
    costs. The log's format 2 (``_DDL`` a list of statements): the ``fs_events`` rows, keyed
    by the stream's integer id, whose index on the event id is the publish dedup record.
    Format 1 (the code before it, ``_DDL`` one script): the ``fs_events`` rows and the
    ``fs_dedup`` rows, both keyed by the stream's name."""
    by_name = isinstance(_DDL, str)  # format 1
    if by_name:
        conn.executescript(_DDL)
    else:
        for statement in _DDL:
            conn.execute(statement)
    stream, n = ("bench-raw" if by_name else 1), len(encoded)
    events = [
        (stream, 0, i + 1, f"e{i}", f"key-{i % 64}", 1.0, 100 * (i + 1), encoded[i], None) for i in range(n)
    ]
    dedup = [(stream, f"e{i}", 0, i + 1, 1.0) for i in range(n)]
    t0 = clock()
    for start in range(0, n, PAGE):
        conn.execute("BEGIN")
        conn.executemany(
            f"INSERT INTO fs_events ({'stream' if by_name else 'sid'}, part, off, id, key, ts, cum, payload, "
            "trace) VALUES (?,?,?,?,?,?,?,?,?)",
            events[start : start + PAGE],
        )
        if by_name:  # format 2 has no dedup row per event
            conn.executemany(
                "INSERT OR REPLACE INTO fs_dedup VALUES (?,?,?,?,?)", dedup[start : start + PAGE]
            )
        conn.execute("COMMIT")
    return rate(n, t0)


def consume_loop(conn: sqlite3.Connection, n: int) -> float:
    """The consumer a user would write on that table: each 1000-row page decoded
    (``json.loads``) and handed to a no-op handler one event at a time, then the page's
    last offset committed in its own transaction."""
    conn.execute("CREATE TABLE IF NOT EXISTS offsets (grp TEXT PRIMARY KEY, off INTEGER)")
    conn.execute("INSERT OR REPLACE INTO offsets VALUES ('loop', -1)")

    def handle(value: Any) -> None:
        return None

    got = 0
    t0 = clock()
    while got < n:
        (last,) = conn.execute("SELECT off FROM offsets WHERE grp='loop'").fetchone()
        rows = conn.execute(
            "SELECT off, payload FROM log WHERE part=0 AND off>? ORDER BY off LIMIT ?", (last, PAGE)
        ).fetchall()
        for _, data in rows:
            handle(json.loads(data))
        conn.execute("BEGIN")
        conn.execute("UPDATE offsets SET off=? WHERE grp='loop'", (rows[-1][0],))
        conn.execute("COMMIT")
        got += len(rows)
    return rate(n, t0)


# -- Foundry ----------------------------------------------------------------------


def foundry(url: str, n: int, ones: int) -> Rates:
    batch = PAGE if url.startswith("sqlite") else FETCH
    with tempfile.TemporaryDirectory() as home:
        app = Foundry("bench", home=home, stream=url)
        name = f"bench-{uuid.uuid4().hex[:8]}"
        stream = app.stream(name, key="k", partitions=1)
        single = app.stream(f"{name}-1", key="k", partitions=1)
        batched = app.stream(f"{name}-a", key="k", partitions=1)  # apublish_many's
        handled = [0]
        done = threading.Event()

        @stream.consumer(group="bench", batch=batch, max_in_flight=batch)
        def handle(ev: Any) -> None:
            handled[0] += 1
            if handled[0] >= n:
                done.set()

        events = [event(i) for i in range(n)]
        ids = [f"e{i}" for i in range(n)]
        try:
            stream.runtime.backend  # noqa: B018 (connect and create the streams outside the timing)
            single.publish({"k": "warm-up"}, id="warm-up")
            t0 = clock()
            stream.publish_many(events, ids=ids)
            published = rate(n, t0)
            t0 = clock()
            for i in range(ones):
                single.publish(events[i], id=ids[i])
            one = rate(ones, t0)
            batched.runtime.backend  # noqa: B018
            asynced = asyncio.run(in_loop(single, batched, events, ones))
            t0 = clock()
            consumers = stream.run()
            if not done.wait(max(60.0, n / 2000)):
                raise RuntimeError(f"{url}: only {handled[0]} of {n} events consumed")
            consumed = rate(n, t0)
            consumers.stop()
            return {"publish": published, "publish1": one, "consume": consumed, **asynced}
        finally:
            app.close()
            backend = open_stream_backend(url)
            try:
                for gone in (name, f"{name}-1", f"{name}-a"):
                    backend.delete_stream(gone)
            finally:
                backend.close()


async def in_loop(single: Any, batched: Any, events: list[dict[str, Any]], ones: int) -> Rates:
    """``apublish`` one at a time and ``apublish_many``, awaited on this loop."""
    await single.apublish({"k": "warm-up"}, id="a-warm-up")  # this loop's connection, made once
    t0 = clock()
    for i in range(ones):
        await single.apublish(events[i], id=f"a{i}")
    one = rate(ones, t0)
    t0 = clock()
    await batched.apublish_many(events, ids=[f"a{i}" for i in range(len(events))])
    return {"publish async": rate(len(events), t0), "publish1 async": one}


ENGINES: dict[str, tuple[str, Callable[[int, int], Rates], str]] = {
    "nats": (NATS_URL, raw_nats, "nats-py JetStream"),
    "redis": (REDIS_URL, raw_redis, "redis-py Streams"),
    "sqlite": ("", raw_sqlite, "sqlite3 1000-row transactions / pages"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="rounds, alternating which side runs first",
    )
    parser.add_argument("--engines", default="nats,redis,sqlite")
    parser.add_argument("--quick", action="store_true", help="1000 events, one round: a smoke run")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    n = 1000 if args.quick else args.events
    ones = max(1, n // 10)
    repeat = 1 if args.quick else max(1, args.repeat)
    load_before = os.getloadavg()[0]
    results = []
    for engine in [e.strip() for e in args.engines.split(",") if e.strip()]:
        url, raw, peer = ENGINES[engine]
        runs: dict[str, list[Rates]] = {"raw": [], "foundry": []}
        for k in range(repeat):  # alternate, so load from other processes hits both sides alike
            with tempfile.TemporaryDirectory() as tmp:
                target = url or f"sqlite:///{tmp}/stream.db"
                if k % 2 == 0:
                    runs["raw"].append(raw(n, ones))
                    runs["foundry"].append(foundry(target, n, ones))
                else:
                    runs["foundry"].append(foundry(target, n, ones))
                    runs["raw"].append(raw(n, ones))
        for op, raw_op, our_op in ROWS:
            if raw_op not in runs["raw"][0] or our_op not in runs["foundry"][0]:
                continue
            raws = [r[raw_op] for r in runs["raw"]]
            ours = [f[our_op] for f in runs["foundry"]]
            paired = [a / b for a, b in zip(ours, raws, strict=True)]
            # CPU per event, as a rate ratio: raw's CPU ÷ Foundry's (0.5: Foundry costs twice)
            cpu = [a.cpu_us / b.cpu_us for a, b in zip(raws, ours, strict=True)]
            results.append(
                {
                    "engine": engine,
                    "op": op,
                    "events": ones if op.startswith("publish1") else n,
                    "peer": peer,
                    "raw": max(raws),
                    "foundry": max(ours),
                    "ratio": max(ours) / max(raws),
                    "paired": statistics.median(paired),
                    "paired_range": [min(paired), max(paired)],
                    "cpu_us": [
                        statistics.median(r.cpu_us for r in raws),
                        statistics.median(f.cpu_us for f in ours),
                    ],
                    "cpu_ratio": statistics.median(cpu),
                    "cpu_range": [min(cpu), max(cpu)],
                }
            )
    load = f"load average {load_before:.1f} → {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    if args.json:
        print(json.dumps({"events": n, "repeat": repeat, "load": load, "results": results}, indent=2))
        return 0
    print(
        f"{n} events of {SIZE} bytes ({ones} for publish1, one at a time), one partition, "
        f"{repeat} rounds; events per second, best of the rounds ({load})\n"
    )
    head = f"{'engine':<8} {'op':<14} {'raw client':<38} {'raw/s':>10} {'foundry/s':>10} {'ratio':>7}"
    print(f"{head}  paired median (range)  CPU µs/event raw, foundry: raw÷foundry median (range)")
    for row in results:
        lo, hi = row["paired_range"]
        (raw_cpu, our_cpu), (clo, chi) = row["cpu_us"], row["cpu_range"]
        print(
            f"{row['engine']:<8} {row['op']:<14} {row['peer']:<38} {row['raw']:>10,.0f} "
            f"{row['foundry']:>10,.0f} {row['ratio']:>6.2f}x  {row['paired']:.2f}x ({lo:.2f}–{hi:.2f})"
            f"  {raw_cpu:6.1f} {our_cpu:6.1f}: {row['cpu_ratio']:.2f}x ({clo:.2f}–{chi:.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
