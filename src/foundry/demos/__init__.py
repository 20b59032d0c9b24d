"""Sections of `foundry demo`; each module has ``run(console: rich.console.Console) -> None``.

The tour of seed 000's and seed 003's workloads on the embedded default (``examples/``
runs each at full size); ``foundry demo --only NAME`` runs one section.
"""

SECTIONS: tuple[tuple[str, str], ...] = (
    ("plan", "The decisions: three candidates and five systems"),
    ("csv", "CSV import: 40 lines sequentially, 200,000 on the parallel model"),
    ("payments", "Payments API: RSA-4096 signing inline, on a pool, moved at run time"),
    ("transcoder", "Video transcoder: ffmpeg on the durable queue, in child processes"),
    ("five", "Seed 000's five systems, one app, each on its model"),
    ("inprocess", "In-process models: CSV import, payments handler, parallel map"),
    ("queue", "Durable queue: the deploy-configuration background task"),
    ("workflow", "Orchestrated workflow: provisioning with compensation"),
    ("stream", "Event stream: signaling events, three consumer groups, a replay"),
    ("next", "Where to look next"),
)
