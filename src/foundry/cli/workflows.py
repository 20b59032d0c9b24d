"""``foundry workflows``: list, inspect, cancel and signal workflows; run a worker;
replay recorded histories against new code; reset a finished run.

    foundry workflows list [--status S] [--name N] [--limit 50]
    foundry workflows show ID                  # state, history, inbox, published state, child tree
    foundry workflows query ID                 # the state the run published (wf.publish)
    foundry workflows cancel ID
    foundry workflows signal ID NAME JSON
    foundry workflows reset ID --step NAME     # run it again from a completed step (a new id)
    foundry workflows export [ID ...] > histories.json
    foundry workflows replay MODULE[:APP] [--from histories.json] [--id ID ...]
    foundry workflows purge --older-than 7d
    foundry workflows worker MODULE[:APP] [--concurrency 8] [--lease 30]

Every command but ``worker`` and ``replay`` reads the journal only (``--journal URL``,
else ``FOUNDRY_JOURNAL`` / ``foundry.toml`` / ``./.foundry/journal.db``), so it works
from any machine that can reach the database, without the application's code.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from foundry.backends.journal.base import Entry, JournalBackend, SignalRecord, WorkflowState, WorkflowStatus
from foundry.cli._state import MIN_PREFIX, shared_options
from foundry.cli._target import console, reports_problems

__all__ = ["add_parser", "history_table", "load_app", "summary_table"]

_STATUS_STYLE = {
    "pending": "cyan",
    "running": "yellow",
    "waiting": "blue",
    "compensating": "magenta",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "bright_black",
    "timed_out": "red3",
    "ok": "green",
    "error": "red",
}


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "workflows", help="list, show, cancel and signal durable workflows; run a workflow worker"
    )
    common = shared_options(
        parser,
        (
            ("--journal",),
            {"help": "journal URL (default: FOUNDRY_JOURNAL, foundry.toml, <project>/.foundry)"},
        ),
    )
    cmds = parser.add_subparsers(dest="workflows_command", metavar="ACTION")

    p = cmds.add_parser("list", parents=[common], help="workflows, newest first")
    p.add_argument("--status", choices=[s.value for s in WorkflowStatus])
    p.add_argument("--name", help="only workflows of this name")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_list)

    p = cmds.add_parser(
        "show", parents=[common], help="one workflow: state, step history, compensation, inbox, children"
    )
    p.add_argument("id", help=f"the workflow's id, or its first {MIN_PREFIX} characters or more when unique")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=_show)

    p = cmds.add_parser(
        "query",
        parents=[common],
        help="the state a workflow published (wf.publish), read without touching it",
    )
    p.add_argument("id", help=f"the workflow's id, or its first {MIN_PREFIX} characters or more when unique")
    p.set_defaults(func=_query)

    p = cmds.add_parser(
        "reset",
        parents=[common],
        help="run a finished workflow again from a completed step, as a new workflow that keeps the "
        "steps before it",
    )
    p.add_argument("id", help=f"the finished workflow's id (or a unique prefix of {MIN_PREFIX}+ characters)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--step", help="the name of the completed step to restart from")
    where.add_argument("--position", type=int, help="its position (`foundry workflows show` lists them)")
    p.add_argument("--new-id", help="the new workflow's id (default: <id>~reset-<hex>)")
    p.set_defaults(func=_reset)

    p = cmds.add_parser(
        "export", parents=[common], help="write recorded histories as JSON, for `workflows replay --from`"
    )
    p.add_argument("ids", nargs="*", help="workflow ids (default: the newest --limit)")
    p.add_argument("--name", help="only workflows of this name")
    p.add_argument("--status", choices=[s.value for s in WorkflowStatus])
    p.add_argument("--limit", type=int, default=100)
    p.set_defaults(func=_export)

    p = cmds.add_parser(
        "replay",
        parents=[common],
        help="replay recorded histories against the code of an app (module:app) and report the first "
        "non-deterministic step; exit 1 if any",
    )
    p.add_argument("app", help="import path of the app: package.module or package.module:app")
    p.add_argument(
        "--id",
        dest="ids",
        action="append",
        default=[],
        help="a workflow id (repeat; default: the newest --limit)",
    )
    p.add_argument("--from", dest="source", help="histories written by `foundry workflows export`")
    p.add_argument("--name", help="only workflows of this name")
    p.add_argument("--status", choices=[s.value for s in WorkflowStatus])
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_replay)

    p = cmds.add_parser(
        "cancel", parents=[common], help="request cancellation; completed steps are compensated"
    )
    p.add_argument("id")
    p.set_defaults(func=_cancel)

    p = cmds.add_parser("signal", parents=[common], help="send a signal (JSON payload) to a workflow's inbox")
    p.add_argument("id")
    p.add_argument("name")
    p.add_argument("payload", nargs="?", default="null", help="JSON (default: null)")
    p.set_defaults(func=_signal)

    p = cmds.add_parser(
        "purge", parents=[common], help="delete workflows that finished longer ago than --older-than"
    )
    p.add_argument("--older-than", required=True, help='e.g. "7d", "12h"')
    p.set_defaults(func=_purge)

    p = cmds.add_parser(
        "worker", parents=[common], help="run the workflows of an app (module:app) until stopped"
    )
    p.add_argument("app", help="import path of the app: package.module or package.module:app")
    p.add_argument("--concurrency", type=int, default=8, help="workflows run at once (default 8)")
    p.add_argument("--lease", type=float, default=30.0, help="lease seconds; heartbeats every lease/3")
    p.add_argument("--poll", type=float, default=0.5, help="seconds between claims when idle")
    p.add_argument("--inline-wait", type=float, default=1.0, help="waits shorter than this block a thread")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_worker)

    def usage(args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(func=usage)


# -- helpers ------------------------------------------------------------------------


def _opened(args: argparse.Namespace) -> AbstractContextManager[JournalBackend]:
    """The journal the command reads (show, cancel, signal: a unique prefix names its workflow)."""
    from foundry.cli._backends import open_store

    return open_store(
        f"workflows {args.workflows_command}",
        "journal",
        args.journal,
        "--journal",
        id_of=(args, "workflow"),
    )


def _ago(t: float | None, now: float) -> str:
    if t is None:
        return "-"
    return f"{_dur(now - t)} ago" if now >= t else f"in {_dur(t - now)}"


def _dur(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return "-"
    if math.isinf(seconds):
        return "∞"
    seconds = abs(seconds)
    if seconds < 1:
        return f"{seconds * 1000:.1f}ms"
    if seconds < 120:
        return f"{seconds:.2f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _preview(data: bytes | None, limit: int = 60) -> str:
    if data is None:
        return ""
    try:
        text = json.dumps(json.loads(data), separators=(",", ":"))
    except ValueError:
        text = f"<{len(data)} bytes>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _error_text(data: bytes | None, limit: int = 80) -> str:
    if not data:
        return ""
    try:
        record = json.loads(data)
        text = f"{str(record.get('type', '?')).rsplit('.', 1)[-1]}: {record.get('message', '')}"
    except ValueError:
        text = "<unreadable error>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _styled(value: str) -> str:
    style = _STATUS_STYLE.get(value)
    return f"[{style}]{value}[/{style}]" if style else value


def _entry_detail(e: Entry, now: float) -> str:
    if e.kind == "undo":
        text = f"undoes #{e.ref}"
        return f"{text}; {_error_text(e.error)}" if e.error else text
    if e.status == "error":
        return _error_text(e.error)
    if e.status == "waiting":
        if e.kind == "step" and e.detail == "running":
            return f"running; its timeout is {_ago(e.wake_at, now)}"
        if e.kind == "step":
            return f"retry {_ago(e.wake_at, now)} after {_error_text(e.error, 50)}"
        if e.kind == "gather":
            return f"fan-out of {e.detail} branches"
        if e.kind == "child":
            return f"child {e.detail}"
        return (
            "until a signal"
            if e.wake_at is None or math.isinf(e.wake_at)
            else f"wakes {_ago(e.wake_at, now)}"
        )
    if e.kind == "child":
        return f"child {e.detail} → {_preview(e.result, 40)}"
    if e.kind == "signal":
        return "timed out" if e.detail == "timeout" else f"{e.detail}: {_preview(e.result, 40)}"
    if e.kind == "cancel":
        return f"cancelled (before {e.detail} {e.name!r})" if e.detail else "cancelled"
    if e.kind == "timeout":
        return f"timed out (at {e.detail} {e.name!r})" if e.detail else "timed out"
    if e.kind == "gather":
        return f"{e.detail} branches" + (f"; branch #{e.ref} failed" if e.ref is not None else "")
    if e.kind == "patch":
        return "new code path taken"
    if e.kind == "sleep":
        return e.detail or ""
    text = _preview(e.result, 48)
    if e.kind == "step" and e.ref is not None:
        text = f"branch of #{e.ref}: {text}"
    return f"{text}  [dim](transactional)[/dim]" if e.detail == "transactional" else text


def summary_table(state: WorkflowState, now: float | None = None) -> Any:
    """A two-column table describing one workflow's state."""
    from rich.table import Table

    now = time.time() if now is None else now
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", overflow="fold")
    table.add_column(overflow="fold")
    ended = state.finished_at or now
    rows = [
        ("workflow", f"{state.name}  [dim]{state.id}[/dim]"),
        (
            "status",
            _styled(state.status.value)
            + (
                "  [red](cancel requested)[/red]"
                if state.cancel_requested and not state.status.finished
                else ""
            ),
        ),
        (
            "compensation",
            {
                "": "none",
                "running": "running",
                "done": "done (every undo ran)",
                "partial": "[red]partial: an undo failed for good[/red]",
            }.get(state.compensation, state.compensation),
        ),
        ("now", state.current_step or ("-" if state.status.finished else f"position {state.position}")),
        ("runs", f"{state.claims} (resumptions after a crash, a wake-up or a hand-back add one)"),
        (
            "created",
            f"{_ago(state.created_at, now)}; {'took' if state.finished_at else 'running for'} "
            f"{_dur(ended - state.created_at)}",
        ),
    ]
    if state.deadline is not None:
        rows.append(("deadline", f"{_ago(state.deadline, now)} (its timeout)"))
    if state.origin:
        rows.append(("origin", state.origin))
    if state.published:
        rows.append(("published", _preview(state.published, 200)))
    if state.owner and not state.status.finished:
        rows.append(
            ("owner", f"{state.owner} (lease {_ago(state.lease_until, now).replace(' ago', ' overdue')})")
        )
    if state.status.value == "waiting":
        rows.append(("wakes", "on an event" if math.isinf(state.wake_at) else _ago(state.wake_at, now)))
    if state.parent_id:
        rows.append(("parent", f"{state.parent_id} (position {state.parent_position})"))
    if state.result is not None:
        rows.append(("result", _preview(state.result, 100)))
    if state.error:
        rows.append(("error", f"[red]{_error_text(state.error, 1000)}[/red]"))
    for key, value in rows:
        table.add_row(key, value)
    return table


