"""Peak memory of a large payload through the durable queue, per engine, beside the
plain client storing the same bytes.

    python bench/payloads.py                         # 200 MB, every engine (a few minutes)
    python bench/payloads.py --mb 50 --engines sqlite redis
    python bench/payloads.py probe URL submit 40     # one measurement, JSON on stdout (the tests use it)

Each measurement runs in a fresh process, so one phase's memory never hides another's.
The number is the process's peak resident memory during the phase, above what it held
just before the phase began (Linux ``VmHWM``, reset through ``/proc/self/clear_refs``),
divided by the payload's size:

* **submit** — build a str argument of ``--mb`` MB (counted: it is part of the peak) and
  ``unit.submit(arg)`` it (JSON codec, ``max_payload`` raised to fit);
* **worker** — one ``Worker(burst=True)`` runs that job (claim, decode, run, a small
  result, acknowledge);
* **result** — ``handle.result()`` of a finished job whose *result* is ``--mb`` MB
  (counted: the returned value is part of the peak);
* **raw** — the plain client, the way one would write it by hand: the same str,
  ``json.dumps(...).encode()``, and one INSERT (sqlite3, psycopg) or HSET (redis-py) of
  the bytes. RabbitMQ carries only job ids in Foundry (the payload is in its state
  store, SQLite by default), so its raw row is SQLite's.

Two rounds per engine by default (``--rounds``), in alternating order of the phases; the
table shows the median (the numbers barely move: memory is not noisy like speed).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from typing import Any  # noqa: E402

ROOT = HERE.parent
PAGE = os.sysconf("SC_PAGE_SIZE")
ENGINES = ("sqlite", "postgres", "redis", "amqp")
BASES = {
    "postgres": os.environ.get("FOUNDRY_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"),
    "redis": os.environ.get("FOUNDRY_TEST_REDIS", "redis://127.0.0.1:6379/0"),
    "amqp": os.environ.get("FOUNDRY_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672/"),
}


# -- measuring, inside the probe process ------------------------------------------------------


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak(resettable: bool) -> int:
    if resettable:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _app(url: str) -> Any:
    from foundry import Foundry

    app = Foundry("bench-payloads", queue=url)

    def length(value: str) -> int:
        return len(value)

    def blob(size: int) -> str:
        return "x" * (size - 2)

    app.work(durable=True, max_payload="2GB", name="length")(length)
    app.work(durable=True, max_payload="2GB", name="blob")(blob)
    return app


def probe(url: str, phase: str, mb: float, job: str = "") -> dict[str, Any]:
    """One measurement in this process (see the module docstring)."""
    n = int(mb * 1_000_000)
    if phase == "raw":
        return _raw(url, n)
    app = _app(url)
    try:
        if phase == "prepare-submit":
            return {"job": app.units["length"].submit("x" * n).id}
        if phase == "prepare-result":
            return {"job": app.units["blob"].submit(n).id}
        if phase == "submit":
            app.units["length"].submit("warm-up")  # opens the store: not part of the measurement
        handle = app.job(job) if job else None
        base = _rss()
        resettable = _reset_peak()
        started = time.perf_counter()
        if phase == "submit":
            value = "x" * n
            app.units["length"].submit(value)
        elif phase == "worker":
            from foundry.deliver.worker import Worker

            Worker(app, concurrency=1, burst=True, poll=0.05, lease=120.0).run()
        elif phase == "result":
            assert handle is not None
            value = handle.result(timeout=600)
            assert len(value) == n - 2
        else:
            raise SystemExit(f"unknown phase {phase!r}")
        seconds = time.perf_counter() - started
        peak = _peak(resettable) - base
        return {"phase": phase, "payload": n, "peak": peak, "ratio": peak / n, "seconds": seconds}
    finally:
        app.close(timeout=10)


def _raw(url: str, n: int) -> dict[str, Any]:
    """The plain client storing the JSON of an ``n``-character str, as written by hand."""
    table = f"raw_{uuid.uuid4().hex[:8]}"
    if url.startswith("sqlite"):
        import sqlite3

        conn: Any = sqlite3.connect(url.split("///", 1)[1] + ".raw", isolation_level=None)
        conn.execute(f"CREATE TABLE {table} (id TEXT, payload BLOB)")
        sql = f"INSERT INTO {table} VALUES (?, ?)"
    elif url.startswith("postgresql"):
        import psycopg

        conn = psycopg.connect(url.split("?", 1)[0], autocommit=True)
        conn.execute(f"CREATE TABLE {table} (id TEXT, payload BYTEA)")
        sql = f"INSERT INTO {table} VALUES (%s, %s)"
    else:
        import redis

        conn = redis.Redis.from_url(url.split("?", 1)[0])
    base = _rss()
    resettable = _reset_peak()
    started = time.perf_counter()
    data = json.dumps({"args": ["x" * n], "kwargs": {}}).encode()
    if url.startswith("redis"):
        conn.hset(table, mapping={"id": "1", "payload": data})
    else:
        conn.execute(sql, ("1", data))
    seconds = time.perf_counter() - started
    peak = _peak(resettable) - base
    if url.startswith("redis"):
        conn.delete(table)
    elif url.startswith("postgresql"):
        conn.execute(f"DROP TABLE {table}")
    conn.close()
    return {"phase": "raw", "payload": n, "peak": peak, "ratio": peak / n, "seconds": seconds}


# -- driving, in the parent ------------------------------------------------------------------


def run_probe(url: str, phase: str, mb: float, job: str = "", timeout: float = 900) -> dict[str, Any]:
    """:func:`probe` in a fresh process (the tests call this too)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "probe", url, phase, str(mb), job],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"probe {phase} on {url} failed:\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def namespace(engine: str, tmp: str) -> str:
    tag = uuid.uuid4().hex[:10]
    if engine == "sqlite":
        return f"sqlite:///{tmp}/bench-{tag}.db"
    base = BASES[engine]
    sep = "&" if "?" in base else "?"
    if engine == "postgres":
        return f"{base}{sep}schema=fq_bench_{tag}"
    state = f"&state=sqlite%3A%2F%2F%2F{tmp}%2Fstate-{tag}.db" if engine == "amqp" else ""
    return f"{base}{sep}prefix=fqb{tag}{state}"


