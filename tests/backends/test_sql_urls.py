"""One reading of a SQL engine's URL for every family (``_sql_common.parse_sql_url``):
the queue and the journal take and refuse the same table prefixes, with one message."""

from __future__ import annotations

from pathlib import Path

import pytest

from foundry.backends.journal import open_journal
from foundry.backends.queue import open_queue_backend
from foundry.errors import ConfigError


@pytest.mark.parametrize("prefix", ["9jobs_", "my-app_", "é_", "a b", ""])
def test_the_queue_and_the_journal_refuse_the_same_prefixes(tmp_path: Path, prefix: str) -> None:
    messages = []
    for family, opener in (("queue", open_queue_backend), ("journal", open_journal)):
        with pytest.raises(
            ConfigError, match=r"must be letters, digits and _, not starting with a digit"
        ) as info:
            opener(f"sqlite:///{tmp_path / family}.db?prefix={prefix}")
        messages.append(str(info.value).split(": ", 1)[1])
        assert str(info.value).startswith(f"{family} URL ")
    assert messages[0] == messages[1]


@pytest.mark.parametrize("prefix", ["_x_", "app2_", "A"])
def test_the_queue_and_the_journal_take_the_same_prefixes(tmp_path: Path, prefix: str) -> None:
    open_queue_backend(f"sqlite:///{tmp_path / 'q.db'}?prefix={prefix}").close()
    open_journal(f"sqlite:///{tmp_path / 'j.db'}?prefix={prefix}").close()


def test_an_unknown_sqlite_option_names_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"unknown option\(s\) pol\. Fix: use only busy_timeout, poll, pool"
    ):
        open_queue_backend(f"sqlite:///{tmp_path / 'q.db'}?pol=1")
