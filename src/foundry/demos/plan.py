"""`foundry demo` section "plan": the three candidates of seed 003 and the five systems
of seed 000 §2, declared (``foundry.examples.seeds``) and decided."""

from __future__ import annotations

from rich.console import Console

from foundry.app import Foundry
from foundry.explain import plan_table


def run(console: Console) -> None:
    from foundry.examples import seeds

    rows = [(seeds.app.name, name, main, phases) for name, main, phases in seeds.app.plan()]
    console.print(plan_table(rows, title="foundry plan foundry.examples.seeds"))
    payment = seeds.handle_payment
    sign = payment.phases["sign"]
    console.print(
        f"The payments handler waits on four upstreams: [cyan]{payment.decision.model}[/cyan] "
        f"(decided by {payment.decision.decided_by}). Its 35 ms RSA signing phase computes: "
        f"[cyan]{sign.model}[/cyan], off the loop, with {', '.join(sign.execution_bill.watch[:3])} to watch."
    )
    console.print("What if the signing stays inline and the handler is forced onto the loop?")
    scratch = Foundry("what-if")
    forced = scratch.work(name="sign_inline", est="75ms", bound="mixed", concurrency=300, model="async")(
        seeds.sign_body
    )
    for warning in forced.decision.warnings:
        console.print(f"[yellow]⚠ {warning.title}[/yellow]: {warning.message}")
    console.print(
        "[dim]The whole bill for one unit: foundry explain foundry.examples.seeds:transcode · "
        "a decision record: foundry plan foundry.examples.seeds --markdown DECISIONS.md[/dim]"
    )
