"""`foundry demo` section "stream": seed 000's signaling events — connection requests,
ICE candidates and disconnects keyed by session — on the embedded log, consumed
independently by logging, analytics and billing, then billing replayed from the start."""

from __future__ import annotations

import logging
import time
from typing import Any

from rich.console import Console
from rich.table import Table


def run(console: Console) -> None:
    from foundry.examples import signaling as example

    quiet = logging.getLogger("foundry.stream")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the dead letter below is shown in a table, not logged
    try:
        _run(console, example)
    finally:
        quiet.setLevel(level)


def _run(console: Console, example: Any) -> None:
    stream = example.signaling
    decision = stream.decision
    console.print(
        f"signaling is declared key='session_id', partitions={stream.partitions}, consumers=3 → "
        f"[cyan]{decision.model}[/cyan] ({decision.delivery_bill.why[:100]}…)"
    )
    events = example.sessions(60)
    ids = [e["id"] for e in events]
    t0 = time.perf_counter()
    published = stream.publish_many(events, ids=ids)
    took = time.perf_counter() - t0
    retry = stream.publish_many(events[:25], ids=ids[:25])  # a producer retrying after a timeout
    console.print(
        f"published {len(published)} events for 60 sessions in {took * 1000:.0f} ms; a producer retry of "
        f"25 of them stored [bold]{sum(not p.duplicate for p in retry)}[/bold] new events (dedup by event id)"
    )

    t0 = time.perf_counter()
    stream.drain(timeout=60, consumers=2)  # two consumers per group share the four partitions
    took = time.perf_counter() - t0
    table = Table(title=f"three groups, two consumers each, caught up in {took:.2f} s")
    for column in ("group", "handled", "lag per partition", "dead letters"):
        table.add_column(column, justify="right" if column != "group" else "left")
    handled = {
        "logging": len(example.LOG),
        "analytics": sum(example.ANALYTICS.by_type.values()),
        "billing": sum(s for s, _, _ in example.BILLING.totals().values()),
    }
    for group in ("logging", "analytics", "billing"):
        lags = " ".join(str(p.lag) for p in stream.lag(group))
        unit = "sessions billed" if group == "billing" else "events"
        table.add_row(group, f"{handled[group]} {unit}", lags, str(len(stream.dead_letters(group))))
    console.print(table)
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(example.ANALYTICS.by_type.items()))
    console.print(f"analytics: {kinds}; {len(example.ANALYTICS.open)} sessions still open")

    before = example.BILLING.totals()
    bills = Table(title="billing (per started minute)")
    for column in ("user", "sessions", "connected", "amount"):
        bills.add_column(column, justify="right" if column != "user" else "left")
    for user, (sessions, seconds, cents) in before.items():
        bills.add_row(user, str(sessions), f"{seconds / 60:.1f} min", f"${cents / 100:.2f}")
    console.print(bills)

    # Replay: move billing back to offset 1 on every partition and rebuild it from the log.
    example.BILLING.reset()
    stream.replay("billing", offset=1)
    lag = sum(p.lag for p in stream.lag("billing"))
    stream.drain(["billing"], timeout=60)
    after = example.BILLING.totals()
    same = "[green]the same totals[/green]" if after == before else "[red]DIFFERENT totals[/red]"
    untouched = sum(p.lag for p in stream.lag("logging"))
    console.print(
        f"replayed billing from offset 1 ({lag} events) → {same}; "
        f"logging and analytics were not touched (their lag stays {untouched})"
    )

    # A poison event: billing cannot store a session without a user. It is retried in
    # place (the session's later events wait), then dead-lettered with the reason.
    stream.publish({"type": "connect", "session_id": "s-bad", "user": None, "at": 0.0}, id="s-bad-0")
    stream.drain(["billing"], timeout=60)
    for dead in stream.dead_letters("billing"):
        console.print(
            f"dead letter: event {dead.id} (partition {dead.partition}, offset {dead.offset}) after "
            f"{dead.deliveries} attempts — [magenta]{dead.reason[:150]}[/magenta]"
        )
    console.print(
        "[dim]per-key order: one consumer owns a partition at a time (a lease), one event in flight per "
        "partition, redeliveries before anything newer; see docs/streams.md[/dim]"
    )
    example.BILLING.close()
    example.app.close()
