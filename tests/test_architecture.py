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


@pytest.mark.parametrize("package", ["execute", "deliver", "backends"])
def test_runtimes_receive_a_context_not_the_app(package: str) -> None:
    """A runtime gets a ``UnitSpec`` and a ``RuntimeContext``. Where a user hands one the
    app itself (``Worker(app)``, ``assert_replays(app)``), the parameter is typed by a
    Protocol that names the little it reads (``AppLike``), never ``Any`` or ``Foundry``."""
    out = []
    for path in _layer(package):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                shown = "" if arg.annotation is None else ast.unparse(arg.annotation)
                if arg.arg == "app" and shown not in ("str", "AppLike"):
                    out.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name}(app: {shown or '?'})")
    fix = "runtimes that receive the app untyped; give them ctx or an AppLike:\n  "
    assert not out, fix + "\n  ".join(out)


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


# -- backends/: engines are siblings ------------------------------------------------------
#
# Every family (queue, stream, journal, pool, cluster) has one shape: ``base.py`` (the
# Protocol and its contract checks), ``_common.py`` and other ``_`` helpers the engines
# share, and one module per engine, registered by name in the family's ``__init__``
# (``foundry.backends._registry``). The rules below say what may import what; each test
# lists every offending import, so a new engine that breaks one is told which line.