def history_table(state: WorkflowState, entries: list[Entry], now: float | None = None) -> Any:
    """The step history: one row per journal entry, with attempts and timings."""
    from rich.table import Table

    now = time.time() if now is None else now
    table = Table(title=f"history of {state.id}", title_justify="left", show_lines=False)
    for name, opts in (
        ("#", {"justify": "right"}),
        ("kind", {}),
        ("name", {"overflow": "fold"}),
        ("status", {}),
        ("tries", {"justify": "right"}),
        ("at", {"justify": "right"}),
        ("took", {"justify": "right"}),
        ("detail", {"overflow": "fold"}),
    ):
        table.add_column(name, **opts)  # type: ignore[arg-type]
    for e in entries:
        took = None if e.finished_at is None else e.finished_at - e.started_at
        kind = f"[magenta]{e.kind}[/magenta]" if e.kind in ("undo", "cancel") else e.kind
        table.add_row(
            str(e.position),
            kind,
            e.name,
            _styled(e.status),
            str(e.attempts) if e.attempts else "",
            f"+{_dur(e.started_at - state.created_at)}",
            _dur(took) if took is not None else "…",
            _entry_detail(e, now),
        )
    return table


def _inbox_table(signals: list[SignalRecord]) -> Any:
    from rich.table import Table

    table = Table(title="inbox (signals)", title_justify="left")
    for col in ("#", "name", "payload", "consumed"):
        table.add_column(col, overflow="fold")
    for s in signals:
        used = "waiting" if s.consumed_position is None else f"at position {s.consumed_position}"
        table.add_row(str(s.seq), s.name, _preview(s.payload), used)
    return table


