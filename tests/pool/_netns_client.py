"""The client of the network-namespace test, run inside its own namespace: submit
idempotent requests to ``where`` at a steady pace and print one JSON line per request
(the host that answered, or the error), then the pool's counters."""

from __future__ import annotations

import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.pool import served


def main() -> int:
    log, n, gap = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        started = time.time()
        try:
            host = served.where.submit(log, f"r{i}", 0.1).result(timeout=60)
            row = {"i": i, "host": host, "started": started, "ended": time.time()}
        except Exception as exc:
            row = {"i": i, "error": f"{type(exc).__name__}: {exc}", "started": started, "ended": time.time()}
        with lock:
            results.append(row)

    print(json.dumps({"event": "start", "at": time.time()}), flush=True)
    with ThreadPoolExecutor(16) as pool:
        for i in range(n):
            pool.submit(one, i)
            time.sleep(gap)
    metrics = served.app.metrics
    for row in sorted(results, key=lambda r: r["i"]):
        print(json.dumps(row), flush=True)
    print(
        json.dumps(
            {
                "event": "end",
                "retries": metrics.value("foundry_pool_retries_total", unit="where"),
                "completed": metrics.value("foundry_unit_completed_total", unit="where", model="pool"),
                "failed": metrics.value("foundry_unit_failed_total", unit="where", model="pool"),
            }
        ),
        flush=True,
    )
    served.app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
