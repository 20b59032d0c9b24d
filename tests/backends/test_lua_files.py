"""The Redis engines' Lua scripts are ``.lua`` files beside them, read with
importlib.resources (``foundry.backends._lua``), and shipped by the wheel's package-data."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import pytest

from foundry.backends._lua import lua_scripts

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "foundry"


@pytest.mark.parametrize(
    ("package", "some"),
    [
        ("foundry.backends.queue", {"enqueue", "claim", "claim_ids", "complete", "fail", "stats"}),
        ("foundry.backends.stream", {"append", "read", "commit", "dead", "locate", "trim"}),
    ],
)
def test_every_script_is_read_with_its_prelude_included(package: str, some: set[str]) -> None:
    scripts = lua_scripts(package, "redis_lua")
    assert some <= set(scripts)
    assert not any(name.startswith("_") for name in scripts)  # a prelude is included, not run
    for name, text in scripts.items():
        assert not re.search(r"^--! include", text, re.M), name  # every include was filled in
        assert text.strip(), name
    if package.endswith("queue"):  # every queue script starts from the keys; most from the prelude too
        assert all("local function J(" in text for text in scripts.values())
        # each includes no more than it calls (the per-call cost: see _keys.lua)
        keys_only = {name for name, text in scripts.items() if "local function finish(" not in text}
        assert keys_only == {"enqueue", "heartbeat", "mark_alone", "progress", "purge", "stats"}
        leasing = {name for name, text in scripts.items() if "local function lease_job(" in text}
        assert leasing == {"claim", "claim_ids", "reap"}


def test_package_data_ships_every_lua_file() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["foundry"]
    files = sorted(p.relative_to(SRC).as_posix() for p in SRC.rglob("*.lua"))
    assert len(files) >= 20
    unshipped = [f for f in files if not any(fnmatch.fnmatch(f, g) for g in globs)]
    assert not unshipped, f"add these to [tool.setuptools.package-data] in pyproject.toml: {unshipped}"


def test_an_include_of_a_missing_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "luapkg"
    (package / "lua").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "lua" / "a.lua").write_text("--! include _gone.lua\nreturn 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"_gone\.lua"):
        lua_scripts("luapkg", "lua")
