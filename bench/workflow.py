"""Workflow benchmark: a 10-step no-op workflow, Foundry vs DBOS, on SQLite and on the
same PostgreSQL, against the ceiling of one committed insert per step.

    python bench/workflow.py                 # full run (about a minute)
    python bench/workflow.py --quick         # a few seconds, SQLite only (the test smoke run)
    python bench/workflow.py --n 500 --only foundry-postgres dbos-postgres

Each contender runs in its own process (DBOS keeps global state), one after another, the
same number of workflows, sequentially in one thread (the apples-to-apples case: a
caller running a workflow to completion). Foundry's SQLite journal runs as shipped (WAL,
``synchronous=full``: every step durable on disk); ``foundry-sqlite-normal`` trades power-
loss durability of the last commits for speed. DBOS runs as shipped (SQLite: rollback
journal) and, as ``dbos-sqlite-wal``, on a database file switched to WAL beforehand.
PostgreSQL: Foundry in a private schema, DBOS in a private database, both dropped after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

PG = os.environ.get("FOUNDRY_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
ALL = (
    "ceiling-sqlite",
    "ceiling-sqlite-normal",
    "foundry-sqlite",
    "foundry-sqlite-normal",
    "dbos-sqlite",
    "dbos-sqlite-wal",
    "ceiling-postgres",
    "foundry-postgres",
    "dbos-postgres",
)
QUICK = ("ceiling-sqlite", "foundry-sqlite")
# which ceiling each contender is measured against (the same durability setting)
CEILING = {
    "foundry-sqlite": "ceiling-sqlite",
    "foundry-sqlite-normal": "ceiling-sqlite-normal",
    "dbos-sqlite": "ceiling-sqlite",
    "dbos-sqlite-wal": "ceiling-sqlite",
    "foundry-postgres": "ceiling-postgres",
    "dbos-postgres": "ceiling-postgres",
}
LABELS = {
    "ceiling-sqlite": "one committed insert per step (WAL, synchronous=full)",
    "ceiling-sqlite-normal": "one committed insert per step (WAL, synchronous=normal)",
    "foundry-sqlite": "Foundry (WAL, synchronous=full: the default)",
    "foundry-sqlite-normal": "Foundry (?synchronous=normal)",
    "dbos-sqlite": "DBOS 3 (as shipped)",
    "dbos-sqlite-wal": "DBOS 3 (file switched to WAL)",
    "ceiling-postgres": "one committed insert per step",
    "foundry-postgres": "Foundry",
    "dbos-postgres": "DBOS 3",
}


# -- the contenders (each runs in a child process) ------------------------------------------


def _timed(run_one: Any, n: int, warmup: int) -> float:
    for _ in range(warmup):
        run_one()
    start = time.perf_counter()
    for _ in range(n):
        run_one()
    return time.perf_counter() - start


def foundry(url: str, n: int, steps: int) -> float:
    from foundry import Foundry
    from foundry.deliver.workflow import WorkflowContext, configure

    app = Foundry("bench")
    rt = configure(app, journal=url)

    def noop(i: int) -> int:
        return i

    @app.workflow()
    def ten(wf: WorkflowContext) -> int:
        for i in range(steps):
            wf.step(noop, i)
        return steps

    try:
        return _timed(ten.run, n, 20)
    finally:
        app.close()
        rt.close()


def dbos(url: str, n: int, steps: int) -> float:
    import logging

    from dbos import DBOS

    logging.getLogger("dbos").setLevel(logging.WARNING)
    DBOS(
        config={
            "name": "bench",
            "system_database_url": url,
            "run_admin_server": False,
            "log_level": "WARNING",
        }
    )

    @DBOS.step()
    def noop(i: int) -> int:
        return i

    @DBOS.workflow()
    def ten() -> int:
        for i in range(steps):
            noop(i)
        return steps

    DBOS.launch()
    try:
        return _timed(ten, n, 20)
    finally:
        DBOS.destroy()


def ceiling(url: str, n: int, steps: int) -> float:
    """One committed insert per step, nothing else: the floor any journal pays."""
    total = n * steps
    if url.startswith("sqlite"):
        import sqlite3

        path, _, query = url[len("sqlite:///") :].partition("?")
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={'NORMAL' if 'normal' in query else 'FULL'}")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")
        try:
            start = time.perf_counter()
            for _ in range(total):
                conn.execute("INSERT INTO t (v) VALUES (?)", (b"1",))
            return time.perf_counter() - start
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url, autocommit=True) as pg:
        table = f"bench_ceiling_{uuid.uuid4().hex[:8]}"
        pg.execute(f"CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, v BYTEA)")
        try:
            start = time.perf_counter()
            for _ in range(total):
                pg.execute(f"INSERT INTO {table} (v) VALUES (%s)", (b"1",))
            return time.perf_counter() - start
        finally:
            pg.execute(f"DROP TABLE {table}")


def child(name: str, n: int, steps: int, workdir: Path) -> dict[str, Any]:
    kind, _, store = name.partition("-")
    if store.startswith("sqlite"):
        path = workdir / f"{name}.db"
        url = f"sqlite:///{path}"
        if name.endswith("-normal"):
            url += "?synchronous=normal"
        if name == "dbos-sqlite-wal":
            import sqlite3

            conn = sqlite3.connect(path)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.close()
        seconds = {"foundry": foundry, "dbos": dbos, "ceiling": ceiling}[kind](url, n, steps)
    else:
        seconds = _on_postgres(kind, n, steps)
    return {"name": name, "n": n, "steps": steps, "seconds": seconds}


def _on_postgres(kind: str, n: int, steps: int) -> float:
    import psycopg

    tag = uuid.uuid4().hex[:8]
    if kind == "foundry":
        schema = f"bench_wf_{tag}"
        try:
            return foundry(f"{PG}?schema={schema}", n, steps)
        finally:
            with psycopg.connect(PG, autocommit=True) as pg:
                pg.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    if kind == "dbos":
        db = f"bench_dbos_{tag}"
        with psycopg.connect(PG, autocommit=True) as pg:
            pg.execute(f'CREATE DATABASE "{db}"')
        try:
            return dbos(PG.rsplit("/", 1)[0] + f"/{db}", n, steps)
        finally:
            with psycopg.connect(PG, autocommit=True) as pg:
                pg.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    return ceiling(PG, n, steps)


# -- the parent: run each, print the table ----------------------------------------------------


def _load() -> str:
    try:
        return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "load average unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=300, help="workflows per contender (default 300)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--only", nargs="+", choices=ALL, help="run only these contenders")
    parser.add_argument("--quick", action="store_true", help="SQLite only, 30 workflows")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.n, args.steps, Path(args.workdir))), flush=True)
        return 0
    names = args.only or (QUICK if args.quick else ALL)
    n = 30 if args.quick and args.n == 300 else args.n
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-workflow-") as workdir:
        for name in names:
            cmd = [sys.executable, __file__, "--child", name, "--n", str(n), "--steps", str(args.steps)]
            proc = subprocess.run(
                [*cmd, "--workdir", workdir], capture_output=True, text=True, timeout=900, check=False
            )
            lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
            if proc.returncode != 0 or not lines:
                print(f"{name}: failed (exit {proc.returncode})\n{proc.stderr[-2000:]}", file=sys.stderr)
                continue
            results[name] = json.loads(lines[-1])
    _report(results, n, args.steps)
    return 0 if results else 1


def _report(results: dict[str, dict[str, Any]], n: int, steps: int) -> None:
    from rich.console import Console
    from rich.table import Table

    def per_step(name: str) -> float | None:
        r = results.get(name)
        return None if r is None else float(r["seconds"]) / (n * steps) * 1e3

    table = Table(title=f"{n} workflows × {steps} no-op steps, one thread ({_load()})", title_justify="left")
    for col in ("store", "system", "workflows/s", "ms/step", "vs DBOS", "× ceiling", "overhead ms/step"):
        table.add_column(col, justify="left" if col in ("store", "system") else "right")
    for name in ALL:
        ms = per_step(name)
        if ms is None:
            continue
        store = "postgres" if name.endswith("postgres") else "sqlite"
        rate = 1e3 / (ms * steps)
        dbos_ms = per_step(f"dbos-{store}")
        ceil_ms = per_step(CEILING.get(name, ""))
        vs = f"{dbos_ms / ms:.1f}×" if dbos_ms and name.startswith("foundry") else ""
        over = f"{ms / ceil_ms:.2f}" if ceil_ms else ""
        extra = f"{ms - ceil_ms:+.3f}" if ceil_ms else ""
        table.add_row(store, LABELS[name], f"{rate:,.0f}", f"{ms:.3f}", vs, over, extra)
    Console(width=140).print(table)
    print(
        "vs DBOS: Foundry's workflows/s ÷ DBOS's as shipped on the same store. × ceiling: ms/step ÷ one "
        "committed insert with the same durability (1.00 = a journal with no cost beyond that insert); "
        "overhead: the ms per step above it (start and finish of each workflow included)."
    )


if __name__ == "__main__":
    sys.exit(main())
