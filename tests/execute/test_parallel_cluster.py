"""``parallel`` on a cluster: what only a cluster can do to a run. A Dask worker killed
mid-map, a scheduler that goes away, a cluster that cannot be reached, workers that
cannot import the function, and how the cluster is configured. (The conformance tests
every engine passes are in ``test_parallel.py``.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from foundry import Foundry
from foundry.backends.cluster import open_cluster
from foundry.config import load_settings
from foundry.errors import ClusterError, ClusterUnavailableError, ConfigError
from foundry.execute.parallel import ParallelExecutor
from foundry.observe import names
from tests.clusters import ROOT, require_driver
from tests.execute.test_parallel import nap_and_log


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _wait_for_lines(
    path: Path,
    count: int,
    timeout: float = 60.0,
    proc: subprocess.Popen[str] | None = None,
    log: Path | None = None,
) -> None:
    """Until ``path`` has ``count`` lines; fails at once, with what it wrote, if ``proc``
    (the process writing them) exits first."""
    deadline = time.monotonic() + timeout
    while len(_lines(path)) < count:
        said = log.read_text()[-3000:] if log is not None and log.exists() else ""
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout is not None else ""
            raise AssertionError(
                f"the driver exited ({proc.returncode}) after {len(_lines(path))} items:\n"
                f"{out[-3000:]}\n{said}"
            )
        assert time.monotonic() < deadline, f"only {len(_lines(path))} of {count} items started:\n{said}"
        time.sleep(0.02)


def _wait_for_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on port {port}"
            time.sleep(0.1)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


# -- a worker dies mid-map ---------------------------------------------------------------


@pytest.mark.slow
def test_a_dask_worker_killed_mid_map_loses_no_item(dask_scheduler: Any, tmp_path: Path) -> None:
    import distributed

    log = tmp_path / "runs.log"
    ex = ParallelExecutor(workers=2, name="kill", cluster=dask_scheduler.scheduler_address)
    with distributed.Client(dask_scheduler.scheduler_address, set_as_default=False) as spy:
        pids = list(spy.run(os.getpid).values())
        victim = pids[0]
        killed = threading.Event()

        def kill_when_under_way() -> None:
            _wait_for_lines(log, 60)
            os.kill(victim, signal.SIGKILL)
            killed.set()

        killer = threading.Thread(target=kill_when_under_way, daemon=True)
        try:
            # Given: 400 items in chunks of 5 (~0.1 s each) on two worker processes
            killer.start()
            # When: one worker is SIGKILLed a quarter of the way through
            results = ex.map(nap_and_log, range(400), chunksize=5, kwargs={"log": str(log), "seconds": 0.02})
            killer.join(10)
            assert killed.is_set(), "the map ended before a worker could be killed"
            # Then: every item's result, at its own index; the scheduler re-ran the lost chunk
            assert results == list(range(400))
            runs = Counter(_lines(log))
            assert set(runs) == {str(n) for n in range(400)}
            # only chunks that were on the dead worker ran twice: the one computing there, and
            # (Dask's contract) any it had finished whose results were not fetched yet — a
            # few chunks, not a rerun of the map
            assert sum(runs.values()) - 400 <= 4 * 5, {k: v for k, v in runs.items() if v > 1}
            assert ex.metrics.value(names.PARALLEL_CHUNKS_LOST, unit="kill", engine="dask") == 0
        finally:
            ex.close()
            spy.wait_for_workers(2, timeout=120)  # the nanny restarts it; later tests want two


# -- the scheduler goes away -------------------------------------------------------------


@pytest.mark.slow
def test_a_dask_scheduler_killed_mid_map_fails_the_run_with_the_fix(tmp_path: Path) -> None:
    require_driver("distributed", "dask")
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []
    log = tmp_path / "runs.log"
    try:
        scheduler = ["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", str(port)]
        worker = ["distributed.cli.dask_worker", address, "--nthreads", "2", "--no-nanny"]
        for args in (scheduler, worker):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", *args, "--no-dashboard"],
                    env=_env(),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        _wait_for_port(port)
        ex = ParallelExecutor(workers=2, name="orphan", cluster=f"{address}?connect_timeout=60")
        ex._get_engine()  # connected (waits for the scheduler to listen)
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                ex.map(nap_and_log, range(60), chunksize=1, kwargs={"log": str(log), "seconds": 0.2})
            except BaseException as exc:
                outcome["error"] = exc

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        _wait_for_lines(log, 3)
        # When: the scheduler dies (SIGKILL: no goodbye to the client)
        procs[0].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        runner.join(60)
        # Then: the run fails promptly with ClusterUnavailableError naming the fix, not a hang
        assert not runner.is_alive()
        error = outcome.get("error")
        assert isinstance(error, ClusterUnavailableError), repr(error)
        assert time.monotonic() - killed_at < 30
        assert "Fix: restart the scheduler" in str(error)
        assert "the run stopped at chunk" in "\n".join(error.__notes__)
        assert len(_lines(log)) < 60
        began = time.monotonic()
        ex.close()
        assert time.monotonic() - began < 30
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)


# -- unreachable, misconfigured, missing code ----------------------------------------------


@pytest.mark.parametrize("scheme", ["tcp", "ray"])
def test_an_unreachable_cluster_fails_fast_with_the_fix(scheme: str) -> None:
    require_driver("distributed" if scheme == "tcp" else "ray", "dask" if scheme == "tcp" else "ray")
    url = f"{scheme}://127.0.0.1:{_free_port()}?connect_timeout=2"
    ex = ParallelExecutor(workers=2, name="nowhere", cluster=url)
    began = time.monotonic()
    with pytest.raises(ClusterUnavailableError, match="is not available: cannot connect") as info:
        ex.map(nap_and_log, range(200), chunksize=10, kwargs={"log": os.devnull, "seconds": 0})
    assert time.monotonic() - began < 10
    assert "Fix: start the" in str(info.value)
    ex.close()


@pytest.mark.parametrize("engine", ["dask", "ray"])  # local children share this process's sys.path
def test_workers_that_cannot_import_the_function_fail_it_with_the_fix(
    engine: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if engine == "dask":
        cluster_url = str(request.getfixturevalue("dask_scheduler").scheduler_address)
    else:
        cluster_url = str(request.getfixturevalue("ray_url"))
    # Given: a module only this process can import (its directory is on our sys.path only)
    (tmp_path / "only_here_mod.py").write_text("def double(n):\n    return 2 * n\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from only_here_mod import double  # type: ignore[import-not-found]

    ex = ParallelExecutor(workers=2, name="missing", cluster=cluster_url)
    try:
        with pytest.raises(ClusterError, match="must run the same code and packages") as info:
            ex.map(double, range(200), chunksize=50)
        assert "only_here_mod" in str(info.value)
    finally:
        ex.close()
        sys.modules.pop("only_here_mod", None)


def test_the_cluster_is_configured_by_argument_environment_or_foundry_toml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FOUNDRY_CLUSTER", raising=False)
    assert load_settings(cwd=tmp_path).cluster == "local://"
    (tmp_path / "foundry.toml").write_text('[foundry]\ncluster = "ray://head:10001"\n')
    assert load_settings(cwd=tmp_path).cluster == "ray://head:10001"
    monkeypatch.setenv("FOUNDRY_CLUSTER", "tcp://scheduler:8786")
    assert load_settings(cwd=tmp_path).cluster == "tcp://scheduler:8786"
    assert load_settings(cwd=tmp_path, cluster="dask://other:8786").cluster == "dask://other:8786"
    with pytest.raises(ConfigError, match=r"did you mean dask://\?"):
        Foundry("typo", cluster="dsak://scheduler:8786")
    with pytest.raises(ConfigError, match="unknown option 'workers'"):
        open_cluster("tcp://127.0.0.1:1?workers=3")
    with pytest.raises(ConfigError, match="connect_timeout must be a number"):
        open_cluster("tcp://127.0.0.1:1?connect_timeout=soon")


def test_a_missing_driver_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("ray", "foundry.backends.cluster.ray"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ModuleNotFoundError
    with pytest.raises(ConfigError, match=r'pip install "foundry-exec\[ray\]"'):
        open_cluster("ray://head:10001")


_RAY_CLIENT = """
import json, sys
from foundry.execute.parallel import ParallelExecutor
from tests.execute.test_parallel import nap_and_log