def cleanup(url: str) -> None:
    """Remove what the run created on the engine."""
    try:
        from foundry.backends.queue import open_queue_backend
    except ModuleNotFoundError:  # run from a checkout without the package installed
        sys.path.insert(0, str(ROOT / "src"))
        from foundry.backends.queue import open_queue_backend

    backend = open_queue_backend(url)
    try:
        destroy = getattr(backend, "destroy", None)
        if callable(destroy):
            destroy()
    finally:
        backend.close()
    if url.startswith("postgresql") and "schema=" in url:
        import psycopg

        schema = url.split("schema=", 1)[1].split("&", 1)[0]
        with psycopg.connect(url.split("?", 1)[0], autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def measure_engine(engine: str, mb: float, rounds: int, tmp: str) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {"submit": [], "worker": [], "result": [], "raw": []}
    for r in range(rounds):
        url = namespace(engine, tmp)
        try:
            order = ["raw", "submit"] if r % 2 == 0 else ["submit", "raw"]
            for phase in order:
                raw_url = url if engine != "amqp" else namespace("sqlite", tmp)
                results[phase].append(run_probe(raw_url if phase == "raw" else url, phase, mb)["ratio"])
            job = run_probe(url, "prepare-submit", mb)["job"]
            results["worker"].append(run_probe(url, "worker", mb, job)["ratio"])
            job = run_probe(url, "prepare-result", mb)["job"]
            run_probe(url, "worker", mb, job)
            results["result"].append(run_probe(url, "result", mb, job)["ratio"])
        finally:
            cleanup(url)
    return results


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "probe":
        url, phase, mb = sys.argv[2], sys.argv[3], float(sys.argv[4])
        job = sys.argv[5] if len(sys.argv) > 5 else ""
        print(json.dumps(probe(url, phase, mb, job)))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=float, default=200.0, help="payload size in MB (default 200)")
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    print(f"peak resident memory above the phase's start, in multiples of a {args.mb:g} MB payload")
    print(f"{'engine':10} {'submit':>8} {'worker':>8} {'result':>8} {'raw client':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        for engine in args.engines:
            res = measure_engine(engine, args.mb, args.rounds, tmp)

            def cell(xs: list[float]) -> str:
                return f"{statistics.median(xs):.2f}x" if xs else "-"

            print(
                f"{engine:10} {cell(res['submit']):>8} {cell(res['worker']):>8} "
                f"{cell(res['result']):>8} {cell(res['raw']):>11}",
                flush=True,
            )


if __name__ == "__main__":
    main()
