"""Where state lives is decided once, and every process of a project agrees.

``home`` is the argument (``Foundry(home=...)``), else ``FOUNDRY_HOME``, else ``home =``
of the nearest ``foundry.toml`` / ``[tool.foundry]``, else ``.foundry`` next to the
nearest ``foundry.toml`` or ``pyproject.toml``, else ``./.foundry``. A submitter and a
worker started from different directories of one project therefore share one store —
the embedded SQLite queue and the RabbitMQ engine's default state store alike — and
every command that reads state says which store and home it used.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from foundry import Foundry
from foundry.backends.queue import open_queue_backend
from foundry.cli import main as cli
from foundry.config import load_settings, resolve_home, watchdog_setting
from foundry.errors import ConfigError
from tests.services import require

APP = """
from foundry import Foundry

app = Foundry("home-app")


@app.work(durable=True)
def add(a: int, b: int) -> int:
    return a + b
"""


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """No FOUNDRY_* variable: where state lives is found from the directories alone."""
    for name in (
        "FOUNDRY_HOME",
        "FOUNDRY_QUEUE",
        "FOUNDRY_STREAM",
        "FOUNDRY_JOURNAL",
        "FOUNDRY_POOL",
        "FOUNDRY_WATCHDOG",
    ):
        monkeypatch.delenv(name, raising=False)
    return {k: v for k, v in os.environ.items() if not k.startswith("FOUNDRY_")}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project: pyproject.toml (no [tool.foundry]) and an app module at its root."""
    root = tmp_path / "proj"
    (root / "src" / "deep").mkdir(parents=True)
    (root / "scripts").mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "home-test"\nversion = "0"\n')
    (root / "home_app.py").write_text(APP)
    return root


def _python(code: str, cwd: Path, env: dict[str, str], timeout: float = 90) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(params=["sqlite", "rabbitmq"])
def queue_env(
    request: pytest.FixtureRequest, clean_env: dict[str, str], project: Path
) -> Iterator[dict[str, str]]:
    """The environment of the three processes: nothing (the embedded SQLite queue), or a
    RabbitMQ URL without ``state=`` (its state store is a file in the home)."""
    if request.param == "sqlite":
        yield clean_env
        return
    broker = require("rabbitmq")
    url = f"{broker}?prefix=fqhome{uuid.uuid4().hex[:8]}"
    yield {**clean_env, "FOUNDRY_QUEUE": url}
    backend = open_queue_backend(url, home=project / ".foundry")
    backend.destroy()  # type: ignore[attr-defined]
    backend.close()