def _state_json(state: WorkflowState) -> dict[str, Any]:
    return {
        "id": state.id,
        "name": state.name,
        "status": state.status.value,
        "compensation": state.compensation,
        "current_step": state.current_step,
        "position": state.position,
        "runs": state.claims,
        "owner": state.owner,
        "cancel_requested": state.cancel_requested,
        "parent_id": state.parent_id,
        "created_at": state.created_at,
        "updated_at": state.updated_at,
        "finished_at": state.finished_at,
        "wake_at": None if math.isinf(state.wake_at) else state.wake_at,
        "result": None if state.result is None else json.loads(state.result),
        "error": None if not state.error else json.loads(state.error),
        "deadline": state.deadline,
        "origin": state.origin,
        "published": None if not state.published else json.loads(state.published),
    }


# -- commands ---------------------------------------------------------------------------


@reports_problems("workflows")
def _list(args: argparse.Namespace) -> int:
    from rich.table import Table

    with _opened(args) as journal:
        states = journal.workflows(status=args.status, name=args.name, limit=args.limit)
        now = journal.clock.time()
    if args.json:
        print(json.dumps([_state_json(s) for s in states], indent=2))
        return 0
    table = Table(title=f"workflows ({len(states)} shown)", title_justify="left")
    for col in ("id", "workflow", "status", "now", "compensation", "runs", "created", "took"):
        table.add_column(col, overflow="fold")
    for s in states:
        took = (s.finished_at or now) - s.created_at
        table.add_row(
            s.id,
            s.name,
            _styled(s.status.value)
            + (" [red]✗cancel[/red]" if s.cancel_requested and not s.status.finished else ""),
            s.current_step or ("" if s.status.finished else f"#{s.position}"),
            s.compensation or "",
            str(s.claims),
            _ago(s.created_at, now),
            _dur(took),
        )
    console().print(table)
    return 0


