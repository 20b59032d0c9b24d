"""What a new user trips over in the first hour, each fixed and kept fixed: a plan cut off in
an 80-column terminal, piped output that ignores ``COLUMNS``, the demo's own command
refused, ``jobs show`` wanting the whole id, ``att.`` saying 0 for a job that ran, and a
read-only command leaving an empty database behind."""

from __future__ import annotations

import io
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from foundry import Foundry
from foundry.backends.queue import open_queue_backend
from foundry.backends.queue.base import NewJob
from foundry.cli import build_parser
from foundry.cli._target import find_apps, load_module, plan_rows
from foundry.explain import first_failure, phase_rows, plan_table

CLI = Callable[..., tuple[int, str, str]]
PAYLOAD = b'{"args": [], "kwargs": {}}'


def _words(text: str) -> set[str]:
    return set(re.findall(r"[\w'()-]+", text))


def _seed_rows() -> list[Any]:
    return plan_rows(find_apps(load_module("foundry.examples.seeds")))


# -- the plan in a narrow terminal and in a pipe ----------------------------------------------


@pytest.mark.parametrize("width", [60, 80, 100, 140, 200])
@pytest.mark.parametrize("terminal", [True, False])
def test_the_plan_fits_the_width_without_cutting_a_word(width: int, terminal: bool) -> None:
    # Given the seeds' plan rendered at a terminal's width
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=terminal, color_system=None)
    rows = _seed_rows()
    console.print(plan_table(rows, title="Plan for foundry.examples.seeds"))
    text = buffer.getvalue()
    # Then nothing is cut off or dropped: every word of every cell is there, whole
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= width
    words = _words(text)
    for _, unit, main, phases in rows:
        for d in phase_rows(main, phases):
            needed = {unit, d.delivery, d.execution, *first_failure(d).split()}
            needed |= {w.code for w in d.warnings}
            assert needed <= words, (width, unit, d.phase, sorted(needed - words))


