"""`foundry demo` section "queue": seed 000's user-triggered background task — a user
deploys a configuration change, the request enters a queue, workers apply it, failures
retry automatically — on the embedded SQLite queue with an in-process worker."""

from __future__ import annotations

import threading
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from foundry.app import Foundry
from foundry.backends.queue import open_queue_backend
from foundry.config import safe_url
from foundry.deliver.worker import JobEvent, Worker
from foundry.observe import names
from foundry.units import WorkDecorator

_STYLE = {"started": "yellow", "retry": "red", "succeeded": "green", "dead": "magenta", "failed": "red"}


def run(console: Console) -> None:
    from foundry.examples import seeds

    app = Foundry("demo-queue")  # FOUNDRY_HOME is the demo's: the queue is a SQLite file there
    seed = seeds.deploy_config
    tries: dict[str, int] = {}
    lock = threading.Lock()

    declare: WorkDecorator = app.work(
        name="deploy_config", **_traits(seed), backoff="150ms"
    )  # (a **dict: untyped)

    @declare
    def deploy_config(change: dict[str, Any]) -> str:
        with lock:
            tries[change["service"]] = tries.get(change["service"], 0) + 1
            first = tries[change["service"]] == 1
        if first and change["service"] == "checkout":
            raise ConnectionError("config service answered 503 (it is restarting)")
        return str(seed.fn(change))

    console.print(
        f"deploy_config is declared {_declared(seed)} → [cyan]{deploy_config.decision.model}[/cyan] "
        f"({deploy_config.decision.delivery_bill.why[:110]}…)"
    )
    events: list[JobEvent] = []
    worker = Worker(app, concurrency=2, lease=5.0, grace=5.0, on_event=events.append).start()
    t0 = time.time()
    try:
        changes: list[dict[str, Any]] = [
            {"service": "checkout", "replicas": 4},
            {"service": "search", "flags": ["fuzzy"]},
        ]
        handles = [deploy_config.options(key=f"deploy-{c['service']}-v2").submit(c) for c in changes]
        again = deploy_config.options(key="deploy-search-v2").submit(changes[1])
        later = deploy_config.options(delay="300ms", priority=5).submit({"service": "billing", "tier": 2})
        console.print(
            f"submitted 3 deploys (the second submission of deploy-search-v2 returned the same job: "
            f"{again.id == handles[1].id}); billing is delayed 300 ms in the store"
        )
        for handle in [*handles, later]:
            console.print(f"  {handle.id[:12]}… → [green]{handle.result(timeout=30)}[/green]")
    finally:
        worker.stop()
    _history(console, events, t0)
    # what any other process would read
    backend = open_queue_backend(app.settings.queue, home=app.settings.home)
    try:
        record = backend.get(handles[0].id)
    finally:
        backend.close()
    if record is not None:
        console.print(
            f"checkout's job in the store: {record.status.value}, {record.deliveries} deliveries, "
            f"{record.attempts} failed attempt(s) recorded; app.job(id).result() → "
            f"{app.job(record.id).result(timeout=5)!r}"
        )
    metrics = app.metrics
    console.print(
        "metrics: "
        + ", ".join(
            f"{name}={metrics.value(name, **labels):g}"
            for name, labels in (
                (names.UNIT_COMPLETED, {"unit": "deploy_config"}),
                (names.JOB_RETRIES, {"unit": "deploy_config"}),
                (names.JOB_DEAD, {}),
                (names.QUEUE_DEPTH, {"queue": "default"}),
                (names.QUEUE_OLDEST_AGE, {"queue": "default"}),
            )
        )
    )
    console.print(
        f"[dim]the queue: {safe_url(app.settings.queue)} · inspect it with `foundry jobs list --url "
        f"{safe_url(app.settings.queue)}` · run workers with `foundry worker MODULE:app`[/dim]"
    )
    app.close()


def _traits(unit: Any) -> dict[str, Any]:
    t = unit.traits
    return {
        "background": t.background,
        "durable": t.durable,
        "retries": t.retries,
        "est": t.est,
        "bound": t.bound,
        "rate": t.rate,
    }


def _declared(unit: Any) -> str:
    t = unit.traits
    return f"background, durable, retries={t.retries}, est={t.est:g}s, {t.rate * 3600:g}/h"


def _history(console: Console, events: list[JobEvent], t0: float) -> None:
    table = Table(title="what the worker did")
    for col in ("t", "job", "event", "delivery", "detail"):
        table.add_column(col, overflow="fold")
    for e in sorted(events, key=lambda e: e.at):
        style = _STYLE.get(e.kind, "")
        table.add_row(
            f"+{(e.at - t0) * 1000:.0f} ms",
            e.job_id[:12],
            f"[{style}]{e.kind}[/{style}]" if style else e.kind,
            str(e.delivery),
            e.detail,
        )
    console.print(table)
