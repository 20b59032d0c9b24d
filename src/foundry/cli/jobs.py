"""``foundry jobs``: look into the durable queue, from any machine that reaches it.

    foundry jobs list [--queue Q] [--status S] [--limit 50]
    foundry jobs show ID
    foundry jobs cancel ID
    foundry jobs dead [--queue Q]
    foundry jobs requeue ID
    foundry jobs stats [--queue Q]

Reads the store only (``--url URL``, else ``FOUNDRY_QUEUE`` / ``foundry.toml`` /
``./.foundry/queue.db``), so it needs none of the application's code.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import sys
from typing import Any

from foundry.cli._target import Problem, console, reports_problems

__all__ = ["add_parser"]

_STYLE = {
    "queued": "cyan",
    "running": "yellow",
    "succeeded": "green",
    "failed": "red",
    "dead": "magenta",
    "cancelled": "bright_black",
}


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "jobs", help="list, inspect, cancel and re-queue durable queue jobs (dead letters too)"
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help="queue URL (default: FOUNDRY_QUEUE, foundry.toml, ./.foundry)")
    common.add_argument("--json", action="store_true", help="print JSON")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    p = actions.add_parser("list", parents=[common], help="recent jobs, newest first")
    p.add_argument("--queue")
    p.add_argument("--status", choices=list(_STYLE))
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(func=_list)
    p = actions.add_parser("show", parents=[common], help="one job: state, arguments, result or error")
    p.add_argument("id")
    p.set_defaults(func=_show)
    p = actions.add_parser("cancel", parents=[common], help="cancel a job nobody holds")
    p.add_argument("id")
    p.set_defaults(func=_cancel)
    p = actions.add_parser("dead", parents=[common], help="the dead-letter store, newest first")
    p.add_argument("--queue")
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(func=_dead)
    p = actions.add_parser("requeue", parents=[common], help="put a dead or failed job back in its queue")
    p.add_argument("id")
    p.set_defaults(func=_requeue)
    p = actions.add_parser("stats", parents=[common], help="depth, age of the oldest job, running, dead")
    p.add_argument("--queue", action="append", help="queues to show (default: those in recent jobs)")
    p.set_defaults(func=_stats)

    def usage(args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(func=usage)


def _backend(args: argparse.Namespace) -> Any:
    from foundry.backends.queue import open_queue_backend
    from foundry.config import load_settings

    return open_queue_backend(args.url or load_settings().queue)


def _when(t: float | None) -> str:
    return "" if t is None else dt.datetime.fromtimestamp(t).strftime("%H:%M:%S.%f")[:-3]


def _preview(data: bytes | None, codec: str, width: int = 60) -> str:
    if data is None:
        return ""
    if codec != "json":
        return f"<{codec}, {len(data)} bytes>"
    text = data.decode(errors="replace")
    return text if len(text) <= width else text[: width - 1] + "…"


def _row(state: Any) -> dict[str, Any]:
    return {
        "id": state.id,
        "unit": state.unit,
        "queue": state.queue,
        "status": state.status.value,
        "deliveries": state.deliveries,
        "attempts": state.attempts,
        "priority": state.priority,
        "key": state.key,
        "enqueued_at": state.enqueued_at,
        "eta": state.eta,
        "finished_at": state.finished_at,
        "dead_reason": state.dead_reason,
        "codec": state.codec,
    }


def _table(states: list[Any], title: str) -> None:
    from rich.table import Table

    table = Table(title=title)
    for col in ("id", "unit", "queue", "status", "deliv.", "att.", "enqueued", "finished", "why"):
        table.add_column(col, overflow="fold")
    for s in states:
        style = _STYLE.get(s.status.value, "")
        table.add_row(
            s.id,
            s.unit,
            s.queue,
            f"[{style}]{s.status.value}[/{style}]",
            str(s.deliveries),
            str(s.attempts),
            _when(s.enqueued_at),
            _when(s.finished_at),
            s.dead_reason or "",
        )
    console().print(table)


def _with_backend(args: argparse.Namespace, fn: Any) -> int:
    backend = _backend(args)
    try:
        return int(fn(backend))
    finally:
        backend.close()


@reports_problems("jobs")
def _list(args: argparse.Namespace) -> int:
    def go(backend: Any) -> int:
        lister = getattr(backend, "jobs", None)
        if lister is None:
            raise Problem(
                f"the {type(backend).__name__} engine cannot list jobs. Fix: use `foundry jobs dead`"
            )
        states = lister(queue=args.queue, status=args.status, limit=args.limit)
        if args.json:
            print(json.dumps([_row(s) for s in states], indent=2))
        else:
            _table(states, f"jobs in {backend.url}")
        return 0

    return _with_backend(args, go)


@reports_problems("jobs")
def _dead(args: argparse.Namespace) -> int:
    def go(backend: Any) -> int:
        states = backend.dead_letters(args.queue, limit=args.limit)
        if args.json:
            print(json.dumps([_row(s) for s in states], indent=2))
        else:
            _table(states, f"dead letters in {backend.url}")
            if states:
                print("inspect: foundry jobs show ID   re-queue: foundry jobs requeue ID")
        return 0

    return _with_backend(args, go)


def _missing(job_id: str, url: str) -> Problem:
    return Problem(f"no job {job_id!r} in {url}. Fix: check the id (`foundry jobs list`) and --url")


@reports_problems("jobs")
def _show(args: argparse.Namespace) -> int:
    def go(backend: Any) -> int:
        state = backend.get(args.id)
        if state is None:
            raise _missing(args.id, backend.url)
        row = _row(state)
        error: dict[str, Any] | None = None
        if state.error:
            try:
                error = json.loads(state.error)
            except ValueError:
                error = {"message": state.error.decode(errors="replace")}
        if args.json:
            row["payload"] = _preview(state.payload, state.codec, 10_000)
            row["result"] = _preview(state.result, state.codec, 10_000)
            row["error"] = error
            print(json.dumps(row, indent=2))
            return 0
        out = console()
        style = _STYLE.get(state.status.value, "")
        out.print(f"[bold]{state.unit}[/bold] job {state.id}: [{style}]{state.status.value}[/{style}]")
        for name in ("queue", "priority", "key", "deliveries", "attempts", "codec"):
            out.print(f"  {name:11} {row[name]}")
        for name in ("enqueued_at", "eta", "finished_at"):
            out.print(f"  {name:11} {_when(row[name])}")
        out.print(f"  {'arguments':11} {_preview(state.payload, state.codec, 400)}", markup=False)
        if state.result is not None:
            out.print(f"  {'result':11} {_preview(state.result, state.codec, 400)}", markup=False)
        if state.dead_reason:
            out.print(f"  [magenta]dead letter[/magenta]  {state.dead_reason}")
        if error:
            out.print(f"  {'error':11} {error.get('type', '')}: {error.get('message', '')}", markup=False)
            if error.get("traceback"):
                out.print(str(error["traceback"]).rstrip(), markup=False, style="dim")
        if state.status.value in ("dead", "failed"):
            out.print(f"re-queue with: foundry jobs requeue {state.id}")
        return 0

    return _with_backend(args, go)


def _change(args: argparse.Namespace, action: str, done: str, refused: str) -> int:
    """``cancel`` / ``requeue`` one job; say why when the store refuses."""

    def go(backend: Any) -> int:
        if getattr(backend, action)(args.id):
            print(f"job {args.id} {done}")
            return 0
        state = backend.get(args.id)
        if state is None:
            raise _missing(args.id, backend.url)
        print(f"job {args.id} is {state.status.value}: {refused}", file=sys.stderr)
        return 1

    return _with_backend(args, go)


@reports_problems("jobs")
def _cancel(args: argparse.Namespace) -> int:
    return _change(args, "cancel", "cancelled", "only a queued job can be cancelled")


@reports_problems("jobs")
def _requeue(args: argparse.Namespace) -> int:
    return _change(
        args,
        "requeue",
        "is back in its queue with fresh counters",
        "only dead or failed jobs can be re-queued",
    )


@reports_problems("jobs")
def _stats(args: argparse.Namespace) -> int:
    def go(backend: Any) -> int:
        queues = args.queue
        if not queues:
            lister = getattr(backend, "jobs", None)
            recent = lister(limit=500) if lister is not None else backend.dead_letters(limit=500)
            queues = sorted({s.queue for s in recent}) or ["default"]
        rows = {q: backend.stats(q) for q in queues}
        if args.json:
            print(json.dumps({q: dataclasses.asdict(s) for q, s in rows.items()}, indent=2))
            return 0
        from rich.table import Table

        table = Table(title=f"queues in {backend.url}")
        for col in ("queue", "depth", "oldest age", "scheduled", "running", "dead"):
            table.add_column(col, justify="right" if col != "queue" else "left")
        for q, s in rows.items():
            table.add_row(
                q, str(s.depth), f"{s.oldest_age:.2f}s", str(s.scheduled), str(s.running), str(s.dead)
            )
        console().print(table)
        return 0

    return _with_backend(args, go)
