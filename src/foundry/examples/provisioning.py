"""The seed's provisioning workflow (seed 000 §2.4, "Dominion"): one request triggers
validate configuration → provision compute → configure networking → deploy software →
verify health. Each step can fail; the orchestrator retries it or, when it fails for
good, undoes what was done — networking, then compute — in reverse order.

The "cloud" here is a recorder (:data:`CLOUD`) so the effects can be shown and counted;
put your provider's API calls in the step functions. ``cfg["fail_at"] = "deploy"``
injects a deploy failure (the demo uses it)::

    from foundry.examples.provisioning import provision
    provision.run({"name": "web-1", "size": "m", "image": "nginx:1.27"})

    foundry workflows worker foundry.examples.provisioning     # run them on workers
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from foundry import Foundry
from foundry.deliver.workflow import WorkflowContext
from foundry.workflow_decl import WorkflowUnit

__all__ = [
    "CLOUD",
    "Cloud",
    "DeployError",
    "app",
    "configure_networking",
    "deploy_software",
    "provision",
    "provision_compute",
    "provision_workflow",
    "release_compute",
    "remove_networking",
    "validate_configuration",
    "verify_health",
]

app = Foundry("provisioning")

SIZES = {"s": 1, "m": 2, "l": 4}


class DeployError(RuntimeError):
    """The software could not be deployed on the new machine."""


class Cloud:
    """Records every call a real cloud API would receive, in order (thread-safe)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def call(self, action: str, detail: str) -> None:
        with self._lock:
            self.log.append((action, detail))

    def new_id(self, prefix: str) -> str:
        with self._lock:
            return f"{prefix}-{next(self._ids):04d}"


CLOUD = Cloud()


def validate_configuration(cfg: dict[str, Any]) -> dict[str, Any]:
    """Reject a bad request before anything is created (not retried: it would fail again)."""
    missing = [key for key in ("name", "size", "image") if not cfg.get(key)]
    if missing:
        raise ValueError(f"configuration lacks {', '.join(missing)}")
    if cfg["size"] not in SIZES:
        raise ValueError(f"size {cfg['size']!r} is not one of {', '.join(SIZES)}")
    return {**cfg, "cpus": SIZES[cfg["size"]]}


def provision_compute(cfg: dict[str, Any]) -> str:
    vm = CLOUD.new_id("vm")
    CLOUD.call("create_vm", f"{vm} ({cfg['name']}, {cfg['cpus']} cpu)")
    return vm


def release_compute(vm: str) -> None:
    CLOUD.call("delete_vm", vm)


def configure_networking(vm: str, cfg: dict[str, Any]) -> dict[str, str]:
    ip = f"10.0.0.{int(vm.rsplit('-', 1)[1]) % 250 + 2}"
    CLOUD.call("attach_ip", f"{ip} -> {vm}")
    return {"vm": vm, "ip": ip}


def remove_networking(net: dict[str, str]) -> None:
    CLOUD.call("detach_ip", f"{net['ip']} -x {net['vm']}")


def deploy_software(net: dict[str, str], cfg: dict[str, Any]) -> str:
    if cfg.get("fail_at") == "deploy":
        CLOUD.call("deploy_failed", f"{cfg['image']} on {net['vm']}")
        raise DeployError(f"image {cfg['image']!r} could not be pulled on {net['vm']}")
    CLOUD.call("deploy", f"{cfg['image']} on {net['vm']}")
    return cfg["image"]  # type: ignore[no-any-return]


def verify_health(net: dict[str, str]) -> bool:
    CLOUD.call("health_check", f"http://{net['ip']}/healthz -> 200")
    return True


def provision_workflow(wf: WorkflowContext, cfg: dict[str, Any]) -> dict[str, str]:
    """Provision one machine; on a failure for good, undo networking then compute."""
    cfg = wf.step(validate_configuration, cfg)
    vm = wf.step(provision_compute, cfg, undo=release_compute, retries=3, backoff="2s")
    net = wf.step(configure_networking, vm, cfg, undo=remove_networking, retries=3, backoff="2s")
    wf.step(deploy_software, net, cfg, retries=2, backoff=0.05, retry_on=(DeployError,))
    wf.step(verify_health, net, retries=5, backoff="5s", timeout="5m")
    return {"vm": vm, "ip": net["ip"], "image": cfg["image"]}


provision: WorkflowUnit = app.workflow(provision_workflow, name="provision", est="10m")
