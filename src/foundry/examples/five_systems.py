"""Seed 000's five systems in one app, each on its own model, each run for real.

``foundry plan foundry.examples.five_systems`` shows five delivery models;
``python examples/five_systems.py`` runs all five on the embedded default (SQLite in a
temporary home, process workers on this machine):

============== ======================================== ================================
system         the seed says                            here
============== ======================================== ================================
deploy_config  queue; failures retry automatically      ``queue``: the first try of one
                                                        deploy fails (503), the store
                                                        retries it after a back-off
signaling      stream; logging, analytics, billing      ``stream``: 3 groups read every
               consume the same events                  event, per-session order
sign_document  work pool; idempotent: the client        ``pool``: a worker dies mid-
               retries                                  request; the request is retried
                                                        on another with the same key
provision      orchestrated: validate, compute,         ``workflow``: a deploy failure
               network, deploy, verify; compensates     undoes networking, then compute
save_file      direct: the user is present              ``direct``: a plain call
============== ======================================== ================================
"""

from __future__ import annotations

import collections
import hashlib
import os
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from foundry import Foundry
from foundry.deliver.stream import StreamEvent
from foundry.examples.provisioning import CLOUD, DeployError, provision_workflow
from foundry.examples.signaling import sessions

__all__ = ["FiveReport", "app", "build", "run"]

_TRIES: dict[str, int] = {}
_LOCK = threading.Lock()


def deploy_config(change: dict[str, Any]) -> str:
    """Apply a configuration change; the config service answers 503 to the first try of
    a change marked ``flaky`` (it is restarting)."""
    with _LOCK:
        _TRIES[change["id"]] = _TRIES.get(change["id"], 0) + 1
        first = _TRIES[change["id"]] == 1
    if first and change.get("flaky"):
        raise ConnectionError("config service answered 503 (it is restarting)")
    return f"applied {change['service']}: {sorted(k for k in change if k not in ('id', 'flaky'))}"


def sign_document(document: dict[str, Any]) -> str:
    """Sign a document (SHA-256 rounds standing in for the signature); the first worker
    given a document with ``die_once`` dies mid-request (``os._exit``), as a SIGKILLed or
    OOM-killed worker would."""
    marker = document.get("die_once")
    if marker and not os.path.exists(marker):
        Path(marker).write_text(str(os.getpid()))
        os._exit(137)
    digest = repr(sorted(document.items())).encode()
    for _ in range(2_000):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()[:16]


def save_file(path: str, text: str) -> int:
    """Save a file with the user present: it writes, or the user sees the error."""
    return Path(path).write_text(text)


class Groups:
    """What the three consumer groups of ``signaling`` did (in memory, for the report)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.logged = 0
        self.by_type: collections.Counter[str] = collections.Counter()
        self.billed: dict[str, float] = {}
        self.seen: set[str] = set()

    def log(self, event: StreamEvent) -> None:
        with self.lock:
            self.logged += 1

    def analyse(self, event: StreamEvent) -> None:
        with self.lock:
            self.by_type[event.data["type"]] += 1

    def bill(self, event: StreamEvent) -> None:
        data = event.data
        with self.lock:
            if event.id in self.seen:  # a redelivery: billed once
                return
            self.seen.add(event.id)
            if data["type"] == "disconnect":
                self.billed[data["user"]] = self.billed.get(data["user"], 0.0) + float(
                    data.get("duration", 0.0)
                )


GROUPS = Groups()


def log_event(event: StreamEvent) -> None:
    GROUPS.log(event)


def analyse(event: StreamEvent) -> None:
    GROUPS.analyse(event)


def bill(event: StreamEvent) -> None:
    GROUPS.bill(event)


def build(name: str = "five-systems", **settings: Any) -> Foundry:
    """The app: the five systems declared with the seed's traits."""
    app = Foundry(name, **settings)
    app.work(background=True, durable=True, retries=3, backoff="100ms", est="20s", bound="io", rate="10/h")(
        deploy_config
    )
    stream = app.stream(
        "signaling", key="session_id", partitions=4, consumers=3, rate="2000/s", est="2ms", bound="io"
    )
    stream.consumer(group="logging", batch=200)(log_event)
    stream.consumer(group="analytics", batch=200)(analyse)
    stream.consumer(group="billing", batch=100)(bill)
    app.work(idempotent=True, latency="20ms", est="15ms", bound="cpu", concurrency=2, rate="50/s", workers=2)(
        sign_document
    )
    app.workflow(provision_workflow, name="provision", est="10m")
    app.work(est="5ms", latency="200ms")(save_file)
    return app


app = build()


@dataclass
class System:
    name: str
    model: str
    decided_by: str
    outcome: str
    checks: dict[str, Any] = field(default_factory=dict)


@dataclass
class FiveReport:
    systems: list[System]
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def by_name(self) -> dict[str, System]:
        return {s.name: s for s in self.systems}


