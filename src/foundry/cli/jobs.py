"""``foundry jobs``: look into the durable queue, from any machine that reaches it.

    foundry jobs list [--queue Q] [--status S] [--limit 50]
    foundry jobs show ID
    foundry jobs cancel ID [--wait 30s]
    foundry jobs dead [--queue Q]
    foundry jobs requeue ID
    foundry jobs stats [--queue Q]

``cancel`` of a queued job cancels it at once; of a running one it records a request
that the job's worker, on any host, acts on (the job then ends ``cancelled``, never
retried); of a finished one it says so and exits 1.

Reads the store only (``--url URL``, else ``FOUNDRY_QUEUE`` / ``foundry.toml`` /
``<project>/.foundry/queue.db``), so it needs none of the application's code. Every
action says on stderr which store it read (password masked) and where the state
directory came from.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import sys
from contextlib import AbstractContextManager
from typing import Any

from foundry.cli._state import MIN_PREFIX, shared_options
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


_ID = f"the job's id, or its first {MIN_PREFIX} characters or more when no other job's id begins so"


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "jobs", help="list, inspect, cancel and re-queue durable queue jobs (dead letters too)"
    )
    common = shared_options(
        parser,
        (("--url",), {"help": "queue URL (default: FOUNDRY_QUEUE, foundry.toml, <project>/.foundry)"}),
        (("--json",), {"action": "store_true", "help": "print JSON"}),
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    p = actions.add_parser("list", parents=[common], help="recent jobs, newest first")
    p.add_argument("--queue")
    p.add_argument("--status", choices=list(_STYLE))
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(func=_list)
    p = actions.add_parser("show", parents=[common], help="one job: state, arguments, result or error")
    p.add_argument("id", help=_ID)
    p.set_defaults(func=_show)
    p = actions.add_parser(
        "cancel",
        parents=[common],
        help="cancel a queued job, or ask the worker running one to stop it (it ends cancelled)",
    )
    p.add_argument("id", help=_ID)
    p.add_argument(
        "--wait",
        default="0s",
        metavar="DURATION",
        help="wait this long for a running job to end (e.g. 30s); exit 1 if it has not",
    )
    p.set_defaults(func=_cancel)
    p = actions.add_parser("dead", parents=[common], help="the dead-letter store, newest first")
    p.add_argument("--queue")
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(func=_dead)
    p = actions.add_parser("requeue", parents=[common], help="put a dead or failed job back in its queue")
    p.add_argument("id", help=_ID)
    p.set_defaults(func=_requeue)
    p = actions.add_parser("stats", parents=[common], help="depth, age of the oldest job, running, dead")
    p.add_argument("--queue", action="append", help="queues to show (default: those in recent jobs)")
    p.set_defaults(func=_stats)

    def usage(args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(func=usage)


def _opened(args: argparse.Namespace) -> AbstractContextManager[Any]:
    """The queue store the action reads (show, cancel, requeue: a unique prefix names its job)."""
    from foundry.cli._backends import open_store

    return open_store(f"jobs {args.action}", "queue", args.url, id_of=(args, "job"))


def _when(t: float | None) -> str:
    return "" if t is None else dt.datetime.fromtimestamp(t).strftime("%H:%M:%S.%f")[:-3]


def _preview(data: bytes | None, codec: str, width: int = 60) -> str:
    if data is None:
        return ""
    if codec != "json":
        return f"<{codec}, {len(data)} bytes>"
    text = data.decode(errors="replace")
    return text if len(text) <= width else text[: width - 1] + "…"


def _attempts_made(state: Any) -> int:
    """The runs of the job that reached an outcome or are under way: the failures the
    store recorded (its ``attempts``), plus the run that succeeded, the one running now,
    or the one a cancel stopped. Deliveries that died with their worker are not in it
    (``deliveries`` counts those)."""
    ran = state.status.value in ("succeeded", "running") or (
        state.status.value == "cancelled" and state.cancel_requested_at is not None
    )
    return int(state.attempts) + (1 if ran else 0)


def _row(state: Any) -> dict[str, Any]:
    return {
        "id": state.id,
        "unit": state.unit,
        "queue": state.queue,
        "status": state.status.value,
        "deliveries": state.deliveries,
        "attempts": state.attempts,  # failed attempts recorded, as the store and the dashboard say
        "attempts_made": _attempts_made(state),
        "priority": state.priority,
        "key": state.key,
        "enqueued_at": state.enqueued_at,
        "eta": state.eta,
        "finished_at": state.finished_at,
        "dead_reason": state.dead_reason,
        "codec": state.codec,
        "progress": None if state.progress is None else dataclasses.asdict(state.progress),
    }


def _progress(state: Any) -> str:
    return "" if state.progress is None else state.progress.describe()


def _table(states: list[Any], title: str) -> None:
    from rich.table import Table

    table = Table(title=title)
    for col in ("id", "unit", "queue", "status", "progress", "deliv.", "att.", "enqueued", "finished", "why"):
        table.add_column(col, overflow="fold")
    for s in states:
        style = _STYLE.get(s.status.value, "")
        table.add_row(
            s.id,
            s.unit,
            s.queue,
            f"[{style}]{s.status.value}[/{style}]",
            _progress(s),
            str(s.deliveries),
            str(_attempts_made(s)),
            _when(s.enqueued_at),
            _when(s.finished_at),
            s.dead_reason or "",
        )
    console().print(table)


@reports_problems("jobs")
def _list(args: argparse.Namespace) -> int:
    with _opened(args) as backend:
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


@reports_problems("jobs")
def _dead(args: argparse.Namespace) -> int:
    with _opened(args) as backend:
        states = backend.dead_letters(args.queue, limit=args.limit)
        if args.json:
            print(json.dumps([_row(s) for s in states], indent=2))
        else:
            _table(states, f"dead letters in {backend.url}")
            if states:
                print("inspect: foundry jobs show ID   re-queue: foundry jobs requeue ID")
        return 0


def _missing(job_id: str, url: str) -> Problem:
    return Problem(f"no job {job_id!r} in {url}. Fix: check the id (`foundry jobs list`) and --url")


@reports_problems("jobs")
def _show(args: argparse.Namespace) -> int:
    with _opened(args) as backend:
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
        for name in ("queue", "priority", "key", "deliveries"):
            out.print(f"  {name:11} {row[name]}")
        out.print(f"  {'attempts':11} {row['attempts_made']} ({state.attempts} failed)")
        out.print(f"  {'codec':11} {state.codec}")
        for name in ("enqueued_at", "eta", "finished_at"):
            out.print(f"  {name:11} {_when(row[name])}")
        if state.progress is not None:
            out.print(f"  {'progress':11} {_progress(state)} (at {_when(state.progress.at)})", markup=False)
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


def _change(args: argparse.Namespace, action: str, done: str, refused: str) -> int:
    """``requeue`` one job; say why when the store refuses."""

    with _opened(args) as backend:
        if getattr(backend, action)(args.id):
            print(f"job {args.id} {done}")
            return 0
        state = backend.get(args.id)
        if state is None:
            raise _missing(args.id, backend.url)
        print(f"job {args.id} is {state.status.value}: {refused}", file=sys.stderr)
        return 1


_STOPS = (
    "its worker stops it: an isolate=True job's child is killed, an async job's task is cancelled, "
    "a job on a thread stops at its next foundry.execute.checkpoint()"
)


@reports_problems("jobs")
def _cancel(args: argparse.Namespace) -> int:
    from foundry.backends.queue import CancelResult
    from foundry.errors import DeclarationError
    from foundry.traits import parse_duration

    try:
        wait = parse_duration(args.wait, unit="foundry jobs cancel", field_name="--wait")
    except DeclarationError as exc:
        raise Problem(f"--wait {args.wait!r}: {exc.problem}. Fix: {exc.fix}", 2) from exc

    with _opened(args) as backend:
        done = backend.cancel(args.id)
        if done is CancelResult.UNKNOWN:
            raise _missing(args.id, backend.url)
        if done is CancelResult.CANCELLED:
            print(f"job {args.id} cancelled: it will not run")
            return 0
        state = backend.get(args.id)
        if done is not CancelResult.REQUESTED:
            now = "gone" if state is None else state.status.value
            print(f"job {args.id} had already finished ({now}): nothing to cancel", file=sys.stderr)
            return 1
        print(f"job {args.id} is running: cancel requested; {_STOPS}; it then ends cancelled, not retried")
        if wait <= 0:
            return 0
        final = backend.wait(args.id, wait)
        if final is not None and final.status.value == "cancelled":
            print(f"job {args.id} cancelled")
            return 0
        now = "gone" if final is None else final.status.value
        print(
            f"job {args.id} is still {now} after {args.wait}: its worker has not stopped it yet",
            file=sys.stderr,
        )
        return 1


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
    with _opened(args) as backend:
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
            table.add_column(col, justify="right" if col != "queue" else "left", overflow="fold")
        for q, s in rows.items():
            table.add_row(
                q, str(s.depth), f"{s.oldest_age:.2f}s", str(s.scheduled), str(s.running), str(s.dead)
            )
        console().print(table)
        return 0