def test_a_submitter_and_a_worker_in_different_directories_share_one_store(
    project: Path, queue_env: dict[str, str]
) -> None:
    # Given a job submitted from the project's root
    job_id = _python(
        """
        import home_app
        print(home_app.add.submit(2, 3).id)
        home_app.app.close()
        """,
        project,
        queue_env,
    ).strip()
    # When a worker runs from a subdirectory, and a reader from another one
    worker = subprocess.run(
        [sys.executable, "-m", "foundry.cli", "worker", "../../home_app.py", "--burst", "--grace", "1s"],
        cwd=project / "src" / "deep",
        env=queue_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert worker.returncode == 0, worker.stderr
    result = _python(
        f"""
        import runpy
        app = runpy.run_path("../home_app.py")["app"]
        print(app.job({job_id!r}).result(timeout=30))
        app.close()
        """,
        project / "scripts",
        queue_env,
    )
    # Then the worker ran it, all three used <project>/.foundry, and said so
    assert result.strip() == "5"
    assert "succeeded 1" in worker.stdout, worker.stdout
    assert f"home {project / '.foundry'}, from the project at {project / 'pyproject.toml'}" in worker.stdout
    assert not (project / "src" / "deep" / ".foundry").exists()
    assert not (project / "scripts" / ".foundry").exists()
    assert (project / ".foundry").is_dir()


def test_the_rabbitmq_default_state_store_lives_in_the_apps_home(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    broker = require("rabbitmq")
    prefix = f"fqhome{uuid.uuid4().hex[:8]}"
    home = tmp_path / "explicit-home"
    app = Foundry("amqp-home", queue=f"{broker}?prefix={prefix}", home=home)
    unit = app.work(durable=True)(_echo)
    try:
        unit.submit(1)
        assert (home / f"queue-amqp-{prefix}.db").is_file()
        assert not (Path.cwd() / ".foundry" / f"queue-amqp-{prefix}.db").exists()
    finally:
        backend = open_queue_backend(f"{broker}?prefix={prefix}", home=home)
        backend.destroy()  # type: ignore[attr-defined]
        backend.close()
        app.close()


def _echo(x: int) -> int:
    return x


# -- the rules, one by one -------------------------------------------------------------------


def test_home_precedence(tmp_path: Path, clean_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "p"
    deep = root / "a" / "b"
    deep.mkdir(parents=True)
    bare = tmp_path / "bare"
    bare.mkdir()
    # Outside any project: ./.foundry
    assert load_settings(cwd=bare).home == bare / ".foundry"
    assert "working directory" in load_settings(cwd=bare).source
    # The nearest pyproject.toml marks the project's root
    (root / "pyproject.toml").write_text('[project]\nname = "p"\n')
    assert load_settings(cwd=deep).home == root / ".foundry"
    # A foundry.toml's home= is relative to the file
    (root / "foundry.toml").write_text('[foundry]\nhome = "var/state"\n')
    settings = load_settings(cwd=deep)
    assert settings.home == root / "var" / "state"
    assert settings.queue == f"sqlite:///{root / 'var' / 'state' / 'queue.db'}"
    assert str(root / "foundry.toml") in settings.source
    # FOUNDRY_HOME beats the file (relative to the working directory), the argument beats all
    monkeypatch.setenv("FOUNDRY_HOME", "rel")
    assert load_settings(cwd=deep).home == deep / "rel"
    assert load_settings(tmp_path / "given", cwd=deep).home == tmp_path / "given"
    assert resolve_home(cwd=deep) == deep / "rel"


def test_the_config_file_may_be_pyproject_and_its_relative_sqlite_paths_are_its_own(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    root = tmp_path / "p"
    sub = root / "x"
    sub.mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        '[project]\nname = "p"\n\n[tool.foundry]\nqueue = "sqlite:///data/q.db"\njournal = "memory://"\n'
    )
    settings = load_settings(cwd=sub)
    assert settings.queue == f"sqlite:///{root / 'data' / 'q.db'}"
    assert settings.journal == "memory://"
    assert settings.home == root / ".foundry"
    (root / "foundry.toml").write_text('[foundry]\nqueue = "sqlite:///q.db"\n')
    with pytest.raises(ConfigError, match="configures Foundry twice"):
        load_settings(cwd=sub)


def test_the_watchdog_setting_comes_from_the_same_project_file(
    tmp_path: Path, clean_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``watchdog`` is a key of the nearest ``foundry.toml`` / ``[tool.foundry]``, found
    from any directory of the project, with or without an app (``foundry.loop()``)."""
    root = tmp_path / "p"
    deep = root / "a" / "b"
    deep.mkdir(parents=True)
    pyproject = root / "pyproject.toml"
    pyproject.write_text('[project]\nname = "p"\n\n[tool.foundry]\nwatchdog = false\n')
    assert load_settings(cwd=deep).watchdog is None
    assert watchdog_setting(cwd=deep) is None
    pyproject.write_text('[project]\nname = "p"\n\n[tool.foundry]\nwatchdog = "50ms"\n')
    assert load_settings(cwd=deep).watchdog == pytest.approx(0.05)
    assert watchdog_setting(cwd=deep) == pytest.approx(0.05)
    # The environment beats the file, the argument beats both
    monkeypatch.setenv("FOUNDRY_WATCHDOG", "off")
    assert load_settings(cwd=deep).watchdog is None
    assert watchdog_setting(cwd=deep) is None
    assert load_settings(cwd=deep, watchdog="200ms").watchdog == pytest.approx(0.2)
    monkeypatch.delenv("FOUNDRY_WATCHDOG")
    # A bad value names the file and the fix; a typo names the key
    pyproject.write_text('[project]\nname = "p"\n\n[tool.foundry]\nwatchdog = "sometimes"\n')
    with pytest.raises(ConfigError, match="watchdog = false") as info:
        load_settings(cwd=deep)
    assert str(pyproject) in str(info.value)
    (deep / "foundry.toml").write_text("[foundry]\nwatchdg = false\n")
    with pytest.raises(ConfigError, match="did you mean 'watchdog'"):
        watchdog_setting(cwd=deep)


@pytest.mark.parametrize(
    ("file", "text", "closest"),
    [
        ("foundry.toml", '[foundry]\nquene = "redis://h/0"\n', "queue"),
        ("foundry.toml", '[foundry]\njournl = "sqlite:///j.db"\n', "journal"),
        ("foundry.toml", '[foundry]\nHOME = "s"\n', "home"),
        ("pyproject.toml", '[tool.foundry]\nstrem = "nats://h"\n', "stream"),
    ],
)
def test_an_unknown_key_names_the_closest_known_one(
    tmp_path: Path, clean_env: dict[str, str], file: str, text: str, closest: str
) -> None:
    (tmp_path / file).write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(cwd=tmp_path)
    assert f"did you mean {closest!r}" in str(info.value)
    assert file in str(info.value)


def test_a_key_far_from_every_known_one_lists_them(
    tmp_path: Path, clean_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "foundry.toml").write_text("[foundry]\nbroker_pool_size = 3\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"the keys are home, queue, stream, journal"):
        Foundry("x", home=None).settings  # noqa: B018  # resolving the settings is the point


def test_every_state_command_says_where_state_lives(
    project: Path,
    clean_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(project / "src" / "deep")
    commands = {
        ("jobs", "list"): "queue.db",
        ("jobs", "stats"): "queue.db",
        ("workflows", "list"): "journal.db",
        ("streams", "list"): "stream.db",
    }
    for argv, file in commands.items():
        # Nothing has run in the project yet: each says where it looked, and that nothing is there
        assert cli(list(argv)) == 1, argv
        err = capsys.readouterr().err
        assert f"home {project / '.foundry'}, from the project at {project / 'pyproject.toml'}" in err, (
            argv,
            err,
        )
        assert f"store at {project / '.foundry' / file}: nothing has been written there yet" in err, err
    assert not (project / ".foundry").exists()  # a command that reads state creates none
    assert not (project / "src" / "deep" / ".foundry").exists()
    # Once an app has written there, they read it (from the subdirectory still)
    app = Foundry("home-cli", home=project / ".foundry")
    app.work(durable=True)(_echo).submit(1)
    app.close()
    assert cli(["jobs", "list"]) == 0
    assert f"home {project / '.foundry'}, from the project" in capsys.readouterr().err
