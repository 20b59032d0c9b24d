"""Where a RabbitMQ job's submit→claim latency goes, in two processes like the real thing.

    python bench/queue_latency_parts.py                 # 200 jobs, 10 ms apart
    python bench/queue_latency_parts.py --m 300 --gap 0.02

A producer process submits ``--m`` jobs one at a time, ``--gap`` apart, through the
AMQP engine (state: the default SQLite file); a claimer process (no worker, no
runner threads) claims them with ``claim`` and completes each. Times are wall-clock
(one machine, one clock); per job:

* **enqueue** — ``enqueue`` returning in the producer (the state store's commit, the
  message handed to the publisher thread);
* **→ delivery** — from then until the claimer's AMQP client has the message
  (publisher thread, broker, consumer; compare with a raw client's one-way trip);
* **→ claimed** — from delivery until ``claim`` returns it (the claimer thread's
  wake-up, the lease committed in the state store, the message acknowledged).

What the worker adds after ``claim`` (its hand-off to a runner thread) is not in here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# bench/ on sys.path would let a file here shadow a library module
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

from foundry.backends.queue import _amqp_client, open_queue_backend  # noqa: E402
from foundry.backends.queue.base import NewJob  # noqa: E402

AMQP = os.environ.get("QBENCH_AMQP", "amqp://guest:guest@127.0.0.1:5672/")


def claimer(url: str, out: str, seconds: float) -> None:
    """Claim and complete for ``seconds``; write ``[id, delivered, claimed]`` rows to ``out``."""
    arrived: dict[str, float] = {}
    original = _amqp_client.Consumer.on_message

    async def on_message(self: Any, message: Any) -> None:
        now = time.time()
        for line in bytes(message.body).split(b"\n"):
            arrived[line.split(b" ")[0].decode(errors="replace")] = now
        await original(self, message)

    _amqp_client.Consumer.on_message = on_message  # type: ignore[method-assign]
    backend = open_queue_backend(url)
    rows: list[tuple[str, float, float]] = []
    end = time.time() + seconds
    print("ready", flush=True)
    try:
        while time.time() < end:
            for c in backend.claim("default", "parts", lease=30, limit=16, timeout=0.2):
                rows.append((c.id, arrived.get(c.id, 0.0), time.time()))
                backend.complete(c.id, c.token, b"null")
    finally:
        backend.close()
    Path(out).write_text(json.dumps(rows))


def show(name: str, values: list[float]) -> None:
    xs = sorted(values)
    p90 = xs[min(len(xs) - 1, int(0.9 * len(xs)))]
    print(f"{name:12s} p50 {statistics.median(xs) * 1e3:6.3f} ms   p90 {p90 * 1e3:6.3f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--m", type=int, default=200, help="jobs, submitted one at a time (200)")
    p.add_argument("--gap", type=float, default=0.01, help="seconds between submissions (0.01)")
    p.add_argument("--claimer", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.claimer:
        claimer(args.claimer[0], args.claimer[1], float(args.claimer[2]))
        return
    with tempfile.TemporaryDirectory(prefix="qparts-") as d:
        os.environ["FOUNDRY_HOME"] = d  # the default state file lives here, for both processes
        url = f"{AMQP}?prefix=qparts{uuid.uuid4().hex[:8]}"
        out = str(Path(d) / "claimed.json")
        seconds = 2.0 + args.m * (args.gap + 0.002)
        child = subprocess.Popen(
            [sys.executable, __file__, "--claimer", url, out, str(seconds)], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        child.stdout.readline()
        backend = open_queue_backend(url)
        try:
            time.sleep(0.5)
            sent: dict[str, tuple[float, float]] = {}
            for _ in range(args.m):
                job = NewJob(id=uuid.uuid4().hex, queue="default", unit="u", payload=b"[]", codec="json")
                t0 = time.time()
                backend.enqueue(job)
                sent[job.id] = (t0, time.time())
                time.sleep(args.gap)
            child.wait(seconds + 30)
            rows = [r for r in json.loads(Path(out).read_text()) if r[0] in sent and r[1]]
            load = os.getloadavg()[0]
            print(f"{len(rows)} of {args.m} jobs, {args.gap * 1000:g} ms apart, load {load:.2f}")
            show("enqueue", [sent[i][1] - sent[i][0] for i, _, _ in rows])
            show("→ delivery", [a - sent[i][1] for i, a, _ in rows])
            show("→ claimed", [c - a for _, a, c in rows])
            show("total", [c - sent[i][0] for i, _, c in rows])
        finally:
            backend.destroy()
            backend.close()


if __name__ == "__main__":
    main()
