from __future__ import annotations

from pathlib import Path

import pytest

from foundry import Foundry
from foundry.config import load_settings
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
