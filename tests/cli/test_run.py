"""``foundry run``: one process runs everything an app declares — queue jobs, workflows,
stream consumers, schedules — behind one metrics endpoint and one fleet record; SIGTERM
drains all of it (a second one hurries); a component that dies stops the rest with exit
status 1 naming it; ``--reload`` restarts on a code change. And ``foundry worker`` on an
app that has no queue units says what to run instead of serving an empty queue."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from foundry import Foundry
from foundry.observe.fleet import open_fleet

ROOT = Path(__file__).resolve().parents[2]

APP = """
import os, sys, time
from foundry import Foundry

app = Foundry("full", home=os.environ["FOUNDRY_HOME"])
OUT = os.environ["TEST_OUT"]


def note(line):
    with open(OUT, "a") as f:
        f.write(line + "\\n")


@app.work(durable=True, bound="io")
def slow(seconds: float) -> str:
    note(f"slow started {seconds}")
    time.sleep(seconds)
    note(f"slow done {seconds}")
    return "slept"


@app.work(schedule="every 1s", bound="io")
def beat(scheduled_at: str = "") -> None:
    note(f"beat {scheduled_at}")


def double(x: int) -> int:
    return 2 * x


@app.workflow()
def twice(wf, x: int) -> int:
    return wf.step(double, x)


events = app.stream("events", key="k")


@events.consumer(group="notes")
def on_event(event) -> None:
    if event["text"] == "die":
        sys.exit(3)  # ends the consumer's thread: the process is not what it was started as
    note(f"event {event['text']}")
"""


def until(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(0.02)


class Running:
    """``foundry run ARGS`` in a child process; its stdout collected by a thread."""

    def __init__(self, tmp_path: Path, *args: str, source: str = APP) -> None:
        self.dir = tmp_path
        self.out = tmp_path / "out.txt"
        (tmp_path / "full_app.py").write_text(source)
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT / "src"),
            "FOUNDRY_HOME": str(tmp_path / ".foundry"),
            "TEST_OUT": str(self.out),
        }
        self._err = (tmp_path / "stderr.txt").open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "foundry.cli", "run", "full_app.py", *args],
            cwd=tmp_path,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def printed(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        def found() -> re.Match[str] | None:
            for line in list(self.lines):
                match = re.search(pattern, line)
                if match:
                    return match
            assert self.proc.poll() is None or self._reader.is_alive(), self.stderr()
            return None

        return until(f"{pattern!r} in the output {self.lines} (stderr: {self.stderr()})", found, timeout)  # type: ignore[no-any-return]

    def notes(self) -> list[str]:
        return self.out.read_text().splitlines() if self.out.exists() else []

    def stderr(self) -> str:
        return (self.dir / "stderr.txt").read_text()

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(10)
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._err.close()


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Running]]:
    started: list[Running] = []

    def run(*args: str, source: str = APP) -> Running:
        r = Running(tmp_path, *args, source=source)
        started.append(r)
        return r

    yield run
    for r in started:
        r.close()


def client(tmp_path: Path) -> Foundry:
    """The same app, in the test process: to submit, start workflows and publish."""
    namespace: dict[str, Any] = {}
    os.environ.setdefault("TEST_OUT", str(tmp_path / "out.txt"))
    exec(
        compile(
            APP.replace('os.environ["FOUNDRY_HOME"]', repr(str(tmp_path / ".foundry"))), "client", "exec"
        ),
        namespace,
    )
    return namespace["app"]  # type: ignore[no-any-return]


def test_one_process_runs_everything_and_sigterm_drains_it(
    start: Callable[..., Running], tmp_path: Path
) -> None:
    running = start("--metrics-port", "0", "--grace", "20s")
    for component in ("queue worker", "workflow worker", "stream consumers", "scheduler"):
        running.printed(f"foundry run: {component} ")
    url = running.printed(r"metrics on (http://\S+)/metrics").group(1)
    app = client(tmp_path)
    try:
        # Given a job, a workflow and an event, and the schedule ticking
        job = app.units["slow"].submit(1.5)
        flow = app.workflows["twice"].enqueue(21)  # for the workers: run by `foundry run`
        app.streams["events"].publish({"k": "a", "text": "hello"})
        assert flow.result(timeout=60) == 42
        until("the event", lambda: "event hello" in running.notes())
        until("two ticks", lambda: sum(n.startswith("beat ") for n in running.notes()) >= 2)
        until("the slow job to start", lambda: "slow started 1.5" in running.notes())
        # One endpoint shows every component's metrics
        with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
            text = response.read().decode()
        assert 'foundry_schedule_ticks_total{unit="beat",outcome="enqueued"}' in text
        assert 'foundry_unit_completed_total{unit="beat"' in text
        assert "foundry_stream_consumed_total" in text
        # and one fleet record says what the process runs
        fleet = open_fleet(f"file://{tmp_path / '.foundry' / 'fleet'}")
        try:
            [member] = until(
                "the fleet record", lambda: [m for m in fleet.members() if m.pid == running.proc.pid]
            )
        finally:
            fleet.close()
        assert member.role == "supervisor"
        assert set(member.details["components"]) == {
            "queue worker",
            "workflow worker",
            "stream consumers",
            "scheduler",
        }
        assert member.details["schedules"][0]["unit"] == "beat"
        # When SIGTERM arrives while the job runs
        running.proc.send_signal(signal.SIGTERM)
        # Then the job finishes (drained, not abandoned) and the process exits 0
        assert running.wait(30) == 0, running.stderr()
        assert job.result(timeout=10) == "slept"
        assert "slow done 1.5" in running.notes()
        running.printed(r"stopped \(jobs: .*succeeded")
    finally:
        app.close()


def test_a_second_sigterm_hurries_the_drain(start: Callable[..., Running], tmp_path: Path) -> None:
    running = start("--grace", "60s", "--only", "queue")
    running.printed("foundry run: queue worker ")
    app = client(tmp_path)
    try:
        job = app.units["slow"].submit(120)
        until("the long job to start", lambda: "slow started 120" in running.notes())
        running.proc.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):  # draining: the job has 60 s of grace
            running.proc.wait(1.0)
        began = time.monotonic()
        running.proc.send_signal(signal.SIGTERM)
        assert running.wait(30) == 0, running.stderr()
        assert time.monotonic() - began < 20  # not the 60 s of grace, nor the job's 120 s
        assert job.status.value == "queued"  # given back for immediate redelivery
    finally:
        app.close()


def test_a_component_that_dies_stops_the_rest_and_exits_1(
    start: Callable[..., Running], tmp_path: Path
) -> None:
    running = start()
    running.printed("foundry run: stream consumers ")
    app = client(tmp_path)
    try:
        app.streams["events"].publish({"k": "a", "text": "die"})
        assert running.wait(60) == 1
    finally:
        app.close()
    err = running.stderr()
    assert "foundry run: error: the stream consumers stopped by itself: consumer " in err
    assert "SystemExit" in err
    assert "exit status 1" in err


def test_help_documents_the_exit_status() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "foundry.cli", "run", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        check=True,
    )
    text = done.stdout
    assert "Exit status:" in text
    for code in ("0  stopped by SIGTERM", "1  a component stopped by itself", "2  bad command line"):
        assert code in text


# -- in-process: bad input -------------------------------------------------------------------------


WORKFLOWS_ONLY = """
from foundry import Foundry

