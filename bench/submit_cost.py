"""What one ``unit.submit(...)`` of a durable no-op job costs the submitting process, and
where it goes: CPU per submit, and (``--profile``) the share of it spent inside SQLite
(the state record: ``BEGIN`` / ``INSERT`` / ``COMMIT``) against the rest of Foundry.

    python bench/submit_cost.py                      # RabbitMQ, state in SQLite (the default)
    python bench/submit_cost.py --url redis://127.0.0.1:6379/13 --n 5000
    python bench/submit_cost.py --url sqlite:///tmp/q.db --profile
    python bench/submit_cost.py --quick              # a smoke run: 200 submits on SQLite

On RabbitMQ and the embedded queue the benchmark's rate is the submit rate (one submit at
a time, `bench/queues.py`), so this is where that rate goes. Submits run one at a time
from one thread, after 200 unmeasured ones; CPU is the whole process's (the client
threads that publish included), wall is the loop's. ``--profile`` runs the same loop again
under cProfile (which slows it; its shares, not its times, are what to read) and prints
the functions that take most, with the time inside ``sqlite3`` execute calls as a share
of the whole.

Each run uses a fresh queue (a random prefix) and a temporary ``FOUNDRY_HOME``, and
deletes what it made at the end (``destroy()`` of that prefix's store: its RabbitMQ
queues and state, its Redis keys); nothing else on the servers is touched.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
import uuid

DEFAULT = "amqp://guest:guest@127.0.0.1:5672/"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default=DEFAULT, help=f"queue URL ({DEFAULT}: state in SQLite)")
    parser.add_argument("--n", type=int, default=3000, help="measured submits (3000)")
    parser.add_argument("--profile", action="store_true", help="and the same loop under cProfile")
    parser.add_argument("--quick", action="store_true", help="200 submits on a temporary SQLite file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="foundry-submit-cost-") as tmp:
        os.environ["FOUNDRY_HOME"] = os.path.join(tmp, "home")
        url = f"sqlite:///{tmp}/queue.db" if args.quick else args.url
        n = 200 if args.quick else args.n
        prefix = f"sc{uuid.uuid4().hex[:8]}"
        if not url.startswith("sqlite"):
            url += ("&" if "?" in url else "?") + f"prefix={prefix}"

        from foundry import Foundry

        app = Foundry("submit-cost", queue=url)

        @app.work(durable=True, queue=prefix)
        def noop(submitted: float) -> None:
            """Never runs here: only its submits are measured."""

        try:
            for _ in range(200):
                noop.submit(time.time())
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(n):
                noop.submit(time.time())
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            print(
                f"{url.split('?')[0]}: {n} submits, "
                f"{1e6 * cpu / n:.0f} µs CPU and {1e6 * wall / n:.0f} µs wall each"
            )
            if args.profile:
                profile(lambda: noop.submit(time.time()), n)
        finally:
            app.close()
            from foundry.backends.queue import open_queue_backend

            store = open_queue_backend(url, home=os.environ["FOUNDRY_HOME"])
            try:
                destroy = getattr(store, "destroy", None)  # every engine has it (StateStore's)
                if callable(destroy):
                    destroy()  # this run's prefix only: its queues, keys or tables
            finally:
                store.close()
    return 0


def profile(submit: object, n: int) -> None:
    assert callable(submit)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        submit()
    prof.disable()
    stats = pstats.Stats(prof)
    total = stats.total_tt  # type: ignore[attr-defined]
    inside = sum(
        tt
        for (_file, _line, name), (_cc, _nc, tt, _ct, _callers) in stats.stats.items()  # type: ignore[attr-defined]
        if name
        in (
            "<method 'execute' of 'sqlite3.Connection' objects>",
            "<method 'commit' of 'sqlite3.Connection' objects>",
        )
    )
    print(
        f"under cProfile: {1e6 * total / n:.0f} µs per submit (the submitting thread's), "
        f"{100 * inside / total:.0f} % of it inside sqlite3 execute/commit"
    )
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
    print(out.getvalue().split("\n\n", 1)[-1].rstrip())


if __name__ == "__main__":
    sys.exit(main())
