"""``result_ttl=`` on a queue unit: a finished job's record is kept for that long after it
finished (read as often as anyone likes), then purged, and its id reads as unknown with
a message that says why — on every engine. The purge is asked for at a time past the
ttl (``purge(now=...)``), so no test waits for it."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from foundry import Foundry
from foundry.backends.queue import open_queue_backend
from foundry.errors import DeclarationError, NotFoundError
from tests.backends.queue.engines import ENGINES
from tests.deliver import queue_app
from tests.deliver._env import Env

DEFAULT_TTL = 7 * 86400.0


@pytest.mark.parametrize("engine", ENGINES)
def test_a_result_past_its_ttl_is_purged_and_one_within_it_is_kept(
    make_env: Callable[[str], Env], engine: str
) -> None:
    # Given two units that keep their results for a minute and for an hour, and the default
    env = make_env(engine)
    env.app.work(durable=True, result_ttl="1m", name="brief")(queue_app.add)
    env.app.work(durable=True, result_ttl="1h", name="kept")(queue_app.add)
    env.worker()
    brief = env.unit("brief").submit(1, 2)
    kept = env.unit("kept").submit(3, 4)
    plain = env.unit("add").submit(5, 6)
    unread = env.unit("brief").submit(2, 2)  # finished, never read by its handle
    assert [brief.result(30), kept.result(30), plain.result(30)] == [3, 7, 11]
    assert env.settled_kinds(unread.id)[-1] == "succeeded"
    now = time.time()

    def purge_at(later: float) -> None:
        backend = open_queue_backend(env.url)
        try:
            backend.purge(now=now + later)
        finally:
            backend.close()

    # When the store is purged within every ttl, nothing goes, read after read
    purge_at(30)
    for handle in (brief, kept, plain):
        assert env.app.job(handle.id).result(timeout=30) == handle.result(0)
    # When it is purged two minutes on
    purge_at(120)
    # Then the brief job's record is gone, and its id says so (not a hang, not a None)
    with pytest.raises(NotFoundError, match=rf"no job '{brief.id}' in queue .*purged after its result_ttl"):
        env.app.job(brief.id)
    with pytest.raises(
        NotFoundError, match=rf"job {unread.id} is not in queue .*purged after its result_ttl"
    ):
        unread.result(timeout=30)  # (a handle that had read its result keeps it in memory)
    # and the jobs within their ttl are kept
    assert env.app.job(kept.id).result(timeout=30) == 7
    assert env.app.job(plain.id).result(timeout=30) == 11
    # When it is purged two hours on, the hour's job goes and the default's (7 days) stays
    purge_at(2 * 3600)
    with pytest.raises(NotFoundError, match="purged after its result_ttl"):
        env.app.job(kept.id)
    assert env.app.job(plain.id).result(timeout=30) == 11
    purge_at(DEFAULT_TTL + 60)
    with pytest.raises(NotFoundError, match="purged after its result_ttl"):
        env.app.job(plain.id)


def test_result_ttl_is_validated_at_declaration() -> None:
    app = Foundry("ttl-checks")
    try:
        for bad, why in [(0, "no time at all"), ("-1s", "is negative"), ("soon", "is not a duration")]:
            with pytest.raises(DeclarationError, match=rf"result_ttl.*{why}"):
                app.work(durable=True, result_ttl=bad, name=f"bad{len(app.units)}")(queue_app.add)
        with pytest.raises(DeclarationError, match=r"result_ttl.*Fix: declare durable=True"):
            app.work(result_ttl="1h", name="in_process")(queue_app.add)  # nothing stores its result
        assert app.work(durable=True, result_ttl="2d", name="ok")(queue_app.add).traits.result_ttl == 172800.0
        with pytest.raises(DeclarationError, match=r"result_ttl.*a workflow's result stays in its journal"):
            app.workflow(result_ttl="1h", name="flow")(lambda wf: None)
        with pytest.raises(DeclarationError, match=r"result_ttl.*Fix: use retention="):
            app.stream("events", result_ttl="1h")
    finally:
        app.close()