url, log = sys.argv[1], sys.argv[2]
ex = ParallelExecutor(workers=2, name="remote", cluster=url)
try:
    ex.map(nap_and_log, range(80), chunksize=1, kwargs={"log": log, "seconds": 0.2})
    print(json.dumps({"error": None}))
except Exception as exc:
    notes = getattr(exc, "__notes__", [])
    print(json.dumps({"error": type(exc).__name__, "message": str(exc), "notes": notes}))
"""


def _descendants(pid: int) -> list[int]:
    """Every process ``pid`` started, and theirs (from /proc: the head's own tree only)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
def test_a_ray_head_stopped_mid_map_fails_the_run_with_the_fix(tmp_path: Path) -> None:
    require_driver("ray", "ray")
    gcs, client, agent, metrics, runtime_env = (_free_port() for _ in range(5))
    temp = f"/tmp/rayfm{os.getpid()}{gcs}"
    # a private head (Ray Client sends no token); the client gives up on a head it lost after
    # 2 s instead of its default 30
    env = {**_env(), "RAY_AUTH_MODE": "disabled", "RAY_CLIENT_RECONNECT_GRACE_PERIOD": "2"}
    log = tmp_path / "runs.log"
    head = subprocess.Popen(
        ["ray", "start", "--head", "--block", "--port", str(gcs), "--ray-client-server-port", str(client),
         "--num-cpus", "2", "--include-dashboard", "false", "--disable-usage-stats",
         "--dashboard-agent-listen-port", str(agent), "--metrics-export-port", str(metrics),
         "--runtime-env-agent-port", str(runtime_env), "--temp-dir", temp],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    driver: subprocess.Popen[str] | None = None
    tree: list[int] = []
    try:
        _wait_for_port(client, timeout=120)
        # Given: a map through Ray Client (ray://) in another process
        said = tmp_path / "driver.err"
        with said.open("w") as err:
            driver = subprocess.Popen(
                [sys.executable, "-c", _RAY_CLIENT, f"ray://127.0.0.1:{client}?connect_timeout=60", str(log)],
                env=env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        _wait_for_lines(log, 3, timeout=120, proc=driver, log=said)
        # When: the head node goes away at once (every process of it SIGKILLed, as a machine dies)
        tree = [head.pid, *_descendants(head.pid)]
        _kill(tree)
        out, _ = driver.communicate(timeout=120)
        # Then: the run fails with ClusterUnavailableError naming the fix, not a hang
        report = json.loads(out.strip().splitlines()[-1])
        assert report["error"] == "ClusterUnavailableError", report
        assert "Fix: restart the head node" in report["message"], report
        assert len(_lines(log)) < 80
    finally:
        if head.poll() is None:  # the whole tree, found before its root goes
            tree += [head.pid, *_descendants(head.pid)]
        _kill(tree)
        for proc in (driver, head):
            if proc is not None:
                if proc.poll() is None:
                    proc.kill()
                proc.wait(60)
                if proc.stdout is not None:  # a failed run leaves the pipe unread
                    proc.stdout.close()
        shutil.rmtree(temp, ignore_errors=True)


class _FlakyHandshake:
    """Stands in for ``distributed.Client``: its first ``failures`` constructions fail as
    distributed's handshake does when a broadcast shares the scheduler's first batch."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self, address: str, **kwargs: Any) -> object:
        self.calls += 1
        if self.calls <= self.failures:
            raise AssertionError
        return object()


@pytest.mark.parametrize(("failures", "connects"), [(0, True), (2, True), (3, False)])
def test_a_dask_handshake_that_meets_a_broadcast_is_tried_again_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch, failures: int, connects: bool
) -> None:
    require_driver("distributed", "dask")
    from foundry.backends.cluster import dask as dask_engine

    fake = _FlakyHandshake(failures)
    monkeypatch.setattr(dask_engine, "Client", fake)
    with socket.create_server(("127.0.0.1", 0)) as listening:  # the probe finds a listener
        url = f"tcp://127.0.0.1:{listening.getsockname()[1]}"
        if connects:
            engine = dask_engine.DaskCluster(url)
            assert engine._client is not None
            assert fake.calls == failures + 1
        else:
            with pytest.raises(ClusterUnavailableError, match="handshake failed 3 times running") as info:
                dask_engine.DaskCluster(url)
            assert "Fix:" in str(info.value)
            assert fake.calls == 3
