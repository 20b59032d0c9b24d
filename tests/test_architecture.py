"""The layers of DESIGN.md §4: arrows point down. Checked on the source, not by convention."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "foundry"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return {name for name in found if name == "foundry" or name.startswith("foundry.")}


def _layer(package: str) -> list[Path]:
    return sorted((SRC / package).rglob("*.py"))


def test_decide_imports_only_traits_and_errors() -> None:
    allowed = {"foundry.traits", "foundry.errors"}
    for path in _layer("decide"):
        outside = {m for m in _imports(path) if not m.startswith("foundry.decide")} - allowed
        assert not outside, f"{path.relative_to(SRC)} imports {sorted(outside)}: decide/ must stay pure"


@pytest.mark.parametrize("package", ["execute", "deliver", "backends", "observe", "lab"])
def test_runtimes_never_import_the_app(package: str) -> None:
    forbidden = {
        "foundry.app",
        "foundry.units",
        "foundry.workflow_decl",
        "foundry.stream_decl",
        "foundry.cli",
    }
    for path in _layer(package):
        bad = _imports(path) & forbidden
        assert not bad, f"{path.relative_to(SRC)} imports {sorted(bad)}: arrows point down"


def test_backends_never_import_runtimes() -> None:
    for path in _layer("backends"):
        bad = {m for m in _imports(path) if m.startswith(("foundry.deliver", "foundry.execute"))}
        assert not bad, f"{path.relative_to(SRC)} imports {sorted(bad)}"


def test_importing_foundry_needs_no_broker_client() -> None:
    import subprocess
    import sys

    code = (
        "import sys, foundry; from foundry import Foundry; Foundry();"
        "heavy = {'aio_pika', 'redis', 'psycopg', 'nats', 'matplotlib', 'numpy'} & set(sys.modules);"
        "print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def _module_level_imports(path: Path) -> set[str]:
    """Every module imported at module level (not inside a function, nor under
    ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)

    visit(tree.body)
    return found


def test_only_the_tracing_adapter_and_the_integrations_import_opentelemetry() -> None:
    # deliver/ and backends/ ask foundry.observe.tracing for a tracer; the one module that
    # imports OpenTelemetry is imported only once tracing is on (tests/tracing checks it)
    allowed = {SRC / "observe" / "_otel.py"}
    for path in sorted(SRC.rglob("*.py")):
        if path in allowed or "integrations" in path.parts:
            continue
        bad = {m for m in _module_level_imports(path) if m.split(".")[0] == "opentelemetry"}
        assert not bad, f"{path.relative_to(SRC)} imports {sorted(bad)} at module level"


def test_nothing_imports_the_integrations() -> None:
    # foundry.integrations sit above the app (DESIGN.md §4): frameworks call Foundry, never
    # the other way round
    for path in sorted(SRC.rglob("*.py")):
        if "integrations" in path.relative_to(SRC).parts:
            continue
        bad = {m for m in _imports(path) if m.startswith("foundry.integrations")}
        assert not bad, f"{path.relative_to(SRC)} imports {sorted(bad)}: integrations sit above the app"