app = Foundry("flows-only", queue="memory://")


def step(x):
    return x


@app.workflow()
def flow(wf, x):
    return wf.step(step, x)
"""


def test_worker_on_an_app_with_only_workflows_says_what_to_run(
    cli: Callable[..., tuple[int, str, str]], tmp_path: Path
) -> None:
    path = tmp_path / "flows_only.py"
    path.write_text(WORKFLOWS_ONLY)
    code, _out, err = cli("worker", str(path))
    assert code == 2
    assert "declares no durable queue units" in err
    assert "workflows flow" in err
    assert f"`foundry run {path}`" in err
    assert f"`foundry workflows worker {path}`" in err


def test_run_on_an_app_with_nothing_to_run(cli: Callable[..., tuple[int, str, str]], tmp_path: Path) -> None:
    path = tmp_path / "idle.py"
    path.write_text(
        "from foundry import Foundry\napp = Foundry('idle', queue='memory://')\n@app.work()\ndef f(): pass\n"
    )
    code, _, err = cli("run", str(path))
    assert code == 2
    assert "declares nothing that `foundry run` runs (it declares: in-process units f)" in err
    code, _, err = cli("run", str(tmp_path / "idle.py"), "--only", "workflows")
    assert code == 2
    assert "nothing of workflows" in err


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--only", "queue,cron"], "--only 'queue,cron': cron is not a component"),
        (["--lease", "0s"], "--lease must be positive"),
        (["--grace", "soon"], "--grace 'soon'"),
        (["--concurrency", "0"], "--concurrency 0 is too small"),
        (["--queue", "a=x"], "is not Q or Q=N"),
    ],
)
def test_run_rejects_bad_flags(cli: Callable[..., tuple[int, str, str]], args: list[str], words: str) -> None:
    code, _, err = cli("run", "whatever.py", *args)
    assert code == 2
    assert words in err


# -- --reload ----------------------------------------------------------------------------------------

RELOADED = """
import os
from foundry import Foundry

