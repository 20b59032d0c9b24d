"""``foundry streams list|lag|replay|dead`` on the embedded log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from foundry import Foundry
from foundry.cli import main


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/stream.db"
    app = Foundry("cli", home=tmp_path, stream=url)
    s = app.stream("calls", key="k", partitions=2, retention="1d")

    @s.consumer(group="billing", max_deliveries=1)
    def bill(event: object) -> None:
        if getattr(event, "id", "") == "poison":
            raise ValueError("no such account")

    s.publish_many([{"k": f"k{i % 3}", "n": i} for i in range(9)], ids=[f"e{i}" for i in range(9)])
    s.publish({"k": "k1"}, id="poison")
    s.drain(timeout=30)
    app.close()
    return url


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["streams", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_list_lag_replay_dead(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "list", "--url", url, "--json")
    assert code == 0
    [row] = json.loads(out)
    assert (row["stream"], row["partitions"], row["events"], row["groups"]) == ("calls", 2, 10, ["billing"])
    assert row["retention"]["max_age"] == 86400

    code, out, _ = run(capsys, "lag", "calls", "--url", url, "--json")
    assert code == 0
    assert sum(r["lag"] for r in json.loads(out)) == 0

    code, out, _ = run(capsys, "replay", "calls", "billing", "--offset", "1", "--url", url, "--json")
    assert code == 0
    assert sum(r["lag"] for r in json.loads(out)) == 10

    code, out, _ = run(capsys, "replay", "calls", "billing", "--time", "1h", "--partition", "0", "--url", url)
    assert code == 0
    assert "partition 0" in out

    code, out, _ = run(capsys, "dead", "calls", "--url", url, "--json")
    assert code == 0
    [dead] = json.loads(out)
    assert dead["id"] == "poison"
    assert "ValueError: no such account" in dead["reason"]
    assert dead["error"]["type"] == "builtins.ValueError"

    code, out, _ = run(capsys, "dead", "calls", "--url", url, "--payload")
    assert code == 0
    assert "poison" in out
    code, out, _ = run(capsys, "lag", "--url", url)
    assert "billing" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["lag", "nope"], "no stream named 'nope'"),
        (["replay", "calls", "biling", "--beginning"], "no consumer group 'biling'"),
        (["replay", "calls", "billing", "--time", "someday"], "is not a time"),
        (["dead", "calls", "--group", "x"], None),
    ],
)
def test_bad_input_is_one_clear_line(
    url: str, capsys: pytest.CaptureFixture[str], argv: list[str], message: str | None
) -> None:
    code, out, err = run(capsys, *argv, "--url", url)
    if message is None:
        assert code == 0
        assert "no dead letters" in out
    else:
        assert code != 0
        assert message in err
        assert "Traceback" not in err


def test_bad_url(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "list", "--url", "kafka://x:9092")
    assert code == 1
    assert "scheme 'kafka'" in err
