"""The three candidates of seed 003 and the five systems of seed 000 §2, declared.

``foundry plan foundry.examples.seeds`` prints how each should run and why. The bodies
are deliberately small stand-ins (other parts of Foundry run them); the traits are
what the decision engine reads.

Seed 003's candidates:

- ``import_csv``     a 40-line CSV import script          -> direct/sequential
- ``handle_payment`` a payments handler, four upstreams   -> direct/async,
                     its 35 ms RSA signing phase          -> direct/processes (pure-Python
                     signing under the GIL; 300/s × 35 ms is 10.5 cores: saturation warns
                     on a host with fewer)
- ``transcode``      ffmpeg, 90 s per job                 -> queue/processes

Seed 000's systems:

- ``deploy_config``  a user-triggered background task     -> queue
- ``signaling``      events with several consumers        -> stream (one event in flight
                     per partition: the load sizes the partitions)
- ``sign_document``  signature processing, idempotent     -> pool (process workers: it
                     computes in pure Python)
- ``provision``      multi-step with compensation         -> workflow
- ``save_file``      a file save with the user present    -> direct
"""

from __future__ import annotations

import asyncio
import csv
import hashlib
import io
from pathlib import Path
from typing import Any

from foundry import Foundry

__all__ = [
    "app",
    "deploy_config",
    "handle_payment",
    "import_csv",
    "provision",
    "save_file",
    "sign_document",
    "signaling",
    "transcode",
]

app = Foundry("seeds")

# -- seed 003: three candidates ---------------------------------------------------


@app.work(est="30ms", items=40, bound="io")
def import_csv(text: str) -> int:
    """A 40-line CSV import: parse the rows and count them (the script's whole job)."""
    return sum(1 for _ in csv.DictReader(io.StringIO(text)))


UPSTREAMS = ("fraud", "ledger", "fx", "notify")


def sign_body(body: bytes, rounds: int = 20_000) -> str:
    """Stand-in for the 35 ms RSA-4096 signature: pure computation."""
    digest = body
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()


@app.work(
    est="40ms",
    bound="io",
    concurrency=300,
    rate="300/s",
    latency="50ms",
    max_pending=300,
    overflow="reject",  # past 300 waiting, shed load (a 503) rather than queue past the budget
    phases={"sign": {"est": "35ms", "bound": "cpu"}},
)
async def handle_payment(payment: dict[str, Any]) -> dict[str, Any]:
    """Call four upstreams concurrently (waiting), then sign the body (the CPU phase)."""

    async def call(upstream: str) -> str:
        await asyncio.sleep(0.005)  # stand-in for an HTTP call
        return f"{upstream}:ok"

    replies = await asyncio.gather(*(call(name) for name in UPSTREAMS))
    return {"payment": payment, "upstreams": list(replies)}


@app.work(durable=True, est="90s", bound="cpu", isolate=True, retries=3, timeout="5m")
def transcode(src: str, dst: str) -> str:
    """ffmpeg for 90 s per job; a malformed video may crash it (hence isolate=True)."""
    Path(dst).write_bytes(Path(src).read_bytes())  # stand-in for `ffmpeg -i src dst`
    return dst


# -- seed 000 §2: five systems ----------------------------------------------------


@app.work(background=True, durable=True, retries=3, est="20s", bound="io", rate="10/h")
def deploy_config(change: dict[str, Any]) -> str:
    """A user deploys a configuration change; workers apply it; failures retry."""
    return f"applied {sorted(change)}"


signaling = app.stream("signaling", key="session_id", consumers=3, rate="2000/s", est="2ms", bound="io")
"""Connection requests, ICE candidates, disconnects: logged, analysed and billed."""


@app.work(idempotent=True, latency="20ms", est="15ms", bound="cpu", concurrency=16, rate="500/s")
def sign_document(document: dict[str, Any]) -> str:
    """Signature processing: predictable latency, idempotent (the client retries)."""
    return sign_body(repr(sorted(document.items())).encode(), rounds=2_000)


def validate(cfg: dict[str, Any]) -> dict[str, Any]:
    return cfg


def provision_compute(cfg: dict[str, Any]) -> str:
    return f"vm-{cfg.get('name', 'x')}"


def release_compute(vm: str) -> None:
    return None


def verify_health(vm: str) -> bool:
    return True


def provision_steps(wf: Any, cfg: dict[str, Any]) -> str:
    """Validate, provision compute (undone by release_compute), verify health."""
    wf.step(validate, cfg)
    vm: str = wf.step(provision_compute, cfg, undo=release_compute)
    wf.step(verify_health, vm, retries=5, timeout="5m")
    return vm


provision = app.workflow(provision_steps, name="provision", est="10m")


@app.work(est="5ms", latency="200ms")
def save_file(path: str, text: str) -> int:
    """Save a file with the user present: it writes, or the user sees the error and retries."""
    return Path(path).write_text(text)
