from __future__ import annotations

from pathlib import Path

import pytest

from foundry import Foundry
from foundry.config import KNOWN_ENV, check_environment, load_settings, watchdog_setting
from foundry.errors import ConfigError, RemoteError, SubmitError
from foundry.serialize import decode_error, encode_error, get_codec


def test_default_is_embedded_sqlite_under_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("FOUNDRY_HOME", "FOUNDRY_QUEUE", "FOUNDRY_STREAM", "FOUNDRY_JOURNAL"):
        monkeypatch.delenv(var, raising=False)
    settings = load_settings(cwd=tmp_path)
    assert settings.home == tmp_path / ".foundry"
    assert settings.queue == f"sqlite:///{tmp_path / '.foundry' / 'queue.db'}"


def test_precedence_argument_env_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "foundry.toml").write_text(
        '[foundry]\nqueue = "redis://file/0"\nstream = "nats://file:4222"\n'
    )
    monkeypatch.setenv("FOUNDRY_QUEUE", "amqp://env/")
    monkeypatch.delenv("FOUNDRY_STREAM", raising=False)
    settings = load_settings(cwd=tmp_path, queue="postgresql://arg/db")
    assert settings.queue == "postgresql://arg/db"
    assert load_settings(cwd=tmp_path).queue == "amqp://env/"
    assert load_settings(cwd=tmp_path).stream == "nats://file:4222"


def test_url_typo_is_a_clear_error_at_construction() -> None:
    with pytest.raises(ConfigError, match=r"did you mean redis://"):
        Foundry(queue="reddis://localhost:6379")  # rediss:// is TLS, not a typo
    with pytest.raises(ConfigError, match=r"scheme"):
        Foundry(journal="localhost:5432")


def test_bad_toml_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "foundry.toml").write_text("[foundry\nqueue=")
    with pytest.raises(ConfigError, match=r"foundry.toml"):
        load_settings(cwd=tmp_path)


def test_json_codec_round_trips_and_refuses_live_objects() -> None:
    codec = get_codec("json")
    assert codec.decode(codec.encode({"args": [1, "a", None], "kwargs": {"x": 1.5}})) == {
        "args": [1, "a", None],
        "kwargs": {"x": 1.5},
    }
    with pytest.raises(SubmitError, match=r"transcode.*JSON-compatible.*Fix"):
        codec.encode({"fh": object()}, unit="transcode")
    with pytest.raises(SubmitError):
        codec.encode(float("nan"), unit="transcode")


def test_pickle_is_opt_in_and_still_checks() -> None:
    codec = get_codec("pickle")
    assert codec.decode(codec.encode({1, 2})) == {1, 2}
    with pytest.raises(SubmitError, match=r"cannot be pickled"):
        codec.encode(lambda: 1, unit="u")
    with pytest.raises(SubmitError):
        get_codec("yaml")


def test_errors_round_trip_by_type_or_as_remote_error() -> None:
    try:
        raise KeyError("row 7")
    except KeyError as exc:
        record = encode_error(exc)
    rebuilt = decode_error(record)
    assert isinstance(rebuilt, KeyError)
    assert rebuilt.args == ("row 7",)
    assert any("remote traceback" in note for note in getattr(rebuilt, "__notes__", []))
    unknown = decode_error({"type": "nowhere.Missing", "message": "gone", "traceback": "tb"})
    assert isinstance(unknown, RemoteError)
    assert unknown.type_name == "nowhere.Missing"


# -- an unknown setting, wherever it is written, names the closest known one ----------------------


@pytest.mark.parametrize(
    ("variable", "meant"),
    [
        ("FOUNDRY_QUEUES", "FOUNDRY_QUEUE"),
        ("FOUNDRY_JOURNEL", "FOUNDRY_JOURNAL"),
        ("FOUNDRY_QUEUE_URL", "FOUNDRY_QUEUE"),
        ("FOUNDRY_WATCHDOG_MS", "FOUNDRY_WATCHDOG"),
        ("FOUNDRY_DASHBOARD_TOKN", "FOUNDRY_DASHBOARD_TOKEN"),
    ],
)
def test_a_misspelt_environment_variable_names_the_one_meant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, meant: str
) -> None:
    monkeypatch.setenv(variable, "sqlite:///q.db")
    with pytest.raises(ConfigError) as info:
        load_settings(cwd=tmp_path)
    assert variable in str(info.value)
    assert f"did you mean {meant}?" in str(info.value)
    with pytest.raises(ConfigError, match=variable):
        watchdog_setting(cwd=tmp_path)


@pytest.mark.parametrize("variable", ["FOUNDRY_PROFILE", "FOUNDRY_ETH_RPC_URL", "FOUNDRY_TEST_REDIS"])
def test_another_programs_foundry_variables_are_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    # Forge (the Ethereum toolchain also called Foundry) and test suites share the prefix.
    monkeypatch.setenv(variable, "default")
    assert load_settings(cwd=tmp_path).home == tmp_path / ".foundry"


def _code_strings(path: Path) -> list[str]:
    """The string constants of a module's code (docstrings left out: they quote examples)."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_every_foundry_variable_the_source_reads_is_known() -> None:
    import re

    import foundry

    source = Path(foundry.__file__).parent
    named = {
        name
        for path in source.rglob("*.py")
        for text in _code_strings(path)
        for name in re.findall(r"\bFOUNDRY_[A-Z][A-Z_]*[A-Z]\b", text)
    }
    assert named, "the scan found nothing: the pattern is wrong"
    assert named <= set(KNOWN_ENV), f"add to foundry.config.KNOWN_ENV: {sorted(named - set(KNOWN_ENV))}"
    check_environment(dict.fromkeys(KNOWN_ENV, "x"))  # and none of them is refused


@pytest.mark.parametrize(
    ("keyword", "meant"),
    [("queues", "queue"), ("journel", "journal"), ("Home", "home"), ("watch_dog", "watchdog")],
)
def test_an_unknown_keyword_of_foundry_names_the_closest(keyword: str, meant: str) -> None:
    with pytest.raises(ConfigError) as info:
        Foundry(**{keyword: "memory://"})  # type: ignore[arg-type]
    assert repr(keyword) in str(info.value)
    assert f"did you mean {meant!r}?" in str(info.value)
    assert "the arguments are name, home, queue" in str(info.value)


def test_tool_foundry_in_pyproject_configures_and_its_typos_are_named(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "p"\n\n[tool.foundry]\nqueue = "redis://127.0.0.1:6379/0"\n'
    )
    assert load_settings(cwd=tmp_path).queue == "redis://127.0.0.1:6379/0"
    (tmp_path / "pyproject.toml").write_text('[tool.foundry]\nqueues = "redis://127.0.0.1:6379/0"\n')
    with pytest.raises(
        ConfigError, match=r"pyproject.toml: \[tool.foundry\] has the key 'queues'.*did you mean 'queue'"
    ):
        load_settings(cwd=tmp_path)