def test_a_piped_plan_honours_columns_and_has_no_trailing_spaces(
    cli: CLI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = cli("plan", "foundry.examples.seeds")
    assert code == 0, err
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert [line for line in lines if line != line.rstrip()] == []
    assert "FOUNDRY_HOME" not in os.environ  # the demo's state directory was its own
    assert "fallback" in _words(out)  # "simple / fallback", once cut to "fallba…"
    # Without COLUMNS a pipe gets 140 columns (rich's own default, 80, wraps every table)
    monkeypatch.delenv("COLUMNS")
    code, out, _ = cli("plan", "foundry.examples.seeds")
    lines = out.splitlines()
    assert 80 < max(len(line) for line in lines) <= 140
    assert "first failure mode" in out  # the table, with its header on one line
    assert [line for line in lines if line != line.rstrip()] == []


def test_a_piped_bill_has_no_trailing_spaces(cli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = cli("explain", "foundry.examples.seeds:handle_payment")
    assert code == 0
    assert [line for line in out.splitlines() if line != line.rstrip()] == []
    assert "…" not in out


def test_a_piped_demo_honours_columns_and_has_no_trailing_spaces(
    cli: CLI, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("FOUNDRY_HOME", raising=False)
    code, out, err = cli("demo", "--only", "inprocess", "--home", str(tmp_path))
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) > 10  # the section ran and printed its decisions
    assert max(len(line) for line in lines) <= 80
    assert [line for line in lines if line != line.rstrip()] == []


# -- shared options before and after the action ---------------------------------------------


@pytest.mark.parametrize(
    ("group", "action", "options"),
    [
        ("workflows", ["show", "ID"], ["--journal", "sqlite:///j.db"]),
        ("jobs", ["show", "ID"], ["--url", "sqlite:///q.db", "--json"]),
        ("jobs", ["list"], ["--json"]),
        ("streams", ["lag"], ["--url", "sqlite:///s.db"]),
        ("streams", ["dead", "signaling"], ["--json"]),
    ],
)
def test_shared_options_go_before_or_after_the_action(
    group: str, action: list[str], options: list[str]
) -> None:
    parser = build_parser()
    given_before = vars(parser.parse_args([group, *options, *action]))
    given_after = vars(parser.parse_args([group, *action, *options]))
    flag = options[0].lstrip("-")
    taken = {flag: True if len(options) == 1 else options[1]}
    assert given_before == given_after
    assert {key: given_before[key] for key in taken} == taken


def test_an_action_given_no_shared_option_keeps_the_groups() -> None:
    args = build_parser().parse_args(["jobs", "--url", "sqlite:///a.db", "list", "--limit", "3"])
    assert args.url == "sqlite:///a.db"  # the action's SUPPRESS default did not reset it
    args = build_parser().parse_args(["jobs", "--url", "sqlite:///a.db", "list", "--url", "sqlite:///b.db"])
    assert args.url == "sqlite:///b.db"  # given twice, the action's wins


def test_consume_refuses_the_store_options_given_before_it(cli: CLI) -> None:
    code, _, err = cli("streams", "--url", "sqlite:///s.db", "consume", "foundry.examples.seeds")
    assert code == 2
    assert "takes neither --url nor --json" in err


@pytest.fixture
def workflows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A journal with three finished workflows, two of them sharing an eight-letter prefix."""
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    app = Foundry("papercuts-wf", journal=url, home=tmp_path)

    @app.workflow()
    def provision(wf: Any, name: str) -> str:
        return name

    for workflow_id in ("provision-web-1", "provision-web-2", "teardown-00001"):
        assert provision.run(workflow_id, id=workflow_id) == workflow_id
    app.close()
    return url


def test_the_demos_inspect_command_runs_as_printed(cli: CLI, workflows: str) -> None:
    # `foundry demo` prints "Inspect: foundry workflows --journal URL show ID"
    code, out, err = cli("workflows", "--journal", workflows, "show", "teardown-00001")
    assert code == 0, err
    assert "succeeded" in out
    code, before, _ = cli("workflows", "--journal", workflows, "show", "teardown-00001", "--json")
    code, after, _ = cli("workflows", "show", "teardown-00001", "--journal", workflows, "--json")
    assert json.loads(before) == json.loads(after)
    assert json.loads(before)["id"] == "teardown-00001"


# -- ids by a unique prefix -------------------------------------------------------------------


def test_workflows_show_takes_a_unique_prefix_and_names_an_ambiguous_ones_candidates(
    cli: CLI, workflows: str
) -> None:
    code, out, err = cli("workflows", "show", "teardo", "--journal", workflows)
    assert code == 0, err
    assert "teardown-00001" in out
    code, _, err = cli("workflows", "show", "provision-web", "--journal", workflows)
    assert code == 1
    assert "2 workflows have an id beginning 'provision-web': provision-web-1, provision-web-2" in err
    assert "give more of the id" in err
    code, out, _ = cli("workflows", "show", "provision-web-2", "--journal", workflows)
    assert code == 0
    assert "provision-web-2" in out
    code, _, err = cli("workflows", "show", "tear", "--journal", workflows)  # under 6: exact only
    assert code == 1
    assert "no workflow with id 'tear'" in err


def _job(backend: Any, job_id: str, *, fail_first: bool = False, finish: bool = True) -> None:
    """Enqueue ``job_id`` and run it through the store's own calls: once, or failed once and
    retried, or left queued."""
    backend.enqueue(NewJob(id=job_id, queue="pc", unit="work", payload=PAYLOAD, max_retries=2))
    if not finish:
        return
    if fail_first:
        (claimed,) = backend.claim("pc", "w1", lease=30, limit=1, timeout=5)
        error = json.dumps({"type": "RuntimeError", "message": "flaky", "args": ["flaky"]}).encode()
        assert backend.fail(claimed.id, claimed.token, error, retry_at=time.time() - 1)
    (claimed,) = backend.claim("pc", "w1", lease=30, limit=1, timeout=5)
    assert claimed.id == job_id
    assert backend.complete(claimed.id, claimed.token, b"1")


@pytest.fixture
def queue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    backend = open_queue_backend(url, home=tmp_path)
    try:
        _job(backend, "abcdef0001")
        _job(backend, "abcdef0002", fail_first=True)
        _job(backend, "fedcba0001", finish=False)
    finally:
        backend.close()
    return url


def test_jobs_show_takes_a_unique_prefix_and_names_an_ambiguous_ones_candidates(cli: CLI, queue: str) -> None:
    code, out, err = cli("jobs", "show", "fedcba", "--url", queue)
    assert code == 0, err
    assert "job fedcba0001: queued" in out
    code, _, err = cli("jobs", "show", "abcdef", "--url", queue)
    assert code == 1
    assert "2 jobs have an id beginning 'abcdef': abcdef0001, abcdef0002" in err
    code, _, err = cli("jobs", "show", "fedcb", "--url", queue)  # under 6 characters: exact only
    assert code == 1
    assert "no job 'fedcb'" in err
    code, _, _ = cli("jobs", "--url", queue, "cancel", "fedcba00")  # cancel takes one too
    assert code == 0
    code, out, _ = cli("jobs", "show", "fedcba0001", "--url", queue, "--json")
    assert json.loads(out)["status"] == "cancelled"


def test_the_attempts_column_counts_the_run_that_succeeded(cli: CLI, queue: str) -> None:
    _, out, _ = cli("jobs", "list", "--url", queue, "--json")
    made = {row["id"]: (row["attempts_made"], row["attempts"]) for row in json.loads(out)}
    assert made == {"abcdef0001": (1, 0), "abcdef0002": (2, 1), "fedcba0001": (0, 0)}
    _, out, _ = cli("jobs", "list", "--url", queue)
    rows = {
        line.split("│")[1].strip(): line.split("│")[6].strip() for line in out.splitlines() if "│ " in line
    }
    assert rows == {"abcdef0001": "1", "abcdef0002": "2", "fedcba0001": "0"}
    _, out, _ = cli("jobs", "show", "abcdef0002", "--url", queue)
    assert "attempts    2 (1 failed)" in out


# -- a read-only command never creates a store --------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "kind", "file"),
    [
        (["workflows", "list"], "journal", "journal.db"),
        (["streams", "lag"], "stream", "stream.db"),
        (["streams", "list"], "stream", "stream.db"),
        (["jobs", "list"], "queue", "queue.db"),
        (["jobs", "stats"], "queue", "queue.db"),
        (["jobs", "show", "abcdef0001"], "queue", "queue.db"),
    ],
)
def test_a_read_only_command_says_there_is_no_store_instead_of_creating_one(
    cli: CLI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], kind: str, file: str
) -> None:
    for name in ("FOUNDRY_HOME", "FOUNDRY_QUEUE", "FOUNDRY_STREAM", "FOUNDRY_JOURNAL"):
        monkeypatch.delenv(name, raising=False)
    project = tmp_path / "fresh"
    project.mkdir()
    (project / "pyproject.toml").write_text('[project]\nname = "fresh"\n')
    monkeypatch.chdir(project)
    code, _, err = cli(*argv)
    assert code == 1
    assert f"no {kind} store at {project / '.foundry' / file}" in err
    assert f"{kind} sqlite:///{project / '.foundry' / file}" in err  # and which store it read
    assert list(project.iterdir()) == [project / "pyproject.toml"]  # nothing left behind
    code, _, err = cli(
        *argv[:1], "--journal" if kind == "journal" else "--url", "sqlite:///typo.db", *argv[1:]
    )
    assert code == 1
    assert f"no {kind} store at {project / 'typo.db'}" in err
    assert list(project.iterdir()) == [project / "pyproject.toml"]