@reports_problems("workflows")
def _show(args: argparse.Namespace) -> int:
    with _opened(args) as journal:
        state, entries = journal.load(args.id)
        inbox = journal.signals(args.id)
        tree = _children(journal, args.id)
        now = journal.clock.time()
    children = tree.get(args.id, [])
    if args.json:
        out = _state_json(state)
        out["history"] = [
            {
                "position": e.position,
                "kind": e.kind,
                "name": e.name,
                "status": e.status,
                "attempts": e.attempts,
                "started_at": e.started_at,
                "finished_at": e.finished_at,
                "ref": e.ref,
                "detail": e.detail,
                "wake_at": None if e.wake_at is None or math.isinf(e.wake_at) else e.wake_at,
                "result": None if e.result is None else json.loads(e.result),
                "error": None if e.error is None else json.loads(e.error),
            }
            for e in entries
        ]
        out["signals"] = [
            {"seq": s.seq, "name": s.name, "consumed_position": s.consumed_position} for s in inbox
        ]
        out["children"] = [c.id for c in children]
        out["tree"] = _tree_json(tree, args.id)
        print(json.dumps(out, indent=2))
        return 0
    out = console()
    out.print(summary_table(state, now))
    out.print(history_table(state, entries, now))
    if inbox:
        out.print(_inbox_table(inbox))
    if children:
        out.print(child_tree(state, tree))
    return 0


_TREE_LIMIT = 1000  # descendants shown (a fan-out of children can be wide)