def run(home: Path | None = None) -> FiveReport:
    """Run every system once (``home``: where the SQLite state goes; default a temporary
    directory)."""
    from foundry.backends.queue import open_queue_backend
    from foundry.deliver.worker import Worker
    from foundry.observe import names

    where = Path(tempfile.mkdtemp(prefix="foundry-five-")) if home is None else home
    GROUPS.reset()  # a fresh count per run
    local = build(f"five-{uuid.uuid4().hex[:6]}", home=str(where))
    started = time.monotonic()
    systems: list[System] = []
    try:
        # 1. deploy_config on the durable queue: one deploy fails once, the store retries it
        deploy = local.units["deploy_config"]
        worker = Worker(local, concurrency=2, lease=5.0, grace=5.0, poll=0.1).start()
        try:
            tag = uuid.uuid4().hex[:6]
            handles = [
                deploy.submit({"id": f"checkout-{tag}", "service": "checkout", "replicas": 4, "flaky": True}),
                deploy.submit({"id": f"search-{tag}", "service": "search", "flags": ["fuzzy"]}),
            ]
            results = [h.result(timeout=30) for h in handles]
        finally:
            worker.stop(5.0)
        backend = open_queue_backend(local.settings.queue, home=local.settings.home)
        try:
            states = [backend.get(h.id) for h in handles]
        finally:
            backend.close()
        attempts = [s.attempts if s else -1 for s in states]
        systems.append(
            System("deploy_config", deploy.decision.model, deploy.decision.delivery_decided_by,
                   f"{len(results)} deploys applied; the flaky one after {attempts[0]} failed attempt(s), "
                   "retried by the store", {"attempts": attempts, "results": results})
        )  # fmt: skip

        # 2. signaling on the stream: three groups each read every event
        stream = local.streams["signaling"]
        events = sessions(20)
        stream.publish_many(events, ids=[e["id"] for e in events])
        stream.drain(timeout=60)
        lags = {g: sum(p.lag for p in stream.lag(g)) for g in ("logging", "analytics", "billing")}
        systems.append(
            System("signaling", stream.decision.model, stream.decision.delivery_decided_by,
                   f"{len(events)} events: logged {GROUPS.logged}, analysed {sum(GROUPS.by_type.values())}, "
                   f"billed {len(GROUPS.billed)} users; lag {lags}",
                   {"events": len(events), "logged": GROUPS.logged, "analysed": sum(GROUPS.by_type.values()),
                    "lag": lags})
        )  # fmt: skip

        # 3. sign_document on the work pool: a worker dies mid-request; the idempotent
        # request is retried on another worker with the same key, the caller sees one answer
        sign = local.units["sign_document"]
        marker = where / f"died-{uuid.uuid4().hex[:6]}"
        signatures = [sign({"doc": i, **({"die_once": str(marker)} if i == 3 else {})}) for i in range(8)]
        retried = local.metrics.value(names.POOL_RETRIES, unit="sign_document")
        lost = local.metrics.value(names.POOL_LOST, unit="sign_document")
        systems.append(
            System("sign_document", sign.decision.model, sign.decision.delivery_decided_by,
                   f"{len(signatures)} signed; worker {marker.read_text()} died mid-request: "
                   f"{retried:g} attempt retried on another worker with the same key",
                   {"signed": len(signatures), "died": marker.exists(), "retried": retried, "lost": lost})
        )  # fmt: skip

        # 4. provision as a workflow: a deploy failure compensates networking, then compute
        provision = local.workflows["provision"]
        mark = len(CLOUD.log)
        ok = provision.run({"name": "web-1", "size": "m", "image": "nginx:1.27"}, id=f"web-1-{tag}")
        try:
            provision.run({"name": "web-2", "size": "m", "image": "nginx:1.27", "fail_at": "deploy"},
                          id=f"web-2-{tag}")  # fmt: skip
            failed = ""
        except DeployError as exc:
            failed = str(exc)
        calls = [action for action, _ in CLOUD.log[mark:]]
        undone = [a for a in calls if a in ("detach_ip", "delete_vm")]
        systems.append(
            System("provision", provision.decision.model, provision.decision.delivery_decided_by,
                   f"web-1 → {ok['vm']} at {ok['ip']}; web-2 failed ({failed}) and was compensated: "
                   f"{' then '.join(undone)}", {"calls": calls, "undone": undone, "failed": bool(failed)})
        )  # fmt: skip

        # 5. save_file as a direct call
        save = local.units["save_file"]
        path = where / "notes.txt"
        written = save(str(path), "saved directly, with the user present\n")
        systems.append(
            System("save_file", save.decision.model, save.decision.delivery_decided_by,
                   f"wrote {written} characters to {path.name} in the caller",
                   {"written": written, "exists": path.exists()})
        )  # fmt: skip
    finally:
        local.close()
    return FiveReport(systems, time.monotonic() - started)


def show(report: FiveReport, console: Any) -> None:
    from rich.table import Table

    table = Table(title=f"seed 000's five systems, one app, each on its model ({report.seconds:.1f} s)")
    for column in ("system", "model", "decided by", "what happened"):
        table.add_column(column, overflow="fold")
    for s in report.systems:
        table.add_row(s.name, f"[cyan]{s.model}[/cyan]", s.decided_by, s.outcome)
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    from rich.console import Console

    parser = argparse.ArgumentParser(description="seed 000's five systems, each on its own model")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = run()
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        show(report, Console())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
