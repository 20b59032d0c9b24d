"""Workflow benchmark: Foundry vs DBOS on SQLite and on the same PostgreSQL, with the
ceiling of one committed insert per step; and the cost per step as workflows grow.

    python bench/workflow.py                 # full run, 3 paired rounds (several minutes)
    python bench/workflow.py --quick         # seconds, SQLite only (the test smoke run)
    python bench/workflow.py --rounds 5 --only foundry-postgres dbos-postgres --skip-growth
    python bench/workflow.py --plain-only    # the step vs a plain INSERT + COMMIT (a minute)
    python bench/workflow.py --latency       # start → first step p50/p99, Foundry vs DBOS

Scenarios, each run to completion by one caller thread, ``--n`` workflows per contender:

* **steps** — a workflow of ``--steps`` (10) no-op steps;
* **fanout** — a workflow that fans out to 10 no-op branches and gathers them (Foundry:
  ``wf.map``; DBOS: ten child workflows started with ``DBOS.start_workflow`` and awaited,
  its documented way to run work in parallel inside a workflow).

Each contender runs in a process of its own (DBOS keeps global state). A *round* runs
every contender once, in the listed order on even rounds and the reverse on odd ones, so
a drift of the shared machine lands on both sides; the ratios are *paired* — Foundry's
rate over DBOS's on the same store in the same round — and the table shows their median
and, in brackets, their range over the rounds.

**vs plain** — the step itself against the code a user would otherwise write: one
workflow of ``--plain-steps`` (3,000) no-op steps against as many plain ``INSERT`` +
``COMMIT`` statements, one per step (SQLite: a file of their own in WAL mode with
``synchronous=FULL``, the journal's own settings; PostgreSQL: psycopg in autocommit on the
same server). The workflow is cut into ``--plain-rounds`` (30) paired rounds of 100
steps: in each, a run of its steps and as many plain statements, in the same thread one
right after the other, Foundry's first on even rounds and the plain ones first on odd, so
a burst of the shared disk lands on both sides of a round. The ratio is Foundry's steps/s over the
plain statements/s, median and range over the rounds; beside it each side's CPU time per
step (the calling thread's), which the disk's noise moves far less.

**growth** (Foundry only): the same total number of steps as workflows of 10, 100 and
1,000 steps, and the replay of each recorded history (the path a resumed run takes). The
cost per step must stay flat: no step may re-read the whole history.

Foundry's SQLite journal runs as shipped (WAL, ``synchronous=full``); DBOS as shipped.
PostgreSQL: Foundry in a private schema, DBOS in a private database, both dropped after.
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

PG = os.environ.get("FOUNDRY_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
ALL = (
    "ceiling-sqlite",
    "foundry-sqlite",
    "dbos-sqlite",
    "ceiling-postgres",
    "foundry-postgres",
    "dbos-postgres",
)
QUICK = ("ceiling-sqlite", "foundry-sqlite")
SCENARIOS = ("steps", "fanout")
FANOUT = 10
GROWTH = (10, 100, 1000)
LATENCY_GAP = 0.01  # seconds between the latency run's starts: 100 a second
LATENCY = ("foundry-sqlite", "dbos-sqlite", "foundry-postgres", "dbos-postgres")
LABELS = {
    "ceiling-sqlite": "one committed insert per step (WAL, synchronous=full)",
    "foundry-sqlite": "Foundry (WAL, synchronous=full: the default)",
    "dbos-sqlite": "DBOS 3 (as shipped)",
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


def _app(url: str) -> tuple[Any, Any, Any, Any]:
    """(app, runtime, the ``sequence`` workflow of no-op steps, the ``fanout`` one) on ``url``."""
    from foundry import Foundry
    from foundry.deliver.workflow import WorkflowContext, configure

    app = Foundry("bench")
    rt = configure(app, journal=url)

    def noop(i: int) -> int:
        return i

    @app.workflow()
    def sequence(wf: WorkflowContext, count: int) -> int:
        for i in range(count):
            wf.step(noop, i)
        return count

    @app.workflow()
    def fanout(wf: WorkflowContext) -> list[int]:
        return list(wf.map(noop, range(FANOUT)))

    return app, rt, sequence, fanout


def foundry(url: str, scenario: str, n: int, steps: int) -> dict[str, float]:
    app, rt, sequence, fanout = _app(url)
    try:
        if scenario == "latency":
            from foundry.deliver.workflow import WorkflowContext

            @app.workflow()
            def timed(wf: WorkflowContext, t0: float) -> float:
                return float(wf.step(_since, t0))

            return _latency(lambda: timed.start(time.perf_counter()), lambda h: h.result(timeout=60), n)
        if scenario == "fanout":
            return {"seconds": _timed(fanout.run, n, 10)}
        if scenario == "steps":
            return {"seconds": _timed(lambda: sequence.run(steps), n, 10)}
        return _growth(app, rt, sequence, n, steps)
    finally:
        app.close()
        rt.close()


def _since(t0: float) -> float:
    """A step that returns how long ago ``t0`` (a ``perf_counter`` reading) was."""
    return time.perf_counter() - t0


def _latency(start: Any, result: Any, n: int) -> dict[str, float]:
    """Start ``n`` workflows in the background one at a time, ``LATENCY_GAP`` apart (far below
    capacity); each one's first step returns how long after its start call it began."""
    for _ in range(5):  # warm-up
        result(start())
    handles = []
    due = time.perf_counter()
    for _ in range(n):
        handles.append(start())
        due += LATENCY_GAP
        time.sleep(max(0.0, due - time.perf_counter()))
    waits = sorted(float(result(h)) for h in handles)
    return {"p50": waits[len(waits) // 2], "p99": waits[min(len(waits) - 1, int(0.99 * len(waits)))]}


def _growth(app: Any, rt: Any, sequence: Any, n: int, steps: int) -> dict[str, float]:
    """``n`` workflows of ``steps`` steps, then the replay of one recorded history."""
    from foundry.deliver.workflow.replay import replay_history

    ids = [f"grow-{steps}-{i}-{uuid.uuid4().hex[:6]}" for i in range(n)]
    sequence.run(steps, id="warm-" + ids[0])
    start = time.perf_counter()
    for workflow_id in ids:
        sequence.run(steps, id=workflow_id)
    seconds = time.perf_counter() - start
    rounds = max(1, 3000 // steps)
    replayed = 0.0
    for _ in range(rounds):
        begin = time.perf_counter()
        state, entries = rt.journal.load(ids[0])  # what a resumed run reads, then replays
        report = replay_history(app.context(), state, entries)
        replayed += time.perf_counter() - begin
        assert report.ok, report
    return {"seconds": seconds, "replay_seconds": replayed / rounds}


def dbos(url: str, scenario: str, n: int, steps: int) -> dict[str, float]:
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
    def sequence() -> int:
        for i in range(steps):
            noop(i)
        return steps

    @DBOS.workflow()
    def branch(i: int) -> int:
        return noop(i)

    @DBOS.workflow()
    def fanout() -> list[int]:
        handles = [DBOS.start_workflow(branch, i) for i in range(FANOUT)]
        return [h.get_result() for h in handles]

    @DBOS.step()
    def since(t0: float) -> float:
        return _since(t0)

    @DBOS.workflow()
    def timed(t0: float) -> float:
        return since(t0)

    DBOS.launch()
    try:
        if scenario == "latency":
            return _latency(
                lambda: DBOS.start_workflow(timed, time.perf_counter()), lambda h: h.get_result(), n
            )
        return {"seconds": _timed(fanout if scenario == "fanout" else sequence, n, 10)}
    finally:
        DBOS.destroy()


def ceiling(url: str, scenario: str, n: int, steps: int) -> dict[str, float]:
    """One committed insert per step (a branch counts as one), nothing else."""
    total = n * (FANOUT if scenario == "fanout" else steps)
    if url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(url[len("sqlite:///") :], isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(f"CREATE TABLE t_{scenario} (id INTEGER PRIMARY KEY, v BLOB)")
        try:
            start = time.perf_counter()
            for _ in range(total):
                conn.execute(f"INSERT INTO t_{scenario} (v) VALUES (?)", (b"1",))
            return {"seconds": time.perf_counter() - start}
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
            return {"seconds": time.perf_counter() - start}
        finally:
            pg.execute(f"DROP TABLE {table}")


def plain_pair(url: str, steps: int, rounds: int) -> dict[str, Any]:
    """One Foundry workflow of ``steps`` no-op steps, cut into ``rounds`` paired rounds:
    in each, a run of its steps and as many plain INSERT + COMMIT statements, measured
    side by side within milliseconds of each other (Foundry's first on even rounds, the
    plain ones first on odd); each side's wall and thread CPU seconds per round."""
    from foundry.deliver.workflow import WorkflowContext

    app, rt, sequence, _ = _app(url)
    insert, close = _plain_inserts(url)
    chunk = max(1, steps // rounds)
    out: dict[str, list[tuple[float, float]]] = {"foundry": [], "plain": []}

    def noop(i: int) -> int:
        return i

    def plain_side(wf: WorkflowContext) -> None:
        for _ in range(chunk):
            insert()

    def foundry_side(wf: WorkflowContext) -> None:
        for i in range(chunk):
            wf.step(noop, i)

    @app.workflow()
    def paired(wf: WorkflowContext, count: int) -> int:
        # a live run executes this body once; the timings stay in this process
        for r in range(count):
            for name, side in (("foundry", foundry_side), ("plain", plain_side))[:: 1 if r % 2 == 0 else -1]:
                cpu, wall = time.thread_time(), time.perf_counter()
                side(wf)
                out[name].append((time.perf_counter() - wall, time.thread_time() - cpu))
        return count

    try:
        sequence.run(50)  # warm: the schema, the statement caches, the pool
        for _ in range(50):
            insert()
        paired.run(rounds)
    finally:
        close()
        app.close()
        rt.close()
    return {"pairs": out, "chunk": chunk}


def _plain_inserts(url: str) -> tuple[Any, Any]:
    """(one plain INSERT + COMMIT, close) on the journal's store: for SQLite a file of its
    own next to the journal, in WAL mode with ``synchronous=FULL`` (the journal's defaults);
    for PostgreSQL psycopg in autocommit on the same server."""
    if url.startswith("sqlite"):
        import sqlite3

        path = url[len("sqlite:///") :].split("?", 1)[0] + "-plain.db"
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE steps (id INTEGER PRIMARY KEY, v BLOB)")
        return (lambda: conn.execute("INSERT INTO steps (v) VALUES (?)", (b"1",))), conn.close
    import psycopg

    pg = psycopg.connect(PG, autocommit=True)
    table = f"bench_plain_{uuid.uuid4().hex[:8]}"
    pg.execute(f"CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, v BYTEA)")
    sql = f"INSERT INTO {table} (v) VALUES (%s)"

    def close() -> None:
        pg.execute(f"DROP TABLE {table}")
        pg.close()

    return (lambda: pg.execute(sql, (b"1",))), close


def child(name: str, scenario: str, n: int, steps: int, workdir: Path) -> dict[str, Any]:
    kind, _, store = name.partition("-")
    if kind == "plain":  # n: the paired rounds, steps: the steps of the one workflow
        if store == "sqlite":
            return plain_pair(f"sqlite:///{workdir / f'plain-{uuid.uuid4().hex[:6]}.db'}", steps, n)
        schema = f"bench_plain_{uuid.uuid4().hex[:8]}"
        try:
            return plain_pair(f"{PG}?schema={schema}", steps, n)
        finally:
            import psycopg

            with psycopg.connect(PG, autocommit=True) as pg:
                pg.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    run = {"foundry": foundry, "dbos": dbos, "ceiling": ceiling}[kind]
    if store == "sqlite":
        path = workdir / f"{name}-{scenario}-{uuid.uuid4().hex[:6]}.db"
        figures = run(f"sqlite:///{path}", scenario, n, steps)
    else:
        figures = _on_postgres(kind, run, scenario, n, steps)
    return {"name": name, "scenario": scenario, "n": n, "steps": steps, **figures}


def _on_postgres(kind: str, run: Any, scenario: str, n: int, steps: int) -> dict[str, float]:
    import psycopg

    tag = uuid.uuid4().hex[:8]
    if kind == "foundry":
        schema = f"bench_wf_{tag}"
        try:
            return run(f"{PG}?schema={schema}", scenario, n, steps)  # type: ignore[no-any-return]
        finally:
            with psycopg.connect(PG, autocommit=True) as pg:
                pg.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    if kind == "dbos":
        db = f"bench_dbos_{tag}"
        with psycopg.connect(PG, autocommit=True) as pg:
            pg.execute(f'CREATE DATABASE "{db}"')
        try:
            return run(PG.rsplit("/", 1)[0] + f"/{db}", scenario, n, steps)  # type: ignore[no-any-return]
        finally:
            with psycopg.connect(PG, autocommit=True) as pg:
                pg.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    return run(PG, scenario, n, steps)  # type: ignore[no-any-return]


# -- the parent: paired rounds, then the tables --------------------------------------------------


def _load() -> str:
    try:
        return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "load average unknown"


def _spawn(name: str, scenario: str, n: int, steps: int, workdir: str) -> dict[str, Any] | None:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        name,
        "--scenario",
        scenario,
        "--n",
        str(n),
        "--steps",
        str(steps),
    ]
    proc = subprocess.run(
        [*cmd, "--workdir", workdir], capture_output=True, text=True, timeout=1800, check=False
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        print(f"{name} {scenario}: failed (exit {proc.returncode})\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=200, help="workflows per contender and round (default 200)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds, alternating order (default 3)")
    parser.add_argument("--only", nargs="+", choices=ALL, help="run only these contenders")
    parser.add_argument("--skip-growth", action="store_true", help="leave out the 10 → 1,000 steps growth")
    parser.add_argument("--quick", action="store_true", help="SQLite only, 20 workflows, one round")
    parser.add_argument("--plain-steps", type=int, default=3000, help="steps of the vs-plain workflow (3000)")
    parser.add_argument(
        "--plain-rounds", type=int, default=30, help="paired rounds the vs-plain workflow is cut into (30)"
    )
    parser.add_argument(
        "--plain-only", action="store_true", help="run only the step vs a plain INSERT + COMMIT"
    )
    parser.add_argument(
        "--skip-plain", action="store_true", help="leave out the step vs a plain INSERT + COMMIT"
    )
    parser.add_argument(
        "--latency",
        action="store_true",
        help="only start→first-step latency: 200 background starts at 100/s, Foundry vs DBOS per store",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--scenario", default="steps", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        figures = child(args.child, args.scenario, args.n, args.steps, Path(args.workdir))
        print(json.dumps(figures), flush=True)
        return 0
    names = list(args.only or (QUICK if args.quick else ALL))
    n = 20 if args.quick and args.n == 200 else args.n
    rounds = 1 if args.quick else args.rounds
    if args.latency:
        return _run_latency([name for name in args.only or LATENCY if name in LATENCY], n, rounds)
    plain: dict[str, dict[str, list[list[float]]]] = {}
    if not args.skip_plain:
        plain_stores = ("sqlite",) if args.quick else ("sqlite", "postgres")
        steps = 200 if args.quick and args.plain_steps == 3000 else args.plain_steps
        plain_rounds = 4 if args.quick and args.plain_rounds == 30 else args.plain_rounds
        with tempfile.TemporaryDirectory(prefix="bench-workflow-") as workdir:
            for store in plain_stores:
                got = _spawn(f"plain-{store}", "plain", plain_rounds, steps, workdir)
                if got is not None:
                    plain[store] = got["pairs"]
        _report_plain(plain, steps, plain_rounds)
        if args.plain_only:
            return 0 if plain else 1
    runs: dict[tuple[str, str], list[float]] = {}
    growth: dict[tuple[str, int], list[dict[str, float]]] = {}
    stores = sorted({name.split("-", 1)[1] for name in names if name.startswith("foundry")})
    sizes = GROWTH[:2] if args.quick else GROWTH
    total_steps = 300 if args.quick else 3000
    with tempfile.TemporaryDirectory(prefix="bench-workflow-") as workdir:
        for r in range(rounds):
            order = names if r % 2 == 0 else names[::-1]
            for scenario in SCENARIOS:
                for name in order:
                    got = _spawn(name, scenario, n, args.steps, workdir)
                    if got is not None:
                        runs.setdefault((name, scenario), []).append(float(got["seconds"]))
            if args.skip_growth:
                continue
            for store in stores:
                for steps in sizes if r % 2 == 0 else sizes[::-1]:
                    got = _spawn(f"foundry-{store}", "growth", max(1, total_steps // steps), steps, workdir)
                    if got is not None:
                        growth.setdefault((store, steps), []).append(got)
    _report(runs, n, args.steps, rounds)
    if growth:
        _report_growth(growth, total_steps)
    return 0 if runs else 1


def _run_latency(names: list[str], n: int, rounds: int) -> int:
    """Paired rounds of the latency scenario, then p50/p99 per contender and Foundry ÷ DBOS."""
    got: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-workflow-") as workdir:
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                figures = _spawn(name, "latency", n, 0, workdir)
                if figures is not None:
                    got.setdefault(name, []).append(figures)
    print(
        f"start → first step, {n} background starts at {1 / LATENCY_GAP:.0f}/s, {rounds} rounds ({_load()})"
    )
    ratios = "Foundry ÷ DBOS per round, p50 and p99: median (range)"
    print(f"{'contender':18} {'p50 ms':>8} {'p99 ms':>8}   {ratios}")
    for name, runs in got.items():
        p50 = statistics.median(f["p50"] for f in runs) * 1e3
        p99 = statistics.median(f["p99"] for f in runs) * 1e3
        cell = ""
        peer = got.get(name.replace("foundry", "dbos")) if name.startswith("foundry") else None
        if peer and len(peer) == len(runs):
            r50 = sorted(f["p50"] / d["p50"] for f, d in zip(runs, peer, strict=True))
            r99 = sorted(f["p99"] / d["p99"] for f, d in zip(runs, peer, strict=True))
            cell = (
                f"   p50 {statistics.median(r50):.2f}× ({r50[0]:.2f}–{r50[-1]:.2f}), "
                f"p99 {statistics.median(r99):.2f}× ({r99[0]:.2f}–{r99[-1]:.2f})"
            )
        print(f"{name:18} {p50:8.2f} {p99:8.2f}{cell}")
    return 0 if got else 1


def _per_step(seconds: float, n: int, scenario: str, steps: int) -> float:
    return seconds / (n * (FANOUT if scenario == "fanout" else steps)) * 1e3


def _paired(runs: dict[tuple[str, str], list[float]], a: str, b: str, scenario: str) -> str:
    """Median (range) over the rounds of ``b``'s seconds ÷ ``a``'s (a's rate over b's)."""
    ours, theirs = runs.get((a, scenario), []), runs.get((b, scenario), [])
    ratios = [t / o for o, t in zip(ours, theirs, strict=False) if o > 0]
    if not ratios:
        return ""
    return f"{statistics.median(ratios):.1f}× ({min(ratios):.1f}–{max(ratios):.1f})"


def _report(runs: dict[tuple[str, str], list[float]], n: int, steps: int, rounds: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=150)
    for scenario in SCENARIOS:
        what = f"{steps} no-op steps" if scenario == "steps" else f"a fan-out of {FANOUT} no-op branches"
        table = Table(
            title=f"{n} workflows × {what}, one caller thread; median of {rounds} paired round(s) "
            f"({_load()})",
            title_justify="left",
        )
        for col in ("store", "system", "workflows/s", "ms/step", "vs DBOS (range)", "× ceiling"):
            table.add_column(col, justify="left" if col in ("store", "system") else "right")
        for name in ALL:
            seconds = runs.get((name, scenario))
            if not seconds:
                continue
            store = name.split("-", 1)[1]
            mid = statistics.median(seconds)
            ms = _per_step(mid, n, scenario, steps)
            ceiling_runs = runs.get((f"ceiling-{store}", scenario))
            times = ""
            if ceiling_runs and not name.startswith("ceiling"):
                times = f"{ms / _per_step(statistics.median(ceiling_runs), n, scenario, steps):.2f}"
            vs = _paired(runs, name, f"dbos-{store}", scenario) if name.startswith("foundry") else ""
            rate = "" if name.startswith("ceiling") else f"{n / mid:,.0f}"
            table.add_row(store, LABELS[name], rate, f"{ms:.3f}", vs, times)
        console.print(table)
    print(
        "vs DBOS: Foundry's workflows/s ÷ DBOS's on the same store, paired per round: median (range). "
        "ms/step: per step or branch, start and finish of each workflow included. × ceiling: ms/step ÷ "
        "one committed insert with the same durability."
    )


def _report_plain(plain: dict[str, dict[str, list[list[float]]]], steps: int, rounds: int) -> None:
    from rich.console import Console
    from rich.table import Table

    chunk = max(1, steps // rounds)
    table = Table(
        title=f"One workflow of {chunk * rounds:,} no-op steps vs as many plain INSERT + COMMIT, one "
        f"thread; {rounds} paired rounds of {chunk} each, alternating order ({_load()})",
        title_justify="left",
    )
    for col in ("store", "system", "ms/step", "CPU µs/step", "vs plain (range)"):
        table.add_column(col, justify="left" if col in ("store", "system") else "right")
    labels = {
        "sqlite": ("INSERT + COMMIT per step (WAL, synchronous=FULL)", "Foundry (WAL, synchronous=full)"),
        "postgres": ("INSERT + COMMIT per step (psycopg, autocommit)", "Foundry"),
    }
    for store, pairs in plain.items():
        ratios = [p[0] / f[0] for f, p in zip(pairs["foundry"], pairs["plain"], strict=False) if f[0] > 0]
        for side, label in zip(("plain", "foundry"), labels[store], strict=True):
            wall = statistics.median(x[0] for x in pairs[side]) / chunk * 1e3
            cpu = statistics.median(x[1] for x in pairs[side]) / chunk * 1e6
            vs = ""
            if side == "foundry" and ratios:
                vs = f"{statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f})"
            table.add_row(store, label, f"{wall:.3f}", f"{cpu:.1f}", vs)
    Console(width=150).print(table)
    print(
        "vs plain: Foundry's steps/s ÷ the plain statements/s, paired per round (the same thread, "
        "alternating order): median (range). ms/step, CPU (the calling thread's, per step): medians "
        "over the rounds."
    )


def _report_growth(growth: dict[tuple[str, int], list[dict[str, float]]], total: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"Foundry: cost per step as workflows grow ({total} steps in all per size; median of rounds)",
        title_justify="left",
    )
    for col in (
        "store",
        "steps per workflow",
        "workflows",
        "ms/step (run)",
        "ms/step (replay)",
        "run vs 10 steps",
    ):
        table.add_column(col, justify="left" if col == "store" else "right")
    for store in sorted({s for s, _ in growth}):
        base: float | None = None
        for steps in GROWTH:
            got = growth.get((store, steps))
            if not got:
                continue
            workflows = max(1, total // steps)
            run_ms = statistics.median(g["seconds"] for g in got) / (workflows * steps) * 1e3
            replay_ms = statistics.median(g["replay_seconds"] for g in got) / steps * 1e3
            base = base or run_ms
            table.add_row(
                store,
                f"{steps:,}",
                str(workflows),
                f"{run_ms:.3f}",
                f"{replay_ms:.4f}",
                f"{run_ms / base:.2f}",
            )
    Console(width=150).print(table)
    print(
        "run: a workflow run start to finish (its start and finish shared by fewer steps as it grows); "
        "replay: reading one recorded history and replaying it against the code, what a resumed run does."
    )


if __name__ == "__main__":
    sys.exit(main())