def _children(journal: JournalBackend, root: str) -> dict[str, list[WorkflowState]]:
    """The descendants of ``root``, by parent id (breadth first, at most ``_TREE_LIMIT``)."""
    tree: dict[str, list[WorkflowState]] = {}
    todo, seen = [root], 0
    while todo and seen < _TREE_LIMIT:
        parent = todo.pop(0)
        kids = sorted(
            journal.workflows(parent_id=parent, limit=_TREE_LIMIT), key=lambda c: c.parent_position or 0
        )
        tree[parent] = kids
        seen += len(kids)
        todo.extend(k.id for k in kids)
    return tree


def _tree_json(tree: dict[str, list[WorkflowState]], node: str) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "name": c.name, "status": c.status.value, "children": _tree_json(tree, c.id)}
        for c in tree.get(node, [])
    ]


def child_tree(state: WorkflowState, tree: dict[str, list[WorkflowState]]) -> Any:
    """The workflow and its children, grandchildren …, each with its status and step."""
    from rich.tree import Tree

    def label(s: WorkflowState) -> str:
        now = s.current_step or ("" if s.status.finished else f"#{s.position}")
        where = "" if s.parent_position is None else f"[dim]@{s.parent_position}[/dim] "
        return f"{where}[bold]{s.id}[/bold] ({s.name}) {_styled(s.status.value)} {now}".rstrip()

    root = Tree(label(state), guide_style="dim")

    def grow(node: Any, workflow_id: str) -> None:
        for kid in tree.get(workflow_id, []):
            grow(node.add(label(kid)), kid.id)

    grow(root, state.id)
    return root


@reports_problems("workflows")
def _query(args: argparse.Namespace) -> int:
    from foundry.deliver.workflow.reset import published_state
    from foundry.errors import NotFoundError

    with _opened(args) as journal:
        state = journal.get(args.id)
    if state is None:
        raise NotFoundError(
            f"no workflow with id {args.id!r}. Fix: check the id with `foundry workflows list`"
        )
    print(json.dumps(published_state(state), indent=2))
    return 0


@reports_problems("workflows")
def _reset(args: argparse.Namespace) -> int:
    from foundry.deliver.workflow.reset import fork_run

    with _opened(args) as journal:
        started = fork_run(journal, args.id, step=args.step, position=args.position, new_id=args.new_id)
    print(
        f"{started.state.id}: {started.state.origin}; it keeps the steps before that and is pending "
        "(a worker running its app runs it)"
    )
    return 0


@reports_problems("workflows")
def _export(args: argparse.Namespace) -> int:
    from foundry.deliver.workflow.replay import export_history

    with _opened(args) as journal:
        ids = args.ids or [
            s.id for s in journal.workflows(status=args.status, name=args.name, limit=args.limit)
        ]
        docs = [export_history(*journal.load(i)) for i in ids]
    print(json.dumps(docs, indent=1))
    return 0


@reports_problems("workflows")
def _replay(args: argparse.Namespace) -> int:
    from foundry.deliver.workflow.replay import replay

    app = load_app(args.app)
    with nullcontext() if args.source else _opened(args) as journal:
        reports = replay(
            app,
            journal=journal,
            histories=args.source,
            ids=args.ids,
            name=args.name,
            status=args.status,
            limit=args.limit,
        )
    bad = [r for r in reports if not r.ok]
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "id": r.workflow_id,
                        "name": r.name,
                        "recorded": r.recorded,
                        "ok": r.ok,
                        "checked": r.checked,
                        "position": r.position,
                        "problem": r.problem,
                    }
                    for r in reports
                ],
                indent=2,
            )
        )
        return 1 if bad else 0
    from rich.table import Table

    table = Table(title=f"replay of {len(reports)} recorded histories", title_justify="left")
    for col in ("id", "workflow", "recorded", "verdict", "positions", "first difference"):
        table.add_column(col, overflow="fold")
    for r in reports:
        verdict = "[green]replays[/green]" if r.ok else "[red]diverges[/red]"
        where = "" if r.ok else f"#{r.position}: {r.problem}"
        table.add_row(r.workflow_id, r.name, _styled(r.recorded), verdict, str(r.checked), where)
    console().print(table)
    if bad:
        print(
            f"{len(bad)} of {len(reports)} histories diverge: runs in flight would fail with "
            "NonDeterminismError. Fix: keep the old paths behind `if wf.patched(...)`",
            file=sys.stderr,
        )
        return 1
    return 0


