"""Durable workers on two hosts, one cut off mid-run: its leases lapse, the other host
finishes. One test per family — the queue on PostgreSQL and on Redis, workflows on
PostgreSQL, streams on NATS — against the shared servers.

Each "host" is a network namespace the test makes (``tests/netns.py``); the shared
servers listen on 127.0.0.1 only, so the hosts reach them through a TCP forwarder the
test runs on the host side, never by reconfiguring a server. Mid-run the link of host
``h1`` goes down *inside its namespace*: its TCP connections hang (no RST, no FIN), as
when a machine is unplugged. Every execution is appended to one file (``_app.record``),
so the test counts runs across hosts: nothing lost (every job, step, event ran and its
caller got one answer) and nothing doubled beyond the documented crash window — only
what ``h1`` held when it was cut may run again on ``h2``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.backends.queue.engines import drop_schema, engine_url
from tests.netns import Forwarder, Network, require_namespaces
from tests.services import require

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LEASE = 3.0  # seconds; short so each test finishes in tens of seconds, long enough for a loaded box
CONCURRENCY = 2
PREFETCH = 2
GATED = 10  # more than both hosts can hold (PREFETCH each): h1 gets one


class Hosts:
    """Two worker hosts (``h1``, ``h2``), forwarders to the shared servers, their processes."""

    def __init__(self, tmp_path: Path, ports: tuple[int, ...]) -> None:
        self.tmp = tmp_path
        self.runs = tmp_path / "runs.log"
        self.gate = tmp_path / "gate"  # gated jobs wait until it exists (``_app.job``)
        self.net = Network(("h1", "h2"))
        self.ports = ports
        self.forwarders: dict[int, Forwarder] = {}
        self.procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def up(self) -> None:
        self.net.up()
        for port in self.ports:
            self.forwarders[port] = Forwarder(self.net, port)

    def reroute(self, url: str) -> str:
        """``url`` as a worker host reaches it: through the forwarder."""
        port = urlsplit(url).port
        assert port is not None, url
        return self.forwarders[port].reroute(url)

    def start(self, host: str, args: list[str], **env: str) -> subprocess.Popen[bytes]:
        log = self.tmp / f"{host}-{len(self.procs)}.log"
        full_env = {
            **os.environ,
            "MH_HOST": host,
            "MH_RUNS": str(self.runs),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            **env,
        }
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*self.net.exec(host), sys.executable, "-m", *args],
                cwd=ROOT,
                env=full_env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs.append((host, proc, log))
        return proc

    def rows(self) -> list[tuple[str, str, float]]:
        """``(what, host, time)`` of every execution so far."""
        if not self.runs.exists():
            return []
        rows = []
        for line in self.runs.read_text().splitlines():
            what, host, _pid, at = line.split()
            rows.append((what, host, float(at)))
        return rows

    def wait_until(self, what: str, check: Callable[[], bool], timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n{self.logs()}")
            for host, proc, _ in self.procs:
                if host != "h1" and proc.poll() is not None:  # h1 may die once cut off
                    raise AssertionError(f"a worker on {host} exited ({proc.returncode})\n{self.logs()}")
            time.sleep(0.05)

    def cut_when_both_are_working(self, at_least: int) -> float:
        """Cut ``h1`` off once both hosts have run something and ``at_least`` runs happened."""
        self.wait_until(
            f"both hosts to run work ({at_least} runs)",
            lambda: len(rows := self.rows()) >= at_least and {h for _, h, _ in rows} == {"h1", "h2"},
        )
        self.net.cut("h1")
        return time.time()

    def cut_the_busier(self, at_least: int) -> tuple[str, float]:
        """Cut off the host that has run more, once ``at_least`` runs happened (for work
        split by ownership, where one host may own it all); returns it and when."""
        self.wait_until(f"{at_least} runs", lambda: len(self.rows()) >= at_least, timeout=120)
        busier = Counter(h for _, h, _ in self.rows()).most_common(1)[0][0]
        self.net.cut(busier)
        return busier, time.time()

    def logs(self, lines: int = 30) -> str:
        out = []
        for host, _, log in self.procs:
            text = log.read_text(errors="replace") if log.exists() else ""
            out.append(f"--- {log.name} ({host}) ---\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(out)

    def down(self) -> None:
        for _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for _, proc, _ in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
        for forwarder in self.forwarders.values():
            forwarder.close()
        self.net.down()


@contextmanager
def two_hosts(tmp_path: Path, *ports: int) -> Iterator[Hosts]:
    require_namespaces()
    hosts = Hosts(tmp_path, ports)
    try:
        hosts.up()
        yield hosts
    finally:
        hosts.down()


def count(hosts: Hosts, ids: list[str], cut_at: float, window: int, cut: str = "h1") -> Counter[str]:
    """Nothing lost, nothing doubled beyond ``window`` runs; nothing new on the host that was
    cut off beyond that window either. Returns the runs per id."""
    rows = hosts.rows()
    runs = Counter(what for what, _, _ in rows)
    missing = [i for i in ids if runs[i] == 0]
    assert not missing, f"lost: {missing[:10]}"
    extra = {i: runs[i] for i in ids if runs[i] > 1}
    assert sum(runs[i] for i in ids) - len(ids) <= window, f"doubled beyond the window of {window}: {extra}"
    other = "h2" if cut == "h1" else "h1"
    late = [what for what, host, at in rows if host == cut and at > cut_at + 0.2]
    assert len(late) <= window, f"{cut} kept working after it was cut off: {late}"
    assert any(host == other and at > cut_at for _, host, at in rows), f"{other} did nothing after the cut"
    return runs


# -- the queue on PostgreSQL and on Redis ----------------------------------------------------


@pytest.mark.parametrize("engine", ["postgres", "redis"])
def test_queue_workers_on_two_hosts_one_cut_off(engine: str, tmp_path: Path) -> None:
    from tests.multihost._app import make_app

    url = engine_url(engine, tmp_path)  # a private schema / key prefix on the shared server
    jobs = 120
    port = urlsplit(url).port
    assert port is not None
    app = make_app(queue=url)
    try:
        with two_hosts(tmp_path, port) as hosts:
            # Given: a worker on each host, two jobs at a time, two held, 3 s leases
            for host in ("h1", "h2"):
                hosts.start(
                    host,
                    ["foundry.cli", "worker", "tests.multihost._app:app", "--url", hosts.reroute(url),
                     "--concurrency", str(CONCURRENCY), "--prefetch", str(PREFETCH), "--lease", str(LEASE),
                     "--grace", "1", "--quiet"],
                    MH_GATE=str(hosts.gate),
                )  # fmt: skip
            unit = app.get("job")
            gated = range(jobs // 4, jobs // 4 + GATED)  # after 30 plain ones: both hosts get there
            handles = [unit.submit(i, gated=i in gated) for i in range(jobs)]
            # When: h1 holds a gated job, unfinished (it waits for the gate), h1 is cut off
            names = {f"job{i}" for i in gated}

            def h1_holds_a_gated_job() -> bool:
                rows = hosts.rows()
                return {h for _, h, _ in rows} == {"h1", "h2"} and any(
                    h == "h1" and what in names for what, h, _ in rows
                )

            hosts.wait_until("h1 to start a gated job, h2 having worked too", h1_holds_a_gated_job)
            hosts.net.cut("h1")
            cut_at = time.time()
            held = [int(what[3:]) for what, h, _ in hosts.rows() if h == "h1" and what in names]
            hosts.gate.touch()  # the gated jobs finish: h2's are acked, h1's acks cannot leave it
            # Then: every job answers once ...
            results = [h.result(timeout=120) for h in handles]
            assert set(results) <= {"h1", "h2"}
            runs = count(hosts, [f"job{i}" for i in range(jobs)], cut_at, window=PREFETCH + CONCURRENCY)
            # ... and what h1 held when it was cut off lapsed, and h2 ran it again and answered it
            assert held
            for i in held:
                assert runs[f"job{i}"] == 2, (i, runs[f"job{i}"])
                assert results[i] == "h2", (i, results[i])
                assert any(what == f"job{i}" and h == "h2" and at > cut_at for what, h, at in hosts.rows())
    finally:
        app.close()
        if engine == "postgres":
            drop_schema(url)
        else:
            from foundry.backends.queue import open_queue_backend
            from tests.backends.queue.engines import close

            close(open_queue_backend(url), url)


# -- workflows on PostgreSQL -------------------------------------------------------------------


def test_workflow_workers_on_two_hosts_one_cut_off(tmp_path: Path) -> None:
    from foundry.deliver.workflow import configure
    from tests.multihost._app import make_app

    base = require("postgres")
    url = f"{base}{'&' if '?' in base else '?'}schema=fmh_{uuid.uuid4().hex[:10]}"
    port = urlsplit(url).port
    assert port is not None
    trips = 40
    app = make_app(journal=url)
    runtime = configure(app, journal=url)
    try:
        with two_hosts(tmp_path, port) as hosts:
            for host in ("h1", "h2"):
                hosts.start(
                    host,
                    ["foundry.cli", "workflows", "worker", "tests.multihost._app:app", "--journal",
                     hosts.reroute(url), "--lease", str(LEASE), "--poll", "0.1", "--concurrency",
                     str(CONCURRENCY), "--quiet"],
                    MH_GATE=str(hosts.gate),
                )  # fmt: skip
            trip = app.get("trip")
            gated = range(trips // 4, trips // 4 + GATED)  # after 10 plain ones: both hosts get there
            handles = [
                trip.enqueue(n, n in gated, id=f"trip-{n}-{uuid.uuid4().hex[:6]}") for n in range(trips)
            ]
            # When: h1 is inside the first step of a gated trip (it waits for the gate), h1 is cut off
            names = {f"trip{n}-out" for n in gated}

            def h1_holds_a_gated_trip() -> bool:
                rows = hosts.rows()
                return {h for _, h, _ in rows} == {"h1", "h2"} and any(
                    h == "h1" and what in names for what, h, _ in rows
                )

            hosts.wait_until("h1 to start a gated trip, h2 having worked too", h1_holds_a_gated_trip)
            hosts.net.cut("h1")
            cut_at = time.time()
            held = [int(what[4:].split("-")[0]) for what, h, _ in hosts.rows() if h == "h1" and what in names]
            hosts.gate.touch()  # the gated steps finish: h1's results cannot leave it
            # Then: every trip answers, each step once but for what h1 was in when it was cut off ...
            results = [h.result(timeout=120) for h in handles]
            assert all(len(r) == 2 and set(r) <= {"h1", "h2"} for r in results)
            steps = [f"trip{n}-{part}" for n in range(trips) for part in ("out", "back")]
            runs = count(hosts, steps, cut_at, window=CONCURRENCY)
            # ... and h2 took over the runs h1 held: their first step ran again, on h2
            assert held
            for n in held:
                assert runs[f"trip{n}-out"] == 2, (n, runs[f"trip{n}-out"])
                assert results[n] == ["h2", "h2"], (n, results[n])
    finally:
        runtime.close()
        app.close()
        drop_schema(url)


# -- streams on NATS ----------------------------------------------------------------------------


def test_stream_consumers_on_two_hosts_one_cut_off(tmp_path: Path) -> None:
    from foundry import Foundry
    from foundry.backends.stream import open_stream_backend
    from tests.multihost._app import BATCH, PARTITIONS

    url = require("nats")
    port = urlsplit(url).port
    assert port is not None
    name = f"mh-{uuid.uuid4().hex[:10]}"
    events = 100
    publisher = Foundry("mh-publisher", stream=url, home=tmp_path / "publisher")
    stream = publisher.stream(name, key="k", partitions=PARTITIONS)
    try:
        with two_hosts(tmp_path, port) as hosts:
            for host in ("h1", "h2"):
                hosts.start(
                    host,
                    ["foundry.cli", "streams", "consume", "tests.multihost._stream_app"],
                    MH_STREAM_URL=hosts.reroute(url),
                    MH_STREAM=name,
                    MH_HOME=str(tmp_path / f"home-{host}"),
                )
            stream.publish_many(
                [{"k": f"key-{i % 10}", "n": i} for i in range(events)], ids=[f"e{i}" for i in range(events)]
            )
            # (a host may own both partitions: cut off whichever has been consuming)
            cut, cut_at = hosts.cut_the_busier(events // 4)
            other = "h2" if cut == "h1" else "h1"
            ids = [f"ev{i}" for i in range(events)]
            hosts.wait_until(
                "every event to be handled", lambda: {w for w, _, _ in hosts.rows()} >= set(ids), timeout=120
            )
            # its undelivered acks: at most a batch per partition it owned comes again
            count(hosts, ids, cut_at, window=BATCH * PARTITIONS, cut=cut)
            # and the other host took over its partitions: keys it consumed before the cut, after it
            rows = hosts.rows()
            before = {int(w[2:]) % 10 for w, h, at in rows if h == cut and at < cut_at}
            after = {int(w[2:]) % 10 for w, h, at in rows if h == other and at > cut_at}
            assert before & after, (before, after)
    finally:
        publisher.close()
        backend = open_stream_backend(url)
        try:
            backend.delete_stream(name)
        finally:
            backend.close()
