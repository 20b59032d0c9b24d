"""`foundry demo` section "next": where to look next."""

from __future__ import annotations

from rich.console import Console


def run(console: Console) -> None:
    for what, how in (
        (
            "the dashboard: plan, live figures, jobs with progress, workflows, streams",
            "foundry dashboard foundry.examples.five_systems",
        ),
        ("a decision record to commit", "foundry plan foundry.examples.five_systems --markdown DECISIONS.md"),
        ("the whole bill of one unit", "foundry explain foundry.examples.transcoder:transcode"),
        (
            "the loop-starvation schedule, from your own numbers",
            "foundry lab loop --cpu 35ms --rate 300/s --budget 100ms",
        ),
        ("pool sizing before production", "foundry lab pool --workers 8 --service 50ms --rate 120/s"),
        ("each example at full size, and its page", "python examples/<name>.py · docs/examples-*.md"),
    ):
        console.print(f"  {what}:\n    [cyan]{how}[/cyan]")