@reports_problems("workflows")
def _cancel(args: argparse.Namespace) -> int:
    with _opened(args) as journal:
        accepted = journal.request_cancel(args.id)
    if accepted:
        print(
            f"cancellation of {args.id} requested: it stops at its next durable call and undoes its "
            "completed steps (a worker running its app does this)"
        )
        return 0
    print(f"{args.id} already finished; nothing to cancel", file=sys.stderr)
    return 1


@reports_problems("workflows")
def _signal(args: argparse.Namespace) -> int:
    from foundry.errors import SubmitError

    try:
        payload = json.loads(args.payload)
    except ValueError as exc:
        raise SubmitError(
            f"signal {args.name!r} to {args.id}: payload {args.payload!r} is not JSON ({exc}). "
            """Fix: quote it for the shell, e.g. '{"approved": true}' or '"yes"'"""
        ) from exc
    with _opened(args) as journal:
        seq = journal.signal(args.id, args.name, json.dumps(payload, separators=(",", ":")).encode())
    print(f"signal {args.name!r} #{seq} delivered to the inbox of {args.id}")
    return 0


@reports_problems("workflows")
def _purge(args: argparse.Namespace) -> int:
    from foundry.traits import parse_duration

    age = parse_duration(args.older_than, unit="workflows purge", field_name="--older-than")
    with _opened(args) as journal:
        removed = journal.purge(journal.clock.time() - age)
    print(f"purged {removed} workflow(s) that finished more than {args.older_than} ago")
    return 0


def load_app(spec: str) -> Any:
    """The Foundry app at ``module[:attribute]`` (or a ``file.py``); without an attribute
    the module must hold exactly one app."""
    from foundry.app import Foundry
    from foundry.cli._target import Problem, find_apps, load_module

    module_name, _, attr = spec.rpartition(":") if ":" in spec else (spec, "", "")
    module = load_module(module_name)
    if attr:
        app = getattr(module, attr, None)
        if not isinstance(app, Foundry):
            raise Problem(
                f"{module_name!r} has no Foundry app named {attr!r}. Fix: name the app after the colon"
            )
        return app
    apps = find_apps(module)
    if len(apps) != 1:
        raise Problem(
            f"{module_name!r} holds {len(apps)} Foundry apps. Fix: name one, e.g. {module_name}:app", 2
        )
    return apps[0]


@reports_problems("workflows")
def _worker(args: argparse.Namespace) -> int:
    import logging

    from foundry.deliver.workflow import Worker

    app = load_app(args.app)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO, format="%(asctime)s %(name)s %(message)s"
    )
    worker = Worker(
        app,
        journal=args.journal,
        concurrency=args.concurrency,
        lease=args.lease,
        poll=args.poll,
        inline_wait=args.inline_wait,
    )

    def stop(signum: int, frame: Any) -> None:
        worker._stop.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if not args.quiet:
        print(
            f"workflow worker {worker.owner}: {', '.join(sorted(worker.names))} on "
            f"{worker.runtime.journal.url} (concurrency {args.concurrency}, lease {args.lease}s; "
            f"home {app.settings.home}, from {app.settings.source})",
            flush=True,
        )
    from foundry.observe.fleet import fleet_beacon

    beacon = fleet_beacon(app, "workflow-worker", {"name": worker.owner, "workflows": sorted(worker.names)})
    try:
        worker.run()
    finally:
        worker.stop(timeout=max(5.0, args.lease))
        beacon.stop()
    if not args.quiet:
        print(f"workflow worker {worker.owner}: stopped after {worker.claimed} claims", flush=True)
    return 0
