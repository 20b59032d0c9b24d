"""The stream runtime's package: one concept a module, no import circles, and the names
users import from ``foundry.deliver.stream`` still there."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGES = ("foundry/deliver/stream", "foundry/backends/idempotency")


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    files = {_module(p): p for package in PACKAGES for p in sorted((SRC / package).glob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[name] = {m for m in found if m in files and m != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_the_stream_modules_import_in_one_direction() -> None:
    graph = _graph()
    assert "foundry.deliver.stream.unit" in graph  # the work-unit runner lives in the package
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])
    # Nothing inside the package imports the package itself (its __init__ re-exports only)
    inside = {m for m in graph if m.startswith("foundry.deliver.stream.")}
    assert not any("foundry.deliver.stream" in graph[m] for m in inside)
    assert not (SRC / "foundry/deliver/_stream_unit.py").exists()


def test_the_cycle_finder_finds_a_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_public_names_import_from_where_they_did() -> None:
    from foundry.deliver import stream

    for name in ("ConsumerOptions", "Consumers", "Idempotency", "Published", "StreamEvent", "StreamRuntime"):
        assert getattr(stream, name).__name__ == name
    assert callable(stream.make_runner)
    assert sorted(stream.__all__) == sorted(
        [
            "ConsumerOptions",
            "Consumers",
            "Idempotency",
            "Published",
            "StreamEvent",
            "StreamRuntime",
            "make_runner",
        ]
    )


def test_no_module_of_the_package_is_over_600_lines() -> None:
    for package in PACKAGES:
        for path in (SRC / package).glob("*.py"):
            assert len(path.read_text().splitlines()) <= 600, path.name
