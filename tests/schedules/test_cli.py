"""``foundry schedules list``: each schedule with its next and last runs, the store it read
named on stderr, and a store that does not exist yet left uncreated."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from foundry import Foundry
from foundry.deliver.scheduler import Scheduled, Scheduler

APP = """
from foundry import Foundry

app = Foundry("listed", queue={queue!r}, home={home!r})


@app.work(schedule="0 9 * * MON-FRI", tz="Europe/Berlin", missed="catch_up", catch_up=2)
def report() -> None: ...


@app.work(schedule="every 30s")
def beat() -> None: ...
"""


@pytest.fixture
def app_file(tmp_path: Path) -> Path:
    path = tmp_path / "listed.py"
    path.write_text(APP.format(queue=f"sqlite:///{tmp_path / 'queue.db'}", home=str(tmp_path)))
    return path


def run_scheduler_once(tmp_path: Path) -> None:
    """What a `foundry run` does first: look at the schedules (first sight), and later enqueue."""
    app = Foundry("listed", queue=f"sqlite:///{tmp_path / 'queue.db'}", home=tmp_path)

    @app.work(schedule="every 30s")
    def beat() -> None: ...

    scheduler = Scheduler([Scheduled(beat.spec, beat.schedule)], app.context(), clock=lambda: 1_700_000_000.5)  # type: ignore[arg-type]
    scheduler.look()
    scheduler.clock = lambda: 1_700_000_010.5  # the tick at ...010 (a multiple of 30)
    scheduler.look()
    scheduler.stop()
    app.close()


def test_list_shows_declared_schedules_with_their_records(
    cli: Callable[..., tuple[int, str, str]], app_file: Path, tmp_path: Path
) -> None:
    run_scheduler_once(tmp_path)
    code, out, err = cli("schedules", "list", str(app_file), "--json")
    assert code == 0, err
    assert f"queue sqlite:///{tmp_path / 'queue.db'}" in err  # the store it read
    rows = {row["unit"]: row for row in json.loads(out)}
    assert rows["report"]["schedule"] == "0 9 * * MON-FRI"
    assert rows["report"]["tz"] == "Europe/Berlin"
    assert rows["report"]["missed"] == "catch_up=2"
    assert rows["report"]["last"] is None
    assert rows["report"]["state"] == "declared, not seen by a scheduler yet"
    assert rows["beat"]["last"] == 1_700_000_010.0
    assert rows["beat"]["last_job"]
    assert rows["beat"]["next"] % 30 == 0
    # long since then, with no scheduler up: it says so
    assert "due tick(s) not enqueued: is `foundry run` up?" in rows["beat"]["state"]


def test_list_without_the_app_reads_the_records_alone(
    cli: Callable[..., tuple[int, str, str]], tmp_path: Path
) -> None:
    run_scheduler_once(tmp_path)
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    code, out, err = cli("schedules", "list", "--url", url)
    assert code == 0, err
    assert "(from the command line" in err
    assert "beat" in out
    assert "every 30s" in out


def test_list_creates_no_store(cli: Callable[..., tuple[int, str, str]], tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "queue.db"
    code, out, err = cli("schedules", "list", "--url", f"sqlite:///{missing}")
    assert code == 0, err
    assert "no schedules" in out
    assert not missing.exists()
    assert not missing.parent.exists()