app = Foundry("reloaded", home=os.environ["FOUNDRY_HOME"])


@app.work(durable=True)
def version() -> str:
    return {version!r}
"""


def test_reload_restarts_the_app_when_its_code_changes(start: Callable[..., Running], tmp_path: Path) -> None:
    running = start("--reload", "--grace", "5s", source=RELOADED.format(version="v1"))
    first = int(running.printed(r"--reload: started pid (\d+)").group(1))
    running.printed("foundry run: queue worker ")
    submitter = Foundry("reloaded", home=tmp_path / ".foundry")
    version = submitter.work(name="version", durable=True)(lambda: "caller")
    try:
        assert version.submit().result(timeout=60) == "v1"
        # When the code changes
        (tmp_path / "full_app.py").write_text(RELOADED.format(version="v2"))
        running.printed("full_app.py changed: restarting")
        second = int(running.printed(rf"--reload: started pid (?!{first}\b)(\d+)").group(1))
        # Then the new code runs, in a new process, and the old one is gone
        assert version.submit().result(timeout=60) == "v2"
        assert not _alive(first)
        running.proc.send_signal(signal.SIGTERM)
        assert running.wait(30) == 0, running.stderr()
        assert not _alive(second)
    finally:
        submitter.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie our child has not reaped is gone as far as work goes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


# -- the pool --------------------------------------------------------------------------------------


def test_run_serves_the_pool_units_when_the_pool_is_served(tmp_path: Path) -> None:
    from tests.pool import units

    home = tmp_path / "home"
    env = {**os.environ, "FOUNDRY_HOME": str(home), "FOUNDRY_POOL": "local://served"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    log = (tmp_path / "run.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "foundry.cli", "run", "tests.pool.served:app", "--grace", "5s"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    app = Foundry("served", pool="local://served", home=home)
    try:
        declared = units.declare(app)
        until(
            "the pool server",
            lambda: "foundry run: pool server: square on " in (tmp_path / "run.log").read_text(),
        )
        assert declared["square"](12) == 144  # answered by a worker `foundry run` started
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, (tmp_path / "run.log").read_text()
        assert "pool requests served: " in (tmp_path / "run.log").read_text()
    finally:
        app.close(timeout=5)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()


def test_run_leaves_an_embedded_pool_to_the_submitters(
    cli: Callable[..., tuple[int, str, str]], tmp_path: Path
) -> None:
    path = tmp_path / "pooled.py"
    path.write_text(
        "from foundry import Foundry\n"
        "app = Foundry('pooled', queue='memory://')\n"
        "@app.work(model='pool', workers=1)\n"
        "def square(x): return x * x\n"
    )
    code, _, err = cli("run", str(path))
    assert code == 2
    assert "pool units square" in err  # nothing to run here: each submitter starts its pool


def test_worker_on_a_scheduled_app_says_who_enqueues_the_ticks(
    cli: Callable[..., tuple[int, str, str]], tmp_path: Path
) -> None:
    path = tmp_path / "ticking.py"
    path.write_text(
        "from foundry import Foundry\n"
        f"app = Foundry('ticking', queue='sqlite:///{tmp_path / 'q.db'}', home={str(tmp_path)!r})\n"
        "@app.work(schedule='@hourly')\n"
        "def hourly(): pass\n"
    )
    code, out, err = cli("worker", str(path), "--burst")
    assert code == 0, err
    assert (
        f"runs the jobs of the schedules of hourly; their ticks are enqueued by `foundry run {path}`" in out
    )


def test_a_store_unreachable_at_start_is_exit_1_naming_it(
    cli: Callable[..., tuple[int, str, str]], tmp_path: Path
) -> None:
    path = tmp_path / "nowhere.py"
    path.write_text(
        "from foundry import Foundry\n"
        f"app = Foundry('nowhere', queue='redis://127.0.0.1:9/0?reconnect=0.2', home={str(tmp_path)!r})\n"
        "@app.work(durable=True)\n"
        "def job(): pass\n"
    )
    code, _, err = cli("run", str(path))
    assert code == 1
    assert "foundry run: error: queue redis://127.0.0.1:9/0" in err
    assert "Redis unreachable" in err
