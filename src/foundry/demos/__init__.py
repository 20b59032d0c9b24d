"""Sections of `foundry demo`; each module has ``run(console: rich.console.Console) -> None``."""

SECTIONS: tuple[tuple[str, str], ...] = (
    ("plan", "The decisions: three candidates and five systems"),
    ("inprocess", "In-process models: CSV import, payments handler, parallel map"),
    ("queue", "Durable queue: the deploy-configuration background task"),
    ("workflow", "Orchestrated workflow: provisioning with compensation"),
    ("stream", "Event stream: signaling events, three consumer groups, a replay"),
)
