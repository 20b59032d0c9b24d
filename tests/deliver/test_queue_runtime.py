"""The queue delivery model end to end: submit → worker → result, in one process and
across processes; retries, idempotency, cancel, bad input, timeouts, isolation,
prefetch and graceful stop. SQLite unless a test says otherwise (the engines' own
clauses are the conformance suite's)."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from foundry import Foundry
from foundry.backends.queue import JobStatus, NewJob, open_queue_backend
from foundry.errors import (
    CancelledError,
    ChildCrashedError,
    ConfigError,
    DeadLetteredError,
    PayloadTooLargeError,
    RemoteError,
    SubmitError,
    WorkTimeoutError,
)
from foundry.observe import names
from tests.backends.queue.engines import ENGINES
from tests.deliver import queue_app
from tests.deliver._env import Env, python

# -- submit, run, result --------------------------------------------------------------


def test_submit_runs_on_a_worker_and_the_result_comes_back(env: Env) -> None:
    env.worker()
    handle = env.unit("add").submit(2, 3)
    assert handle.result(timeout=30) == 5
    assert handle.done()
    assert handle.status.value == "succeeded"
    assert env.unit("async_add").submit(4, 5).result(timeout=30) == 9
    assert env.unit("add")(10, 20) == 30  # call() submits and waits


@pytest.mark.parametrize("engine", ENGINES)
def test_a_worker_process_runs_jobs_and_another_process_reads_the_results(
    make_env: Callable[[str], Env], engine: str
) -> None:
    # Given jobs submitted here and a worker in another process
    env = make_env(engine)
    handles = [env.unit("add").submit(i, i) for i in range(20)]
    python("-m", "foundry.cli", "worker", "tests.deliver.queue_app:app", "--burst", "-q", queue=env.url)
    # Then the submitter sees every result, and so does a third process holding only the id
    assert [h.result(timeout=30) for h in handles] == [2 * i for i in range(20)]
    if engine != "sqlite":
        return  # the third process's view is the same code on every engine
    code = (
        "import sys; from tests.deliver.queue_app import app; "
        "print(app.job(sys.argv[1]).result(30)); app.close()"
    )
    assert python("-c", code, handles[7].id, queue=env.url).strip() == "14"


def test_app_job_rebuilds_a_handle_from_an_id(env: Env) -> None:
    env.worker()
    handle = env.unit("add").submit(1, 1)
    other = Foundry("another-process", queue=env.url)
    try:
        again = other.job(handle.id)
        assert again.unit == "add"
        assert again.result(timeout=30) == 2
        with pytest.raises(Exception, match="no job"):
            other.job("no-such-job")
    finally:
        other.close()


# -- retries ---------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_failures_are_retried_with_backoff_until_success(make_env: Callable[[str], Env], engine: str) -> None:
    env = make_env(engine)
    env.worker()
    key = uuid.uuid4().hex
    handle = env.unit("flaky").submit(key, 2)
    assert handle.result(timeout=30) == f"{key} after 3"
    assert env.settled_kinds(handle.id) == ["started", "retry", "started", "retry", "started", "succeeded"]
    backend = open_queue_backend(env.url)
    try:
        state = backend.get(handle.id)
    finally:
        backend.close()
    assert state is not None
    assert (state.status, state.attempts, state.deliveries) == (JobStatus.SUCCEEDED, 2, 3)
    assert env.app.metrics.value(names.JOB_RETRIES, unit="flaky") == 2


def test_retries_exhausted_fail_with_the_original_exception(env: Env) -> None:
    env.worker()
    key = uuid.uuid4().hex
    handle = env.unit("flaky").submit(key, 10)
    with pytest.raises(queue_app.Flaky, match="attempt 4") as info:
        handle.result(timeout=30)
    assert "remote traceback" in "".join(getattr(info.value, "__notes__", []))
    assert handle.status.value == "failed"
    assert env.kinds(handle.id).count("retry") == 3
    assert env.app.metrics.value(names.UNIT_FAILED, unit="flaky") == 1


def test_retry_on_filters_which_failures_are_retried(env: Env) -> None:
    env.worker()
    value, conn = env.unit("picky").submit("value"), env.unit("picky").submit("conn")
    with pytest.raises(ValueError, match="not retried"):
        value.result(timeout=30)
    with pytest.raises(queue_app.Flaky):
        conn.result(timeout=30)
    assert env.kinds(value.id).count("retry") == 0
    assert env.kinds(conn.id).count("retry") == 2


# -- idempotency, delay, cancel, priorities --------------------------------------------------------


def test_an_idempotency_key_returns_the_same_job(env: Env) -> None:
    add = env.unit("add")
    first = add.options(key="order-42").submit(1, 2)
    second = add.options(key="order-42").submit(100, 200)
    assert second.id == first.id
    env.worker()
    assert second.result(timeout=30) == 3


def test_an_idempotent_unit_derives_its_key_from_its_arguments(env: Env) -> None:
    idem = env.unit("idem_add")
    a, b, c = idem.submit(1, 2), idem.submit(1, 2), idem.submit(2, 1)
    assert a.id == b.id
    assert c.id != a.id
    env.worker()
    assert (a.result(timeout=30), c.result(timeout=30)) == (3, 3)


@pytest.mark.parametrize("engine", ENGINES)
def test_submit_many_enqueues_in_chunks_and_every_result_comes_back(
    make_env: Callable[[str], Env], engine: str
) -> None:
    env = make_env(engine)
    add, idem = env.unit("add"), env.unit("idem_add")
    # 1,203 jobs: two full chunks of 500 and a partial one, in order.
    handles = add.submit_many([(i, 1) for i in range(1203)], star=True)
    assert len(handles) == 1203
    assert len({h.id for h in handles}) == 1203
    # idempotent units key each call by its arguments, across chunks and single submits
    again = idem.submit_many([(1, 2), (1, 2), (3, 4)], star=True)
    assert again[0].id == again[1].id == idem.submit(1, 2).id
    assert again[2].id != again[0].id
    # options apply to every job of the batch; a key cannot name many jobs
    later = add.options(delay="1h", priority=5).submit_many([(0, 0)], star=True)
    assert later[0].status.value == "queued"
    with pytest.raises(SubmitError, match="names one submission"):
        add.options(key="k").submit_many([(1, 1)], star=True)
    with pytest.raises(SubmitError, match="item 1 is a int"):
        add.submit_many([(1, 1), 7], star=True)
    env.worker(concurrency=8)
    assert [h.result(timeout=120) for h in handles] == [i + 1 for i in range(1203)]
    assert [h.result(timeout=30) for h in again] == [3, 3, 7]
    assert env.unit("small").submit_many(["a", {"b": 1}])[1].result(timeout=30) == {"b": 1}


def test_submit_many_on_an_in_process_unit_submits_one_by_one() -> None:
    app = Foundry("many-inproc")
    try:

        @app.work(bound="io", concurrency=4)
        def double(x: int) -> int:
            return 2 * x

        assert [h.result(timeout=10) for h in double.submit_many(range(5))] == [0, 2, 4, 6, 8]
    finally:
        app.close()


def test_cancel_a_delayed_job_and_it_never_runs(env: Env) -> None:
    env.worker()
    handle = env.unit("add").options(delay="2s").submit(1, 1)
    assert handle.status.value == "queued"
    assert handle.cancel()
    assert handle.status.value == "cancelled"
    with pytest.raises(CancelledError):
        handle.result(timeout=5)
    assert env.unit("add").submit(2, 2).result(timeout=30) == 4
    assert env.kinds(handle.id) == []


def test_priority_and_eta_are_kept_in_the_store(env: Env) -> None:
    add = env.unit("add")
    eta = time.time() + 60
    later = add.options(eta=eta, priority=7).submit(1, 1)
    backend = open_queue_backend(env.url)
    try:
        state = backend.get(later.id)
    finally:
        backend.close()
    assert state is not None
    assert state.priority == 7
    assert state.eta == pytest.approx(eta)
    with pytest.raises(SubmitError, match="not both"):
        add.options(eta=eta, delay="1s").submit(1, 1)


# -- bad input: a clear error, or a dead letter with the reason; nothing else disturbed ----------------


def test_unknown_unit_and_undecodable_payload_are_dead_lettered(env: Env) -> None:
    backend = open_queue_backend(env.url)
    try:
        backend.enqueue(
            NewJob(id="ghost-1", queue="default", unit="ghost", payload=b'{"args":[],"kwargs":{}}')
        )
        backend.enqueue(NewJob(id="garbled-1", queue="default", unit="add", payload=b"\x00not json"))
        backend.enqueue(NewJob(id="shape-1", queue="default", unit="add", payload=b'{"args": 5}'))
        backend.enqueue(NewJob(id="pickled-1", queue="default", unit="add", payload=b"x", codec="pickle"))
    finally:
        backend.close()
    good = env.unit("add").submit(3, 4)
    env.worker()
    assert good.result(timeout=30) == 7  # nothing else disturbed
    reasons = {}
    for job_id in ("ghost-1", "garbled-1", "shape-1", "pickled-1"):
        with pytest.raises(DeadLetteredError) as info:
            env.app.job(job_id).result(timeout=30)
        reasons[job_id] = info.value.reason
    assert "unknown unit 'ghost'" in reasons["ghost-1"]
    assert "undecodable payload" in reasons["garbled-1"]
    assert "undecodable payload" in reasons["shape-1"]
    assert "pickle" in reasons["pickled-1"]
    assert env.app.metrics.value(names.JOB_DEAD, unit="ghost") == 1


def test_oversized_and_unencodable_arguments_are_refused_at_submit(env: Env) -> None:
    with pytest.raises(PayloadTooLargeError, match="max_payload=1024"):
        env.unit("small").submit("x" * 2000)
    with pytest.raises(SubmitError, match="JSON"):
        env.unit("small").submit(object())  # (echo's value is Any: the codec says what is wrong)
    with pytest.raises(SubmitError, match="parameter a is declared int, and was given object"):
        env.unit("add").submit(object(), 1)  # (add's is an int: the annotation says what is wrong)
    backend = open_queue_backend(env.url)
    try:
        assert backend.stats("default").depth == 0  # nothing was enqueued
    finally:
        backend.close()
    env.worker()
    assert env.unit("small").submit("fits").result(timeout=30) == "fits"


def test_a_result_that_cannot_be_encoded_fails_the_job_clearly(env: Env) -> None:
    env.worker()
    handle = env.unit("small").submit(None)
    assert handle.result(timeout=30) is None
    app = env.app
    unit = app.work(durable=True, name="returns_object")(queue_app.echo)
    original = unit.fn
    unit.fn = lambda value: object()  # type: ignore[method-assign]
    try:
        with pytest.raises((SubmitError, RemoteError), match="JSON"):
            unit.submit(1).result(timeout=30)
    finally:
        unit.fn = original  # type: ignore[method-assign]


def test_bad_urls_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="did you mean sqlite"):
        Foundry("typo", queue="sqlte:///queue.db")
    with pytest.raises(ConfigError, match="scheme"):
        Foundry("typo", queue="localhost:6379")


# -- execution models, timeouts, isolation -----------------------------------------------------------


def test_an_isolated_unit_runs_in_a_child_and_a_crash_fails_only_that_job(env: Env) -> None:
    env.worker()
    pid = env.unit("where").submit().result(timeout=60)
    assert pid != os.getpid()
    crashed, fine = env.unit("crash").submit("kill"), env.unit("crash").submit("fine")
    with pytest.raises(ChildCrashedError, match="SIGKILL"):
        crashed.result(timeout=60)
    assert fine.result(timeout=60) == "fine"


def test_a_job_past_its_timeout_fails_with_work_timeout(env: Env) -> None:
    env.worker()
    handle = env.unit("sleepy").submit(1.5)
    with pytest.raises(WorkTimeoutError, match="timeout"):
        handle.result(timeout=30)
    assert env.unit("sleepy").submit(0.01).result(timeout=30) == 0.01


# -- prefetch, graceful stop, metrics -----------------------------------------------------------------


def test_prefetch_one_holds_one_job_at_a_time(env: Env) -> None:
    handles = [env.unit("sleepy").submit(0.05) for _ in range(6)]
    w = env.worker(concurrency=4, prefetch=1)
    seen = []
    while not all(h.done() for h in handles):
        with w.loops[0].lock:
            seen.append(len(w.loops[0].held))
        seen.append(int(env.app.metrics.value(names.UNIT_IN_FLIGHT, unit="sleepy")))
    assert max(seen) <= 1  # never two jobs held, never two running, although 4 threads are free
    assert [h.result(timeout=30) for h in handles] == [0.05] * 6


def test_graceful_stop_finishes_running_jobs_and_gives_back_the_rest(env: Env) -> None:
    sleepy = env.unit("sleepy")
    running = sleepy.submit(0.2)
    waiting = [sleepy.submit(0.2) for _ in range(3)]
    w = env.worker(concurrency=1, prefetch=4)
    while not env.kinds(running.id):
        time.sleep(0.01)
    w.stop(grace=10)
    assert running.result(timeout=5) == 0.2  # finished within the grace period
    backend = open_queue_backend(env.url)
    try:
        states = [backend.get(h.id) for h in waiting]
    finally:
        backend.close()
    assert all(s is not None and s.status is JobStatus.QUEUED and s.deliveries == 0 for s in states)
    env.worker()
    assert [h.result(timeout=30) for h in waiting] == [0.2] * 3


def test_stop_without_grace_releases_a_running_job_for_immediate_redelivery(env: Env) -> None:
    env.app.work(durable=True, name="long")(queue_app.sleepy)
    handle = env.unit("long").submit(0.6)
    w = env.worker(concurrency=1)
    while not env.kinds(handle.id):
        time.sleep(0.01)
    w.stop(grace=0)
    assert "released" in env.kinds(handle.id)
    env.worker()
    assert handle.result(timeout=30) == 0.6


def test_metrics_cover_depth_age_and_outcomes(env: Env) -> None:
    handles = [env.unit("add").submit(i, 1) for i in range(3)]
    metrics = env.app.metrics
    assert metrics.value(names.QUEUE_DEPTH, queue="default") == 3
    assert metrics.value(names.QUEUE_OLDEST_AGE, queue="default") >= 0
    env.worker()
    for h in handles:
        h.result(timeout=30)
    assert metrics.value(names.UNIT_COMPLETED, unit="add") == 3
    assert metrics.value(names.QUEUE_DEPTH, queue="default") == 0
    text = metrics.prometheus()
    for name in (names.QUEUE_DEPTH, names.QUEUE_OLDEST_AGE, names.UNIT_COMPLETED, names.UNIT_IN_FLIGHT):
        assert name in text


def test_jobs_cli_lists_shows_and_requeues_dead_letters(env: Env) -> None:
    from foundry.cli import main

    backend = open_queue_backend(env.url)
    try:
        backend.enqueue(
            NewJob(id="ghost-2", queue="default", unit="ghost", payload=b'{"args":[],"kwargs":{}}')
        )
    finally:
        backend.close()
    w = env.worker()
    while "dead" not in env.kinds("ghost-2"):
        time.sleep(0.01)
    w.stop()
    assert main(["jobs", "dead", "--url", env.url, "--json"]) == 0
    assert main(["jobs", "show", "ghost-2", "--url", env.url, "--json"]) == 0
    assert main(["jobs", "requeue", "ghost-2", "--url", env.url]) == 0
    assert main(["jobs", "requeue", "ghost-2", "--url", env.url]) == 1  # queued now, not dead
    assert main(["jobs", "cancel", "ghost-2", "--url", env.url]) == 0
    assert main(["jobs", "show", "nope", "--url", env.url]) == 1


def test_jobs_cli_json_is_parseable(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    from foundry.cli import main

    env.unit("add").submit(1, 2)
    assert main(["jobs", "list", "--url", env.url, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["unit"] == "add"
    assert rows[0]["status"] == "queued"


# -- configuration, CLI and demo ----------------------------------------------------------------------


def test_a_missing_driver_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "foundry.backends.queue.postgres", raising=False)
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if it were not installed
    with pytest.raises(ConfigError, match=r'pip install "foundry-exec\[postgres\]"'):
        open_queue_backend("postgresql://u@127.0.0.1/db")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--queue", "emails=x"], "--queue"),
        (["--queue", "=3"], "--queue"),
        (["--lease", "soon"], "--lease"),
        (["--concurrency", "0"], "--concurrency"),
    ],
)
def test_worker_cli_refuses_bad_options(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from foundry.cli import main

    assert main(["worker", "tests.deliver.queue_app:app", *argv]) == 2
    assert message in capsys.readouterr().err


def test_worker_cli_refuses_an_app_that_does_not_exist(capsys: pytest.CaptureFixture[str]) -> None:
    from foundry.cli import main

    assert main(["worker", "tests.deliver.no_such_module:app", "--burst"]) != 0
    assert "no module named" in capsys.readouterr().err


def test_worker_cli_serves_the_queues_it_is_given(env: Env) -> None:
    handles = [env.unit("add").submit(i, 0) for i in range(3)]
    out = python(
        *("-m", "foundry.cli", "worker", "tests.deliver.queue_app:app", "--queue", "default=2"),
        *("--prefetch", "1", "--burst", "--url", env.url),
    )
    assert "defaultx2 (prefetch 1)" in out
    assert "succeeded 3" in out
    assert [h.result(timeout=10) for h in handles] == [0, 1, 2]


def test_the_demo_section_runs_on_the_embedded_queue(home: Path) -> None:
    import io

    from rich.console import Console

    from foundry.demos import queue as demo

    out = io.StringIO()
    demo.run(Console(file=out, width=140))
    text = out.getvalue()
    assert "retry 1/3" in text
    assert "succeeded" in text
    assert "returned the same job: True" in text
