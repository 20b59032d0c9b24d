"""`foundry demo` section "workflow": the seed's provisioning workflow on the embedded
journal — once to success, once with a deploy failure that compensates networking and
compute in reverse order — with the journal's history of each."""

from __future__ import annotations

import uuid

from rich.console import Console

from foundry.cli.workflows import history_table, summary_table


def run(console: Console) -> None:
    from foundry.examples import provisioning as p

    rt = p.provision.runtime
    journal = rt.journal
    tag = uuid.uuid4().hex[:6]
    cfg = {"name": "web-1", "size": "m", "image": "nginx:1.27"}
    console.print(
        f"[bold]provision[/bold] is {p.provision.decision.model}: five steps, two with an undo, "
        f"journaled in [cyan]{journal.url}[/cyan]."
    )

    start = len(p.CLOUD.log)
    ok_id = f"provision-web-1-{tag}"
    result = p.provision.run(cfg, id=ok_id)
    console.print(f"\n[green]✓[/green] {ok_id} → {result}")
    state, entries = journal.load(ok_id)
    console.print(history_table(state, entries, journal.clock.time()))
    again = p.provision.run(cfg, id=ok_id)
    console.print(
        f"Starting {ok_id} again returns the same run ({again == result}): the workflow id is its "
        "idempotency key, and no step ran twice."
    )

    bad_id = f"provision-web-2-{tag}"
    mark = len(p.CLOUD.log)
    try:
        p.provision.run({**cfg, "name": "web-2", "fail_at": "deploy"}, id=bad_id)
    except p.DeployError as exc:
        console.print(f"\n[red]✗[/red] {bad_id}: {type(exc).__name__}: {exc}")
    state, entries = journal.load(bad_id)
    console.print(summary_table(state, journal.clock.time()))
    console.print(history_table(state, entries, journal.clock.time()))
    calls = [f"{action}({detail})" for action, detail in p.CLOUD.log[mark:]]
    console.print("What the cloud saw, in order: " + " → ".join(calls))
    undone = [a for a, _ in p.CLOUD.log[mark:] if a in ("detach_ip", "delete_vm")]
    console.print(
        f"Deploy failed for good after {entries[3].attempts} tries, so the undos ran in reverse order "
        f"({' then '.join(undone)}), each journaled: a crash during compensation resumes it."
    )
    console.print(
        f"[dim]{len(p.CLOUD.log) - start} cloud calls. Inspect: foundry workflows --journal "
        f"{journal.url} show {bad_id}[/dim]"
    )
    p.app.close()
