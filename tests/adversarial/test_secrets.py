"""No password in any output: every CLI command, every repr and str.

A password is planted in every engine URL the process is given (PostgreSQL queue and
journal, Redis queue and stream, the RabbitMQ queue's ``state=`` store, the NATS
stream), and in the URLs of the exporter commands; then **every** leaf command of
``foundry`` — enumerated from the argparse tree, so a command added later is covered
or this test fails asking for its recipe — runs against a seeded store (a job, a
workflow, an event), and against servers that refuse the login. Its stdout, stderr and
log records must not contain the password. Then the ``repr``/``str`` of the public
objects (app, settings, backends, runtimes, runners, workers, handles) are scanned the
same way, one attribute deep.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from foundry.cli import build_parser
from foundry.cli import main as cli
from tests.services import require

SECRET = "pw-S3CR3T-q9"
# The shared RabbitMQ accepts only guest/guest: its broker password is "guest", which
# must not show either (the user name does: "guest:***@").
SECRETS = (SECRET, ":guest@")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def leaf_commands() -> list[tuple[str, ...]]:
    """Every runnable command path of ``foundry`` (``("jobs", "show")``…)."""

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            yield path
        for action in subs:
            for name, child in action.choices.items():
                yield from walk(child, (*path, name))

    return list(walk(build_parser(), ()))


# -- the stores, with the password planted -------------------------------------------------


class Planted:
    """FOUNDRY_QUEUE / _STREAM / _JOURNAL with the password in each, a private namespace
    on each server, an app module using them, and ids of seeded records."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.tag = uuid.uuid4().hex[:10]
        self.dir = tmp_path
        self.schema = f"fsec_{self.tag}"
        pg = require("postgres").split("://", 1)[1].split("@", 1)[1].split("/", 1)[0]  # host:port
        pg_url = f"postgresql://postgres:{SECRET}@{pg}/test?schema={self.schema}"
        self.pg_base = f"postgresql://postgres@{pg}/test"
        redis = f"redis://default:{SECRET}@127.0.0.1:6379/0?prefix=fsec{self.tag}"
        nats = f"nats://foundry:{SECRET}@127.0.0.1:4222?prefix=fsec{self.tag}"
        if kind == "postgres":
            require("redis")
            self.env = {"FOUNDRY_QUEUE": pg_url, "FOUNDRY_JOURNAL": pg_url, "FOUNDRY_STREAM": redis}
        elif kind == "redis":
            require("redis")
            require("nats")
            self.env = {"FOUNDRY_QUEUE": redis, "FOUNDRY_JOURNAL": pg_url, "FOUNDRY_STREAM": nats}
        elif kind == "rabbitmq":
            broker = require("rabbitmq")
            state = quote(pg_url, safe="")
            queue = f"{broker}?prefix=fsec{self.tag}&state={state}"
            self.env = {"FOUNDRY_QUEUE": queue, "FOUNDRY_JOURNAL": pg_url, "FOUNDRY_STREAM": redis}
        else:  # every server refuses the login: the errors must be masked too
            require("rabbitmq")
            require("redis")
            host = "127.0.0.1"
            self.env = {
                "FOUNDRY_QUEUE": f"amqp://guest:{SECRET}@{host}:5672/?reconnect=1&state=memory://",
                "FOUNDRY_JOURNAL": f"postgresql://fsec_nobody:{SECRET}@{pg}/test",
                "FOUNDRY_STREAM": f"redis://fsec_nobody:{SECRET}@{host}:6379/0",
            }
        self.env["FOUNDRY_HOME"] = str(tmp_path / "home")
        self.env["FSEC_STREAM"] = f"fsec-{self.tag}"
        self.app_file = tmp_path / "secrets_app.py"
        self.app_file.write_text(
            textwrap.dedent(
                """
                import os

                from foundry import Foundry

                app = Foundry("secrets-app")


                @app.work(durable=True)
                def add(a: int, b: int) -> int:
                    return a + b


                def double(x: int) -> int:
                    return 2 * x


                @app.workflow()
                def flow(wf, x: int) -> int:
                    return wf.step(double, x)


                events = app.stream(os.environ["FSEC_STREAM"])


                @events.consumer(group="g")
                def on_event(event) -> None:
                    pass
                """
            )
        )
        self.ids: dict[str, str] = {"job": "no-such-job", "workflow": "no-such-workflow"}

    def seed(self) -> None:
        """A queued job, a pending workflow and an event (not for the refusing servers)."""
        if self.kind == "refused":
            return
        code = textwrap.dedent(
            f"""
            import runpy
            ns = runpy.run_path({str(self.app_file)!r})
            app = ns["app"]
            job = ns["add"].submit(1, 2)
            run = ns["flow"].enqueue(3)
            ns["events"].publish({{"n": 1}})
            print(job.id, run.id)
            app.close()
            """
        )
        for _ in range(3):  # a shared server may be briefly busy (another suite's script)
            done = self._python(["-c", code], timeout=60)
            if done.returncode == 0:
                break
            time.sleep(1.0)
        assert done.returncode == 0, done.stderr
        job_id, workflow_id = done.stdout.split()[-2:]
        self.ids = {"job": job_id, "workflow": workflow_id}

    def _python(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *argv],
            cwd=self.dir,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def close(self) -> None:
        import psycopg

        with psycopg.connect(self.pg_base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
        try:
            import redis

            client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
            keys = list(client.scan_iter(f"fsec{self.tag}*"))
            if keys:
                client.delete(*keys)
            client.close()
        except Exception:
            pass


@pytest.fixture
def planted(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Planted]:
    p = Planted(str(request.param), tmp_path)
    for name, value in p.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    try:
        p.seed()
        yield p
    finally:
        p.close()


# -- what each command is run with ---------------------------------------------------------

CLOSED = _free_port()
EXPORTER = f"http://admin:{SECRET}@127.0.0.1:{CLOSED}"

# argv after "foundry" for each leaf; {job}, {workflow}, {stream}, {app} are filled in.
IN_PROCESS: dict[tuple[str, ...], list[list[str]]] = {
    ("plan",): [["{app}"], ["{app}", "--json"]],
    ("explain",): [["{app}:add"]],
    ("advise",): [["--durable", "--json"], ["--durable"]],
    ("profile",): [["{app}:double", "--json"]],
    ("jobs", "list"): [[], ["--json"]],
    ("jobs", "show"): [["{job}"], ["{job}", "--json"], ["no-such-job"]],
    ("jobs", "cancel"): [["{job}"], ["no-such-job"]],
    ("jobs", "dead"): [[], ["--json"]],
    ("jobs", "requeue"): [["{job}"], ["no-such-job"]],
    ("jobs", "stats"): [[], ["--json"]],
    ("workflows", "list"): [[], ["--json"]],
    ("workflows", "show"): [["{workflow}"], ["{workflow}", "--json"], ["no-such-workflow"]],
    ("workflows", "cancel"): [["no-such-workflow"]],
    ("workflows", "signal"): [["{workflow}", "go", "1"], ["no-such-workflow", "go"]],
    ("workflows", "purge"): [["--older-than", "36500d"]],
    ("workflows", "query"): [["{workflow}"], ["no-such-workflow"]],
    ("workflows", "reset"): [["{workflow}", "--step", "x"], ["no-such-workflow", "--position", "0"]],
    ("workflows", "export"): [[], ["{workflow}"]],
    ("workflows", "replay"): [["{app}", "--limit", "5"]],
    ("streams", "list"): [[], ["--json"]],
    ("streams", "lag"): [["{stream}"], ["{stream}", "--json"], []],
    ("streams", "replay"): [["{stream}", "g", "--offset", "1"]],
    ("streams", "dead"): [["{stream}"], ["{stream}", "--json"]],
    ("top",): [["--url", EXPORTER, "--once"]],
    ("metrics",): [["--url", EXPORTER], ["--url", EXPORTER, "--json"]],
    ("lab", "pool"): [["--no-sim"]],
    ("lab", "permits"): [["--permits", "1,5", "--requests", "200", "--replications", "2"]],
    ("lab", "server"): [["--requests", "200", "--replications", "2"]],
    ("lab", "loop"): [["--max-steps", "200"]],
    ("lab", "fit"): [["--metrics", EXPORTER, "--target", "100ms"]],
    ("schedules", "list"): [["{app}"], ["{app}", "--json"]],
}
# Commands that serve until stopped (or take long): run in a process, stopped by SIGTERM
# once they have printed (or after a few seconds).
SUBPROCESS: dict[tuple[str, ...], list[list[str]]] = {
    ("worker",): [["{app}", "--burst", "--grace", "1s"]],
    ("workflows", "worker"): [["{app}", "--poll", "0.1"]],
    ("run",): [["{app}", "--grace", "1s"]],
    ("streams", "consume"): [["{app}"]],
    ("dashboard",): [["--url", EXPORTER, "--port", "0"]],
    ("demo",): [["--only", "queue"]],
    ("pool", "serve"): [["{app}", "--url", f"nats://admin:{SECRET}@127.0.0.1:{CLOSED}"]],
}


def test_every_command_has_a_recipe() -> None:
    missing = [
        " ".join(path) for path in leaf_commands() if path not in IN_PROCESS and path not in SUBPROCESS
    ]
    assert not missing, f"add a recipe to IN_PROCESS or SUBPROCESS for: {missing}"


def _fill(argv: list[str], p: Planted) -> list[str]:
    values = {"job": p.ids["job"], "workflow": p.ids["workflow"], "stream": p.env["FSEC_STREAM"]}
    values["app"] = str(p.app_file)
    return [a.format(**values) for a in argv]


def _assert_clean(command: str, *texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, f"`foundry {command}` printed the password:\n{text}"


@pytest.mark.parametrize("planted", ["postgres", "redis", "rabbitmq", "refused"], indirect=True)
def test_no_command_prints_a_password(
    planted: Planted, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    ran: set[tuple[str, ...]] = set()
    for path in leaf_commands():
        for argv in IN_PROCESS.get(path, []):
            full = [*path, *_fill(argv, planted)]
            try:
                cli(full)
            except SystemExit:  # argparse refusing a recipe is a broken recipe, not a pass
                raise AssertionError(f"`foundry {' '.join(full)}` is not a valid command line") from None
            out = capsys.readouterr()
            _assert_clean(" ".join(full), out.out, out.err, caplog.text)
            if path[0] in ("jobs", "workflows", "streams"):  # it used the planted store, masked
                assert ":***@" in out.err, (full, out.err)
            ran.add(path)
    # The serving commands each wait a moment after their first line: run them side by side.
    served = [
        (path, [*path, *_fill(argv, planted)])
        for path in leaf_commands()
        for argv in SUBPROCESS.get(path, [])
    ]
    with ThreadPoolExecutor(len(served)) as pool:
        outputs = list(pool.map(lambda item: _serve(planted, item[1]), served))
    for (path, full), (out, err) in zip(served, outputs, strict=True):
        _assert_clean(" ".join(full), out, err)
        ran.add(path)
    assert ran == set(leaf_commands())


def _serve(p: Planted, argv: list[str], timeout: float = 60.0) -> tuple[str, str]:
    """Run ``foundry ARGV`` in a process until it exits, or (a server) until it printed
    its first line and a moment passed, then SIGTERM; its stdout and stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "foundry.cli", *argv],
        cwd=p.dir,
        env={**os.environ, **p.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: dict[str, list[str]] = {"out": [], "err": []}

    def pump(name: str, stream: Any) -> None:
        for line in stream:
            lines[name].append(line)

    pumps = [
        threading.Thread(target=pump, args=("out", proc.stdout), daemon=True),
        threading.Thread(target=pump, args=("err", proc.stderr), daemon=True),
    ]
    for t in pumps:
        t.start()
    deadline = time.monotonic() + timeout
    said: float | None = None
    while proc.poll() is None and time.monotonic() < deadline:
        if said is None and (lines["out"] or lines["err"]):
            said = time.monotonic()
        if said is not None and time.monotonic() > said + 1.0 and argv[0] != "demo":
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.05)
    try:
        proc.wait(timeout=max(5.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for t in pumps:
        t.join(5.0)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    return "".join(lines["out"]), "".join(lines["err"])


# -- reprs and strs of the public objects --------------------------------------------------


def _objects(p: Planted) -> list[Any]:
    """The public objects of an app on the planted stores (opened, used once)."""
    import runpy

    from foundry.deliver.queue import runtime_for
    from foundry.deliver.worker import Worker
    from foundry.deliver.workflow import Worker as WorkflowWorker

    ns = runpy.run_path(str(p.app_file), run_name=f"secrets_app_{p.tag}")
    app = ns["app"]
    handle = ns["add"].submit(2, 3)
    flow = ns["flow"].enqueue(4)
    stream = ns["events"]
    stream.publish({"n": 2})
    queue_rt = runtime_for(app.context())
    worker = Worker(app, burst=True)
    wf_worker = WorkflowWorker(app)
    objects = [
        app,
        app.settings,
        app.context(),
        ns["add"],
        ns["add"].runner,
        ns["flow"],
        ns["flow"].runtime,
        ns["flow"].runtime.journal,
        stream,
        stream.runtime,
        stream.runtime.backend,
        handle,
        flow,
        queue_rt,
        queue_rt.backend,
        worker,
        wf_worker,
        app.errors,
    ]
    state = getattr(queue_rt.backend, "state", None)
    if state is not None:
        objects.append(state)
    p.closers = [worker.stop, lambda: wf_worker.stop(1), lambda: _release(queue_rt), app.close]  # type: ignore[attr-defined]
    return objects


def _release(rt: Any) -> None:
    from foundry.deliver.queue import release_runtime

    release_runtime(rt)


@pytest.mark.parametrize("planted", ["postgres", "redis", "rabbitmq"], indirect=True)
def test_no_repr_or_str_of_a_public_object_shows_a_password(planted: Planted) -> None:
    objects = _objects(planted)
    try:
        for obj in objects:
            for text in (repr(obj), str(obj)):
                for secret in SECRETS:
                    assert secret not in text, f"{type(obj).__name__}: {text}"
            for name in dir(obj):
                if name.startswith("_"):
                    continue
                try:
                    value = getattr(obj, name)
                except Exception:
                    continue
                if callable(value) or isinstance(value, str | bytes):  # data the caller gave, not output
                    continue
                for text in (repr(value), str(value)):
                    for secret in SECRETS:
                        assert secret not in text, f"{type(obj).__name__}.{name}: {text}"
    finally:
        for close in reversed(planted.closers):  # type: ignore[attr-defined]
            close()
