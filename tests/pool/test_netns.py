"""Workers on two "hosts" — network namespaces this test makes itself — behind a private
NATS server in a third; the client in a fourth. Mid-run one host is cut off (its link
goes down): its requests in flight time out, are retried (the unit is idempotent) and
answered by the other host; every request is answered exactly once.

Every address lives inside the test's own namespaces (a bridge in the "hub" namespace,
one veth pair per namespace), names carry a unique prefix, and everything is removed in
a ``finally``, even on failure. Needs root and ``ip``; skips locally without them, fails
under CI=true.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.pool import _serve
from tests.pool.conftest import lines

pytestmark = pytest.mark.slow

NATS_SERVER = shutil.which("nats-server") or "/usr/sbin/nats-server"


def ip(*args: str, ns: str | None = None) -> None:
    command = ["ip", "netns", "exec", ns, "ip", *args] if ns else ["ip", *args]
    subprocess.run(command, check=True, capture_output=True, timeout=30)


def _can_make_namespaces() -> str | None:
    if os.geteuid() != 0:
        return "needs root for ip netns"
    if not shutil.which("ip"):
        return "needs iproute2 (ip)"
    if not os.path.exists(NATS_SERVER):
        return "needs nats-server"
    return None


class Network:
    """hub (bridge + nats-server), h1, h2 (worker hosts) and cl (the client)."""

    def __init__(self) -> None:
        self.tag = "fp" + uuid.uuid4().hex[:5]
        self.subnet = f"10.{random.randint(200, 250)}.{random.randint(0, 255)}"
        self.hub = f"{self.tag}hub"
        self.names = {n: f"{self.tag}{n}" for n in ("h1", "h2", "cl")}
        self.made: list[str] = []

    def address(self, n: str) -> str:
        return f"{self.subnet}.{ {'hub': 1, 'h1': 11, 'h2': 12, 'cl': 20}[n] }"

    def up(self) -> None:
        for ns in (self.hub, *self.names.values()):
            ip("netns", "add", ns)
            self.made.append(ns)
            ip("link", "set", "lo", "up", ns=ns)
        bridge = f"{self.tag}br"
        ip("link", "add", bridge, "type", "bridge", ns=self.hub)
        ip("addr", "add", f"{self.address('hub')}/24", "dev", bridge, ns=self.hub)
        ip("link", "set", bridge, "up", ns=self.hub)
        for n, ns in self.names.items():
            outer, inner = f"{self.tag}{n}a", f"{self.tag}{n}b"
            ip("link", "add", outer, "netns", self.hub, "type", "veth", "peer", "name", inner, "netns", ns)
            ip("link", "set", outer, "master", bridge, ns=self.hub)
            ip("link", "set", outer, "up", ns=self.hub)
            ip("addr", "add", f"{self.address(n)}/24", "dev", inner, ns=ns)
            ip("link", "set", inner, "up", ns=ns)

    def cut(self, n: str) -> None:
        ip("link", "set", f"{self.tag}{n}a", "down", ns=self.hub)

    def exec(self, n: str) -> list[str]:
        return ["ip", "netns", "exec", self.names.get(n, self.hub)]

    def down(self) -> None:
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False)


def test_a_host_cut_off_mid_run_has_its_idempotent_requests_answered_by_the_other(tmp_path: Path) -> None:
    why = _can_make_namespaces()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"{why} and CI=true")
        pytest.skip(why)
    net = Network()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        net.up()
        conf = tmp_path / "nats.conf"
        # A private server for this test only, bound to the hub's address; quick to notice a
        # client that went silent (ping every second, two missed).
        conf.write_text(f'listen: "{net.address("hub")}:4222"\nping_interval: "1s"\nping_max: 2\n')
        nats_log = tmp_path / "nats.log"
        with nats_log.open("wb") as out:
            procs.append(
                subprocess.Popen([*net.exec("hub"), NATS_SERVER, "-c", str(conf)], stdout=out, stderr=out)
            )
        url = f"nats://{net.address('hub')}:4222"
        work_log = tmp_path / "runs.log"
        hosts = {}
        for n in ("h1", "h2"):
            log = tmp_path / f"serve-{n}.log"
            hosts[n] = (
                _serve.serve(url, ["where"], log, prefix=net.exec(n), FOUNDRY_TEST_HOST=n, FOUNDRY_POOL=url),
                log,
            )
            procs.append(hosts[n][0])
        for proc, log in hosts.values():
            _serve.wait_ready(log, 1, proc)

        # When: the client sends 120 requests over ~6 s, and h1 is cut off after ~2 s
        client = subprocess.Popen(
            [*net.exec("cl"), sys.executable, "-m", "tests.pool._netns_client", str(work_log), "120", "0.05"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_serve.env(FOUNDRY_POOL=url),
            cwd=_serve.ROOT,
        )
        procs.append(client)
        time.sleep(2.5)
        cut_at = time.time()
        net.cut("h1")
        out, err = client.communicate(timeout=120)
        assert client.returncode == 0, err.decode()[-3000:]

        # Then: every request answered once, by a host; after the cut only by h2
        rows = [json.loads(line) for line in out.decode().splitlines()]
        results = [r for r in rows if "i" in r]
        end = rows[-1]
        assert sorted(r["i"] for r in results) == list(range(120))
        errors = [r for r in results if "error" in r]
        assert not errors, errors[:3]
        hosts_seen = Counter(r["host"] for r in results)
        assert hosts_seen["h1"] > 0, hosts_seen
        assert hosts_seen["h2"] > 0, hosts_seen
        assert all(r["host"] == "h2" for r in results if r["started"] > cut_at + 0.5), (
            "h1 answered after the cut"
        )
        assert end["retries"] >= 1, "no request was in flight on h1 when it was cut off"
        assert end["completed"] == 120
        assert end["failed"] == 0
        # Every key ran at least once; the extra runs are the lost attempts on h1, no more.
        runs = Counter(key for key, _ in lines(work_log))
        assert all(runs[f"r{i}"] >= 1 for i in range(120))
        assert sum(runs.values()) - 120 <= end["retries"]
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        net.down()