FAMILIES = ("queue", "stream", "journal", "pool", "cluster")
SQL_ENGINES = {"sqlite", "postgres"}  # the engines a family's ``_sql`` helper serves
# foundry's leaf modules, which a backend may use (nothing above them: no runtime, no app)
LEAVES = {
    "foundry.config",
    "foundry.errors",
    "foundry.handle",
    "foundry.payload",
    "foundry.serialize",
    "foundry.tracecontext",
    "foundry.traits",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(path: Path) -> str:
    name = _module_name(path)
    return name if path.name == "__init__.py" else name.rsplit(".", 1)[0]


def _imported(
    path: Path, *, type_checking: bool = True, functions: bool = True
) -> list[tuple[str, str | None]]:
    """``(module, name or None)`` of every foundry import in ``path``; without
    ``type_checking``, not those under ``if TYPE_CHECKING:`` (a type only: nothing runs);
    without ``functions``, not those inside a function body (they run when it is called)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        typing_only = isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        body = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        if (typing_only and not type_checking) or (body and not functions):
            skipped.update(id(n) for child in ast.iter_child_nodes(node) for n in ast.walk(child))
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.extend((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.extend((node.module, alias.name) for alias in node.names)
    return [(m, n) for m, n in found if m == "foundry" or m.startswith("foundry.")]


def _engines(family: str) -> set[str]:
    """The engine modules a family registers (``{"sqlite", "redis", …}``)."""
    import importlib
    import importlib.util

    from foundry.backends._registry import Registry

    package = importlib.import_module(f"foundry.backends.{family}")
    registries = [v for v in vars(package).values() if isinstance(v, Registry)]
    assert registries, f"backends/{family}/__init__.py registers no engines (a Registry)"
    return {
        importlib.util.resolve_name(e.module, r.package).split(".")[3]
        for r in registries
        for e in r.engines().values()
    }


def _owner(family: str, module: str, engines: set[str]) -> str | None:
    """The engine a module of ``family`` belongs to (``foundry.backends.queue.amqp``,
    ``….queue._amqp_client`` and a package ``….queue.amqp.*``: ``amqp``), or ``None``
    for the family's shared modules (``base``, ``_common``, ``_sql``, ``__init__``…)."""
    parts = module.split(".")
    if len(parts) < 4:
        return None
    head = parts[3]
    for engine in engines:
        if head == engine or head.startswith(f"_{engine}_"):
            return engine
    return None


def _backend_violations() -> list[str]:
    out: list[str] = []
    for family in FAMILIES:
        engines = _engines(family)
        prefix = f"foundry.backends.{family}"
        for path in _layer(f"backends/{family}"):
            me = _module_name(path)
            mine = _owner(family, me, engines)
            who = f"engine {mine!r}" if mine else "a shared module"
            for target, _name in _imported(path):
                if target.startswith("foundry.backends."):
                    other_family = target.split(".")[2]
                    if other_family != family and not other_family.startswith("_"):
                        out.append(f"{me} -> {target}: a family never imports another family")
                        continue
                    if not target.startswith(prefix):
                        continue  # backends/_* plumbing: allowed to all
                    theirs = _owner(family, target, engines)
                    if theirs is not None and theirs != mine:
                        out.append(
                            f"{me} -> {target}: {who} imports engine {theirs!r} "
                            "(move the shared helper down into the family's _common or base)"
                        )
                    if target == f"{prefix}._sql" and mine is not None and mine not in SQL_ENGINES:
                        out.append(f"{me} -> {target}: _sql serves the SQL engines only (use _common)")
                elif target.startswith("foundry.") and target not in LEAVES and target != "foundry":
                    out.append(f"{me} -> {target}: backends use only foundry's leaf modules {sorted(LEAVES)}")
    for path in sorted((SRC / "backends").glob("_*.py")):
        me = _module_name(path)
        for target, _name in _imported(path):
            if target.split(".")[2:3] and target.split(".")[2] in FAMILIES:
                out.append(f"{me} -> {target}: backends/_* plumbing sits below the families")
    return out


def test_engines_are_siblings_that_never_import_each_other() -> None:
    """Rules, each with the fix it asks for:

    1. an engine (its module, its ``_<engine>_*`` modules) imports, from backends/, only
       its family's shared modules (``base``, ``_common``, other ``_`` helpers, the
       family's registry) and ``backends/_*``: never a sibling engine;
    2. a family's ``_sql`` helper serves its SQL engines (sqlite, postgres) only;
    3. a family never imports another family; ``backends/_*`` imports no family;
    4. a family's shared modules import no engine (that would load its driver);
    5. outside backends/, a backend imports only foundry's leaf modules (``LEAVES``).
    """
    violations = _backend_violations()
    assert not violations, "backend imports that break the rules:\n  " + "\n  ".join(violations)


def test_runtimes_reach_engines_only_through_their_family() -> None:
    """Above ``backends/``, code opens an engine by URL through its family
    (``foundry.backends.queue.open_queue_backend``) and programs against the family's
    Protocol (``base``) and contract modules; it never imports an engine module, so every
    engine can be swapped, or left uninstalled, without touching a runtime."""
    out: list[str] = []
    engines = {family: _engines(family) for family in FAMILIES}
    for path in sorted(SRC.rglob("*.py")):
        me = _module_name(path)
        if me.startswith("foundry.backends"):
            continue
        for target, _name in _imported(path):
            parts = target.split(".")
            if len(parts) >= 4 and parts[:2] == ["foundry", "backends"] and parts[2] in FAMILIES:
                engine = _owner(parts[2], target, engines[parts[2]])
                if engine is not None:
                    out.append(
                        f"{me} -> {target}: open engine {engine!r} through foundry.backends.{parts[2]}"
                    )
    assert not out, "runtimes importing an engine module:\n  " + "\n  ".join(out)


def test_every_family_has_the_same_shape() -> None:
    # __init__.py holds the registry (checked by _engines), base.py the Protocol and the
    # contract checks; _common.py is there where engines share helpers (journal's two
    # engines share _sql.py and _records.py)
    missing = [
        f"backends/{family}/{name}"
        for family in FAMILIES
        for name in ("__init__.py", "base.py")
        if not (SRC / "backends" / family / name).is_file()
    ]
    assert not missing, f"every family has __init__.py (its registry) and base.py: {missing}"
    for family in FAMILIES:
        assert _engines(family), family


def test_nothing_imports_another_packages_private_names() -> None:
    """A ``_private`` module or name belongs to the package it is in: only modules of that
    package (and its subpackages) import it. (An import under ``if TYPE_CHECKING:`` names
    a type and runs nothing: not counted.)"""
    out: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        me, package = _module_name(path), _package_of(path)
        for target, name in _imported(path, type_checking=False):
            parts = target.split(".")
            private = next(
                (i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")), None
            )
            if private is not None:
                owner = ".".join(parts[:private])
            elif name is not None and name.startswith("_") and not name.startswith("__"):
                is_package = (SRC.parent / Path(*parts) / "__init__.py").is_file()
                owner = target if is_package else target.rsplit(".", 1)[0]
            else:
                continue
            if package != owner and not package.startswith(owner + "."):
                shown = f"{target}.{name}" if private is None else target
                out.append(f"{me} -> {shown}: private to {owner}")
    assert not out, "imports of another package's private names:\n  " + "\n  ".join(out)


def _task_private_names() -> set[str]:
    from foundry.execute._task import Task

    slots = {name for name in Task.__slots__ if name.startswith("_") and not name.startswith("__")}
    methods = {name for name in vars(Task) if name.startswith("_") and not name.startswith("__")}
    return slots | methods


def _task_subclasses(trees: dict[Path, ast.Module]) -> set[str]:
    """Names of the classes that derive from ``Task``, directly or through one another."""
    bases: dict[str, set[str]] = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases.setdefault(node.name, set()).update(
                    b.attr if isinstance(b, ast.Attribute) else b.id
                    for b in node.bases
                    if isinstance(b, (ast.Name, ast.Attribute))
                )
    found = {"Task"}
    while True:
        more = {name for name, of in bases.items() if of & found} - found
        if not more:
            return found - {"Task"}
        found |= more


def test_only_the_task_module_touches_a_tasks_private_fields() -> None:
    """``Task``'s private fields (and private methods) change only through its owner API
    (``start``, ``finish``, ``requeue`` and their ``*_locked`` twins, ``state``, ``error``):
    the state machine lives in ``execute/_task.py`` alone.

    Other classes legitimately have attributes of the same names (a pool's ``self._lock``,
    a channel's ``self._state``), so an access counts when it is made on anything but a
    bare ``self`` / ``cls`` (``task._state``, ``t._settle(...)``, ``entry[0]._state``: in
    ``src/foundry`` these names on another object are a task's, and reaching into another
    object's private attribute is what this forbids anyway), or on ``self`` inside a
    subclass of ``Task``, which goes through the owner API like any executor."""
    names = _task_private_names()
    trees = {
        path: ast.parse(path.read_text(), filename=str(path))
        for path in sorted(SRC.rglob("*.py"))
        if path != SRC / "execute" / "_task.py"
    }
    subclasses = _task_subclasses(trees)
    out: list[str] = []
    for path, tree in trees.items():
        inside_task: set[int] = set()  # ids of attribute nodes in a Task subclass's body
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name in subclasses:
                inside_task.update(id(n) for n in ast.walk(node) if isinstance(n, ast.Attribute))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or node.attr not in names:
                continue
            on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if not on_self or id(node) in inside_task:
                out.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
    out.sort()
    assert not out, "Task's private fields touched outside execute/_task.py:\n  " + "\n  ".join(out)


# -- no import circles ----------------------------------------------------------------------


def _import_graph() -> dict[str, set[str]]:
    """Module -> the foundry modules it imports at module level or under ``if
    TYPE_CHECKING:``. ``from package import name`` imports ``package`` (its ``__init__``
    runs and ``name`` is read from it), and ``package.name`` too when that is a module.
    Python also runs a package's ``__init__`` before any of its submodules; that implicit
    edge is not drawn (a package's ``__init__`` importing its own submodules is the normal
    shape, and the submodule does not read the package), so no ``__init__`` is exempted."""
    modules = {_module_name(path): path for path in sorted(SRC.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for me, path in modules.items():
        edges: set[str] = set()
        for target, name in _imported(path, functions=False):
            if target in modules:
                edges.add(target)
            if name is not None and f"{target}.{name}" in modules:
                edges.add(f"{target}.{name}")
        graph[me] = edges - {me}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle through each module that is on one (``[a, b, a]``), each cycle
    once: enough to name every circle without listing every path round it."""
    found: dict[frozenset[str], list[str]] = {}
    for start in sorted(graph):
        paths: dict[str, list[str]] = {start: [start]}
        frontier = [start]
        cycle: list[str] | None = None
        while frontier and cycle is None:
            following: list[str] = []
            for module in frontier:
                for target in sorted(graph[module]):
                    if target == start:
                        cycle = [*paths[module], start]
                        break
                    if target not in paths:
                        paths[target] = [*paths[module], target]
                        following.append(target)
                if cycle is not None:
                    break
            frontier = following
        if cycle is not None:
            found.setdefault(frozenset(cycle), cycle)
    return sorted(found.values())


def test_no_import_circles() -> None:
    """No foundry module imports, directly or round a circle, a module that imports it.

    Counted: imports at module level and under ``if TYPE_CHECKING:`` (a circle of types is
    still a circle: neither side can be read, typed or moved without the other). Not
    counted: an import inside a function body, which is deliberate late binding (the app
    picks a runtime module when a unit first runs; a command imports its engine when it is
    called) and runs after both modules are loaded.

    The fix is to move the shared thing down, never to hide the import in a function: a
    small module with the types or helpers both sides use, a Protocol in the lower module
    for what it needs from the upper one (the upper one satisfies it), or a callable
    passed in instead of the module that provides it. A submodule reads its siblings by
    their own path (``import foundry.pkg.sibling as sibling``), not through the package."""
    cycles = _cycles(_import_graph())
    shown = [" -> ".join(cycle) for cycle in cycles]
    assert not shown, (
        "import circles (move what both sides need down into a module, or a Protocol, "
        "that both import):\n  " + "\n  ".join(shown)
    )
